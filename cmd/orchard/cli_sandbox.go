package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/client"
	"github.com/orchard/orchard/faults"
)

// cleanupTimeout bounds the delete of a sandbox that never became ready:
// the server answers deletes at once and tears down in the background.
const cleanupTimeout = 10 * time.Second

func sandboxCmd(conn *connection) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sandbox",
		Short: "Create, list, inspect and delete sandboxes",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(sandboxCreateCmd(conn), sandboxListCmd(conn), sandboxGetCmd(conn), sandboxRmCmd(conn))
	return cmd
}

func sandboxCreateCmd(conn *connection) *cobra.Command {
	var (
		req              api.CreateSandboxRequest
		id, cpu, memory  string
		labels, env      []string
		harnesses        []string
		network, wait    bool
		asJSON           bool
		readyTimeout     int
		ttlSeconds       int
		blockNetworkFlag = true
	)
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a sandbox and print its id",
		Long: `Create a sandbox and print its id. Without --wait the sandbox may still be
starting when the command returns; with --wait the command returns once it
is ready (a sandbox that fails to start is deleted).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if req.Labels, err = parseKV("label", labels); err != nil {
				return err
			}
			if req.Env, err = parseKV("env", env); err != nil {
				return err
			}
			if network {
				blockNetworkFlag = false
			}
			req.BlockNetwork = &blockNetworkFlag
			// The id is drawn here when not given, as the server would draw
			// it: a create interrupted before its answer arrived can then
			// still be deleted.
			generated := id == ""
			if generated {
				id = uuid.NewString()[:8]
			}
			req.SandboxID = &id
			if cpu != "" {
				req.CPU = &cpu
			}
			if memory != "" {
				req.Memory = &memory
			}
			if readyTimeout > 0 {
				req.Timeout = &readyTimeout
			}
			if ttlSeconds > 0 {
				req.TTLSeconds = &ttlSeconds
			}
			if cmd.Flags().Changed("harness") {
				req.Harnesses = append(api.HarnessList{}, harnesses...)
			}
			c := conn.client()
			ctx := cmd.Context()
			created, err := c.CreateSandbox(ctx, req)
			for tries := 1; generated && tries < 3 && faults.Is(err, faults.CodeSandboxExists); tries++ {
				id = uuid.NewString()[:8] // taken: draw another
				created, err = c.CreateSandbox(ctx, req)
			}
			if err != nil {
				if ctx.Err() != nil {
					forgetCreate(ctx, c, id)
				}
				return err
			}
			if !wait {
				if asJSON {
					return printJSON(cmd.OutOrStdout(), created)
				}
				fmt.Fprintln(cmd.OutOrStdout(), created.SandboxID)
				return nil
			}
			sb, err := waitReady(ctx, c, created.SandboxID, api.Seconds(created.Timeout))
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), sb)
			}
			fmt.Fprintln(cmd.OutOrStdout(), sb.SandboxID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Image, "image", "host", "image reference (\"host\": the host's root, read-only)")
	f.StringVar(&id, "id", "", "sandbox id (default: generated)")
	f.StringVar(&cpu, "cpu", "", "CPU limit, e.g. 2 or 500m (default: the server's)")
	f.StringVar(&memory, "memory", "", "memory limit, e.g. 4Gi (default: the server's)")
	f.StringVar(&req.Kind, "kind", "", "shell (default), browser or desktop")
	f.StringArrayVar(&labels, "label", nil, "label KEY=VALUE (repeatable)")
	f.StringArrayVar(&env, "env", nil, "environment KEY=VALUE for every command (repeatable)")
	f.BoolVar(&network, "network", false, "allow network access (blocked by default)")
	f.IntVar(&readyTimeout, "ready-timeout", 0, "seconds the sandbox may take to start (default: the server's, 3600)")
	f.IntVar(&ttlSeconds, "ttl", 0, "idle lifetime in seconds (default: the server's)")
	f.BoolVar(&wait, "wait", false, "wait until the sandbox is ready")
	f.BoolVar(&asJSON, "json", false, "print the sandbox as JSON")
	f.StringSliceVar(&harnesses, "harness", nil, "coding-agent harnesses on PATH: codex, claude, opencode, pi, hermes or all (repeatable or comma-separated; default: the server's)")
	return cmd
}

// forgetCreate deletes the sandbox of a create interrupted before its
// answer came: the server may have made it, or may be about to. A delete
// that finds none is tried again for a moment, in case the create is still
// on its way.
func forgetCreate(ctx context.Context, c *client.Client, id string) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	for range 10 {
		err := c.DeleteSandbox(dctx, id)
		if !faults.Is(err, faults.CodeSandboxNotFound) {
			return
		}
		select {
		case <-dctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitReady waits for the sandbox to be ready. One that fails or does not
// start in time is deleted, as Orchard Env's SDK does; so is one whose wait
// was interrupted, whose id the caller never learns.
func waitReady(ctx context.Context, c *client.Client, id string, timeout time.Duration) (api.Sandbox, error) {
	sb, err := c.WaitSandbox(ctx, id, timeout)
	if err == nil && sb.Status != api.StatusReady && !sb.Ready {
		msg := sb.StatusMessage
		if msg == "" {
			msg = sb.Status
		}
		err = faults.Newf(faults.CodeCreateFailed, faults.ActionFailed, faults.Sandbox, "sandbox %s did not start: %s", id, msg)
	}
	if err != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		_ = c.DeleteSandbox(dctx, id)
		cancel()
	}
	return sb, err
}

func sandboxListCmd(conn *connection) *cobra.Command {
	var (
		labels       []string
		kind, status string
		asJSON       bool
	)
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List sandboxes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lm, err := parseKV("label", labels)
			if err != nil {
				return err
			}
			list, err := conn.client().ListSandboxes(cmd.Context(), client.ListOptions{Labels: lm, Kind: kind, Status: status})
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []api.Sandbox{}
				}
				return printJSON(cmd.OutOrStdout(), list)
			}
			return printSandboxTable(cmd.OutOrStdout(), list, time.Now())
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&labels, "label", nil, "only sandboxes with label KEY=VALUE (repeatable; all must match)")
	f.StringVar(&kind, "kind", "", "only sandboxes of this kind")
	f.StringVar(&status, "status", "", "only sandboxes with this status")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printSandboxTable(w io.Writer, list []api.Sandbox, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tIMAGE\tAGE")
	for _, sb := range list {
		created := time.Unix(0, int64(sb.CreatedAt*float64(time.Second)))
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", sb.SandboxID, sb.Status, sb.Image, age(now.Sub(created)))
	}
	return tw.Flush()
}

// age is a duration the way people read ages: its largest unit only.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}

func sandboxGetCmd(conn *connection) *cobra.Command {
	return &cobra.Command{
		Use:   "get SANDBOX",
		Short: "Print a sandbox as JSON",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := conn.client().GetSandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), sb)
		},
	}
}

func sandboxRmCmd(conn *connection) *cobra.Command {
	return &cobra.Command{
		Use:     "rm SANDBOX...",
		Aliases: []string{"delete"},
		Short:   "Delete sandboxes",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := conn.client()
			failed := false
			for _, id := range args {
				if err := c.DeleteSandbox(cmd.Context(), id); err != nil {
					printError(cmd.ErrOrStderr(), "delete "+id+": "+err.Error(), faults.Of(err).Code)
					failed = true
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), id)
			}
			if failed {
				return exitError{1}
			}
			return nil
		},
	}
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
