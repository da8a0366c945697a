package main

import (
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/orchard/orchard/runtime/local"
)

// cleanupCmd is `orchard cleanup`: every sandbox the local runtime started
// on this host, whatever state directory it came from, and the removal
// of the orphans, which no server can reach any more (their server's
// state directory was wiped). It works on the host, not through a server.
func cleanupCmd() *cobra.Command {
	var yes, dryRun, asJSON bool
	var parent string
	var minAge time.Duration
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "List this host's sandboxes with their age and origin; remove the orphaned ones with --yes",
		Long: `List every sandbox Orchard's local runtime started on this host, found by
its cgroup and its agent whatever state directory it came from, with its
age, origin (the state directory of the server that made it) and status.

A sandbox is an orphan when no server can reach it any more: its server's
state directory was removed, or no longer records it. Sandboxes of a live
server (one holding its state directory open), and sandboxes whose state
directory still records them (a server started there re-attaches them),
are kept. Nothing is removed without --yes. Needs root.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if yes && cmd.Flags().Changed("dry-run") && dryRun {
				return fmt.Errorf("--dry-run and --yes: choose one")
			}
			if os.Geteuid() != 0 {
				return fmt.Errorf("cleanup reads every process's files and removes cgroups: run it as root")
			}
			all, err := local.HostSandboxes(parent, minAge)
			if err != nil {
				return fmt.Errorf("find sandboxes: %w", err)
			}
			out := cmd.OutOrStdout()
			type row struct {
				local.HostSandbox
				AgeSeconds float64 `json:"age_seconds"`
				Removed    bool    `json:"removed,omitempty"`
				Error      string  `json:"error,omitempty"`
			}
			rows := make([]row, len(all))
			orphans := 0
			var failed error
			for i, s := range all {
				rows[i] = row{HostSandbox: s, AgeSeconds: time.Since(s.Started).Seconds()}
				if !s.Orphaned() {
					continue
				}
				orphans++
				if !yes {
					continue
				}
				if err := local.RemoveHostSandbox(cmd.Context(), parent, s); err != nil {
					rows[i].Error = err.Error()
					failed = fmt.Errorf("remove %s: %w", s.ID, err)
					continue
				}
				rows[i].Removed = true
			}
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rows); err != nil {
					return err
				}
				return failed
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SANDBOX\tAGE\tORIGIN\tSTATUS")
			for _, r := range rows {
				origin := r.StateDir
				if origin == "" {
					origin = "-"
				}
				status := "kept: " + r.Owner
				switch {
				case r.Removed:
					status = "removed: " + r.Orphan
				case r.Error != "":
					status = "orphan, not removed: " + r.Error
				case r.Orphaned():
					status = "orphan: " + r.Orphan
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.ID, time.Duration(r.AgeSeconds*float64(time.Second)).Round(time.Second), origin, status)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if orphans > 0 && !yes {
				fmt.Fprintf(out, "%d orphaned; nothing removed (dry run): run with --yes to remove them\n", orphans)
			}
			return failed
		},
	}
	f := cmd.Flags()
	f.BoolVar(&yes, "yes", false, "remove the orphaned sandboxes (default: only list them)")
	f.BoolVar(&dryRun, "dry-run", true, "only list (the default; --yes acts)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.StringVar(&parent, "cgroup-parent", local.DefaultCgroupParent, "cgroup the local runtime makes sandboxes under")
	f.DurationVar(&minAge, "min-age", time.Minute, "keep sandboxes younger than this: they may be being created")
	return cmd
}
