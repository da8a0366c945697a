package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/spf13/cobra"

	"github.com/orchard/orchard/recordings"
	"github.com/orchard/orchard/sites"
	"github.com/orchard/orchard/swe"
	"github.com/orchard/orchard/tasks"
)

func demoCmd(getenv func(string) string) *cobra.Command {
	var (
		n     int
		out   string
		suite string
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the bundled tasks on an embedded server and export their replays",
		Long: `Start a server in this process (local runtime, memory store, temporary
state; needs root, and Chromium for the browser suite), run --tasks tasks
of a bundled suite with their scripts, two at a time, recording every
step, and export each episode's replay into --out: a self-contained HTML
page and a GIF. --suite is "bundled" (browser tasks over the offline
sites) or "swe" (shell tasks: fix a bug in a small repository). Prints
the summary and the paths of the replays.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if n < 1 {
				return fmt.Errorf("--tasks must be at least 1")
			}
			ctx := cmd.Context()
			stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
			emb, err := startEmbedded(ctx, getenv, stderr)
			if err != nil {
				return err
			}
			defer emb.stop(stderr)
			var ts []tasks.Task
			switch suite {
			case sites.SuiteName:
				ts, err = sites.Suite()
			case swe.SuiteName:
				ts, err = swe.Suite()
			default:
				err = fmt.Errorf("--suite %q: want %s or %s", suite, sites.SuiteName, swe.SuiteName)
			}
			if err != nil {
				return err
			}
			o := runOptions{policy: "scripted", concurrency: 2, taskIDs: spread(ts, n), record: true, attempts: 1, requeueTask: 2, requeue: n}
			s, err := runSummary(ctx, emb.client, suite, o, stderr)
			if s == nil {
				return err
			}
			if werr := s.WriteTable(stdout); werr != nil && err == nil {
				err = werr
			}
			if err != nil {
				return err
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "\nReplays in %s:\n", out)
			for _, t := range s.Tasks {
				if t.RecordingID == "" {
					continue
				}
				for _, format := range []string{recordings.FormatHTML, recordings.FormatGIF} {
					data, err := emb.client.ExportRecording(ctx, t.RecordingID, format)
					if err != nil {
						return fmt.Errorf("export %s as %s: %w", t.TaskID, format, err)
					}
					path := filepath.Join(out, fileName(t.TaskID)+"."+format)
					if err := os.WriteFile(path, data, 0o644); err != nil {
						return err
					}
					fmt.Fprintf(stdout, "  %s\n", path)
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&n, "tasks", 6, "how many bundled tasks to run")
	f.StringVar(&out, "out", "orchard-demo", "directory for the replays")
	f.StringVar(&suite, "suite", sites.SuiteName, "the bundled suite to run: bundled (browser) or swe (shell)")
	return cmd
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// fileName makes a task id safe as a file name.
func fileName(id string) string { return unsafeName.ReplaceAllString(id, "_") }

// spread picks n task ids evenly over the suite, so a short demo shows each
// of the sites rather than the first one's tasks only.
func spread(ts []tasks.Task, n int) []string {
	n = min(n, len(ts))
	ids := make([]string, n)
	for i := range n {
		ids[i] = ts[i*len(ts)/n].ID
	}
	return ids
}
