package main

import (
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
)

func cpCmd(conn *connection) *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file to or from a sandbox",
		Long: `Copy a file between this machine and a sandbox. One side is SANDBOX:PATH,
the other a local path or - for stdin/stdout:

  orchard cp ./main.go sb1:/workspace/main.go
  orchard cp sb1:/workspace/out.txt -
  tar c . | orchard cp - sb1:/tmp/src.tar

A remote PATH ending in / takes the local file's name; a local directory
takes the remote file's name. An uploaded file keeps its permission bits.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcID, srcPath, srcRemote := splitRemote(args[0])
			dstID, dstPath, dstRemote := splitRemote(args[1])
			c := conn.client()
			ctx := cmd.Context()
			switch {
			case srcRemote == dstRemote:
				return fmt.Errorf("cp: exactly one of SRC and DST must be SANDBOX:PATH")
			case dstRemote:
				data, mode, err := readLocal(args[0], cmd.InOrStdin())
				if err != nil {
					return err
				}
				if strings.HasSuffix(dstPath, "/") && args[0] != "-" {
					dstPath += filepath.Base(args[0])
				}
				if args[0] == "-" {
					_, err = c.Upload(ctx, dstID, dstPath, data)
				} else {
					_, err = c.UploadMode(ctx, dstID, dstPath, data, mode)
				}
				return err
			default:
				data, err := c.Download(ctx, srcID, srcPath)
				if err != nil {
					return err
				}
				return writeLocal(args[1], path.Base(srcPath), data, cmd.OutOrStdout())
			}
		},
	}
}

// splitRemote splits SANDBOX:PATH. An argument whose part before the first
// colon is empty or contains a slash is a local path (./a:b, /x/y:z).
func splitRemote(arg string) (id, p string, remote bool) {
	id, p, ok := strings.Cut(arg, ":")
	if !ok || id == "" || strings.ContainsAny(id, `/\`) || p == "" {
		return "", "", false
	}
	return id, p, true
}

// readLocal reads the local file (or stdin for -) and returns its mode.
func readLocal(name string, stdin io.Reader) ([]byte, os.FileMode, error) {
	if name == "-" {
		b, err := io.ReadAll(stdin)
		return b, 0, err
	}
	st, err := os.Stat(name)
	if err != nil {
		return nil, 0, fmt.Errorf("cp: %w", err)
	}
	if st.IsDir() {
		return nil, 0, fmt.Errorf("cp: %s is a directory (copy an archive: tar c %s | orchard cp - SANDBOX:PATH)", name, name)
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, 0, fmt.Errorf("cp: %w", err)
	}
	return b, st.Mode(), nil
}

func writeLocal(name, remoteBase string, data []byte, stdout io.Writer) error {
	if name == "-" {
		_, err := stdout.Write(data)
		return err
	}
	if st, err := os.Stat(name); err == nil && st.IsDir() {
		name = filepath.Join(name, remoteBase)
	}
	if err := os.WriteFile(name, data, 0o644); err != nil {
		return fmt.Errorf("cp: %w", err)
	}
	return nil
}
