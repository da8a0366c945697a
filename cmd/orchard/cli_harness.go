package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/orchard/orchard/harness"
)

// harnessStore is the store of the state directory dir, with its
// package managers' output to out.
func harnessStore(stateDir, lock, npmCache string, pipSources []string) (*harness.Store, error) {
	dir, err := filepath.Abs(filepath.Join(stateDir, "harnesses"))
	if err != nil {
		return nil, err
	}
	s := &harness.Store{Dir: dir, LockFile: lock, NPMCache: npmCache, Out: os.Stderr}
	for _, kv := range pipSources {
		name, src, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("--pip-source %q: want NAME=DIR", kv)
		}
		if s.PipSource == nil {
			s.PipSource = map[string]string{}
		}
		s.PipSource[name] = src
	}
	return s, nil
}

// harnessCmd is `orchard harness install|list|rm`: the harness store of
// the state directory, which sandboxes mount read-only.
func harnessCmd(getenv func(string) string) *cobra.Command {
	var stateDir, lock, npmCache string
	var pipSources []string
	cmd := &cobra.Command{
		Use:   "harness",
		Short: "Coding-agent harnesses (" + strings.Join(harness.Names(), ", ") + ") for sandboxes' PATH",
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&stateDir, "state-dir", defaultStateDir(getenv), "state directory of the server (env ORCHARD_STATE_DIR)")
	pf.StringVar(&lock, "lock", "", "lock file pinning versions (default STATE_DIR/harnesses/harnesses.lock)")
	store := func(cmd *cobra.Command) (*harness.Store, error) {
		if !cmd.Flags().Changed("state-dir") {
			if d := getenv("ORCHARD_STATE_DIR"); d != "" {
				stateDir = d
			}
		}
		return harnessStore(stateDir, lock, npmCache, pipSources)
	}
	install := &cobra.Command{
		Use:   "install NAME...",
		Short: "Install harnesses (npm: codex, claude, opencode, pi; pip: hermes) at the lock file's versions",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := store(cmd)
			if err != nil {
				return err
			}
			if len(args) == 1 && args[0] == harness.All {
				args = harness.Names()
			}
			if err := s.Install(cmd.Context(), args); err != nil {
				return err
			}
			return printHarnesses(cmd, s)
		},
	}
	install.Flags().StringVar(&npmCache, "npm-cache", "", "npm's cache folder (default: npm's own)")
	install.Flags().StringArrayVar(&pipSources, "pip-source", nil, "NAME=DIR: install pip harness NAME from a source folder, without an index")
	list := &cobra.Command{
		Use:   "list",
		Short: "List installed harnesses: name, version, size, install time",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := store(cmd)
			if err != nil {
				return err
			}
			return printHarnesses(cmd, s)
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove harnesses (sandboxes that have them keep them until they end)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := store(cmd)
			if err != nil {
				return err
			}
			return s.Remove(args)
		},
	}
	cmd.AddCommand(install, list, rm)
	return cmd
}

func printHarnesses(cmd *cobra.Command, s *harness.Store) error {
	hs, err := s.List()
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tVERSION\tSIZE\tINSTALLED")
	for _, h := range hs {
		fmt.Fprintf(tw, "%s\t%s\t%.0f MiB\t%s\n", h.Name, h.Version, float64(h.Bytes)/(1<<20), h.InstalledAt.Format("2006-01-02 15:04:05Z"))
	}
	if total, err := s.Bytes(); err == nil && len(hs) > 0 {
		fmt.Fprintf(tw, "(store, runtimes included)\t\t%.0f MiB\t\n", float64(total)/(1<<20))
	}
	return tw.Flush()
}
