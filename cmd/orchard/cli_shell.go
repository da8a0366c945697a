package main

import (
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/orchard/orchard/client"
)

func shellCmd(conn *connection) *cobra.Command {
	var (
		cwd   string
		env   []string
		login bool
	)
	cmd := &cobra.Command{
		Use:   "shell [flags] SANDBOX [-- COMMAND [ARG...]]",
		Short: "Open an interactive terminal in a sandbox",
		Long: `Open an interactive terminal in a sandbox: a login shell (bash -l) unless a
COMMAND is given, which runs as an argv without a shell. When stdin is a
terminal it is put in raw mode and window size changes follow. Exits with
the remote exit code (128+N when signal N killed it).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, argv := args[0], args[1:]
			if len(argv) > 0 && argv[0] == "--" {
				argv = argv[1:]
			}
			envMap, err := parseKV("env", env)
			if err != nil {
				return err
			}
			opts := client.PTYOptions{Cmd: argv, Env: envMap, Cwd: cwd, LoginShell: login}
			in, out := cmd.InOrStdin(), cmd.OutOrStdout()
			tty := terminalFD(in)
			if tty >= 0 {
				if cols, rows, err := term.GetSize(tty); err == nil {
					opts.Rows, opts.Cols = rows, cols
				}
			}
			ctx := cmd.Context()
			sess, err := conn.client().PTY(ctx, id, opts)
			if err != nil {
				return err
			}
			defer sess.Close()
			if tty >= 0 {
				state, err := term.MakeRaw(tty)
				if err != nil {
					return err
				}
				defer term.Restore(tty, state)
				winch := make(chan os.Signal, 1)
				signal.Notify(winch, syscall.SIGWINCH)
				defer signal.Stop(winch)
				go followWindowSize(tty, winch, sess)
			}
			// The read of stdin cannot be interrupted; the goroutine ends
			// at EOF or with the process.
			go forwardInput(in, sess, tty >= 0)
			for chunk := range sess.Output() {
				if _, err := out.Write(chunk); err != nil {
					return err
				}
			}
			code, err := sess.Wait()
			if err != nil {
				return err
			}
			if st := exitStatus(code); st != 0 {
				return exitError{st}
			}
			return nil
		},
	}
	cmd.Flags().SetInterspersed(false)
	f := cmd.Flags()
	f.StringVar(&cwd, "cwd", "", "working directory (default /workspace)")
	f.StringArrayVar(&env, "env", nil, "environment KEY=VALUE (repeatable)")
	f.BoolVar(&login, "login", false, "run COMMAND inside a login shell")
	return cmd
}

// terminalFD is r's file descriptor when r is a terminal, else -1.
func terminalFD(r io.Reader) int {
	f, ok := r.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return -1
	}
	return int(f.Fd())
}

// followWindowSize sends the terminal's size to the session whenever the
// window changes, until the session ends.
func followWindowSize(tty int, winch <-chan os.Signal, sess *client.PTYSession) {
	for {
		select {
		case <-sess.Done():
			return
		case <-winch:
			if cols, rows, err := term.GetSize(tty); err == nil {
				_ = sess.Resize(rows, cols)
			}
		}
	}
}

// forwardInput copies stdin to the session. Input that is not a terminal
// ends with an end-of-file keystroke (^D, twice after a partial line), so
// that `echo hi | orchard shell sb -- cat` ends as it would locally.
func forwardInput(in io.Reader, sess *client.PTYSession, tty bool) {
	var last byte
	buf := make([]byte, 32<<10)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			if _, werr := sess.Write(buf[:n]); werr != nil {
				return
			}
			last = buf[n-1]
		}
		if err != nil {
			if err == io.EOF && !tty {
				eof := []byte{4}
				if last != 0 && last != '\n' {
					eof = []byte{4, 4}
				}
				_, _ = sess.Write(eof)
			}
			return
		}
	}
}
