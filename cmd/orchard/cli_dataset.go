package main

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/orchard/orchard/dataset"
	"github.com/orchard/orchard/recordings"
)

// datasetCmd is `orchard dataset`: building recordings into datasets.
func datasetCmd(conn *connection) *cobra.Command {
	cmd := &cobra.Command{Use: "dataset", Short: "Build episode recordings into datasets"}
	cmd.AddCommand(datasetBuildCmd(conn))
	return cmd
}

type datasetBuildOptions struct {
	out, recordingsDir             string
	layout, name                   string
	suite                          string
	tasks, outcomes, ids           []string
	since, until                   string
	includeEnvError                bool
	testPercent, validationPercent int
	shardMB                        int64
}

func datasetBuildCmd(conn *connection) *cobra.Command {
	var o datasetBuildOptions
	cmd := &cobra.Command{
		Use:   "build --out DIR",
		Short: "Turn recordings into a Hugging Face dataset folder or an Online-Mind2Web folder",
		Long: `Build the recordings a selection names into DIR (created; it must be empty).

--layout gui (browser and desktop episodes) or shell (shell and SWE episodes)
writes data/<split>-NNNNN-of-MMMMM.parquet shards, README.md (the dataset
card, with the YAML header datasets.load_dataset reads) and manifest.json
(what went in, what was left out and why): load it with
datasets.load_dataset("DIR"). Splits are by a hash of the task id, so no
task is in two splits. --layout mind2web writes Online-Mind2Web's
evaluation layout, a folder per task with result.json and trajectory/, for
its WebJudge scripts (--trajectories_dir DIR).

Episodes that ended env_error (the environment's fault) are left out unless
--include-env-error or --outcome env_error; unfinished episodes always are.

With --recordings the recordings are read from that folder (the server's
--recordings-dir) on this machine; otherwise the server builds the dataset
(POST /datasets) and it is unpacked into DIR.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opt, err := o.options()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			var man *dataset.Manifest
			if o.recordingsDir != "" {
				man, err = buildLocal(ctx, o.recordingsDir, o.out, opt)
			} else {
				man, err = buildRemote(ctx, conn, o.out, opt)
			}
			if err != nil {
				return err
			}
			printBuild(cmd.OutOrStdout(), o.out, man)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.out, "out", "", "folder to build into (created; must be empty)")
	f.StringVar(&o.recordingsDir, "recordings", "", "read recordings from this folder instead of asking the server")
	f.StringVar(&o.layout, "layout", dataset.LayoutGUI, "gui, shell or mind2web")
	f.StringVar(&o.name, "name", "", "the dataset's name on its card")
	f.StringVar(&o.suite, "suite", "", "only episodes of this task suite")
	f.StringSliceVar(&o.tasks, "task", nil, "only these task ids (repeatable)")
	f.StringSliceVar(&o.outcomes, "outcome", nil, "only these outcomes: success, failure, env_error (repeatable)")
	f.StringSliceVar(&o.ids, "recording", nil, "only these recording ids (repeatable)")
	f.StringVar(&o.since, "since", "", "only episodes started at or after this time (RFC 3339, or a duration ago: 24h)")
	f.StringVar(&o.until, "until", "", "only episodes started before this time (RFC 3339, or a duration ago)")
	f.BoolVar(&o.includeEnvError, "include-env-error", false, "keep episodes that ended env_error")
	f.IntVar(&o.testPercent, "test-percent", 10, "share of tasks in the test split")
	f.IntVar(&o.validationPercent, "validation-percent", 0, "share of tasks in the validation split")
	f.Int64Var(&o.shardMB, "shard-size", dataset.DefaultShardBytes>>20, "bound of a shard's row payload, in MiB")
	_ = cmd.MarkFlagRequired("out")
	return cmd
}

// options is the build the flags ask for: dataset.Options, the body of
// POST /datasets, whose layout may also be mind2web.
func (o datasetBuildOptions) options() (dataset.Options, error) {
	opt := dataset.Options{Name: o.name, Layout: o.layout, ShardBytes: o.shardMB << 20,
		Splits: dataset.Splits{TestPercent: o.testPercent, ValidationPercent: o.validationPercent},
		Selection: dataset.Selection{RecordingIDs: o.ids, Suite: o.suite, TaskIDs: o.tasks, Outcomes: o.outcomes,
			IncludeEnvError: o.includeEnvError}}
	if o.shardMB <= 0 {
		return opt, fmt.Errorf("--shard-size %d: want a positive number of MiB", o.shardMB)
	}
	var err error
	if opt.Selection.Since, err = parseWhen("since", o.since); err != nil {
		return opt, err
	}
	if opt.Selection.Until, err = parseWhen("until", o.until); err != nil {
		return opt, err
	}
	return opt, nil
}

// parseWhen reads an RFC 3339 time or a duration before now.
func parseWhen(flag, v string) (*time.Time, error) {
	if v == "" {
		return nil, nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return &t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		t := time.Now().UTC().Add(-d)
		return &t, nil
	}
	return nil, fmt.Errorf("--%s %q: want an RFC 3339 time (2026-01-02T15:04:05Z) or a duration ago (24h)", flag, v)
}

func buildLocal(ctx context.Context, recDir, out string, opt dataset.Options) (*dataset.Manifest, error) {
	if _, err := os.Stat(recDir); err != nil {
		return nil, fmt.Errorf("--recordings: %w", err)
	}
	st, err := recordings.NewStore(recDir)
	if err != nil {
		return nil, err
	}
	if opt.Layout == dataset.LayoutMind2Web {
		return dataset.ExportMind2Web(ctx, st, out, opt.Selection)
	}
	return dataset.Build(ctx, st, out, opt)
}

func buildRemote(ctx context.Context, conn *connection, out string, opt dataset.Options) (*dataset.Manifest, error) {
	if entries, err := os.ReadDir(out); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("--out %s is not empty", out)
	}
	// The tar is unpacked as it arrives: a dataset may be larger than
	// memory.
	pr, pw := io.Pipe()
	built := make(chan error, 1)
	go func() {
		err := conn.client().BuildDataset(ctx, opt, pw)
		pw.CloseWithError(err)
		built <- err
	}()
	uerr := untar(pr, out)
	pr.CloseWithError(errors.New("unpack stopped")) // ends the transfer if untar stopped early
	if err := <-built; err != nil {
		return nil, err
	}
	if uerr != nil {
		return nil, fmt.Errorf("unpack the dataset into %s: %w", out, uerr)
	}
	var man dataset.Manifest
	b, err := os.ReadFile(filepath.Join(out, "manifest.json"))
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &man); err != nil {
		return nil, fmt.Errorf("%s/manifest.json: %w", out, err)
	}
	return &man, nil
}

// untar unpacks a tar of regular files and folders into dir, refusing
// names that would land outside it.
func untar(r io.Reader, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := strings.TrimSuffix(h.Name, "/")
		if !filepath.IsLocal(filepath.FromSlash(name)) {
			return fmt.Errorf("entry %q is outside the folder", h.Name)
		}
		p := filepath.Join(dir, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
		default:
			return fmt.Errorf("entry %q: not a file or folder", h.Name)
		}
	}
}

func printBuild(w io.Writer, out string, m *dataset.Manifest) {
	fmt.Fprintf(w, "%s: %d episodes (%s layout)", out, m.Included, m.Layout)
	var left []string
	for reason, n := range m.Excluded {
		left = append(left, fmt.Sprintf("%d %s", n, reason))
	}
	sort.Strings(left)
	if len(left) > 0 {
		fmt.Fprintf(w, ", left out: %s", strings.Join(left, ", "))
	}
	fmt.Fprintln(w)
	for _, split := range []string{dataset.SplitTrain, dataset.SplitValidation, dataset.SplitTest} {
		if si := m.SplitFiles[split]; si != nil {
			fmt.Fprintf(w, "  %-10s %d episodes, %d tasks, %d shards\n", split, si.Rows, si.Tasks, len(si.Files))
		}
	}
}
