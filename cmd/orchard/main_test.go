package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// output opens a descriptor of the kind a command's output may be, closing
// its far end when gone is true; cleanup closes what is left.
type output func(t *testing.T, gone bool) int

func pipeOutput(t *testing.T, gone bool) int {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	if gone {
		r.Close()
	}
	return int(w.Fd())
}

func socketOutput(t *testing.T, gone bool) int {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	if gone {
		unix.Close(fds[1])
	}
	return fds[0]
}

func TestOutputClosed(t *testing.T) {
	t.Parallel()
	file := func(t *testing.T, _ bool) int {
		f, err := os.Create(filepath.Join(t.TempDir(), "out"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return int(f.Fd())
	}
	for _, tc := range []struct {
		name string
		open output
		gone bool
		want bool
	}{
		{"pipe", pipeOutput, false, false},
		{"pipe without its reader", pipeOutput, true, true},
		{"socket", socketOutput, false, false},
		{"socket without its peer", socketOutput, true, true},
		{"file", file, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fd := tc.open(t, tc.gone)
			if got := outputClosed(fd); got != tc.want {
				t.Fatalf("outputClosed = %v, want %v", got, tc.want)
			}
		})
	}
}

// A SIGPIPE ends a command only when it came from the command's own
// output: a write to any other broken pipe or socket (a server's client
// that hung up) raises the same signal and must change nothing.
func TestOnClosedOutput(t *testing.T) {
	// Tells the test when a SIGPIPE has reached the process's handlers.
	seen := make(chan os.Signal, 1)
	signal.Notify(seen, syscall.SIGPIPE)
	defer signal.Stop(seen)
	brokenWrite := func(t *testing.T, fd int) {
		t.Helper()
		if _, err := unix.Write(fd, []byte("x")); !errors.Is(err, unix.EPIPE) {
			t.Fatalf("write to a closed descriptor: %v, want EPIPE", err)
		}
		select {
		case <-seen:
		case <-time.After(5 * time.Second):
			t.Fatal("no SIGPIPE")
		}
	}

	ctx, release := onClosedOutput(context.Background(), pipeOutput(t, false))
	defer release()
	brokenWrite(t, socketOutput(t, true))
	brokenWrite(t, pipeOutput(t, true))
	// The watch has had the signals; give it time to act on them.
	time.Sleep(200 * time.Millisecond)
	if err := ctx.Err(); err != nil {
		t.Fatalf("a SIGPIPE from another descriptor ended the context: %v", context.Cause(ctx))
	}

	// The output loses its reader: the next write ends the context.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, release = onClosedOutput(context.Background(), int(w.Fd()))
	defer release()
	r.Close()
	brokenWrite(t, int(w.Fd()))
	select {
	case <-ctx.Done():
		if cause := context.Cause(ctx); !errors.Is(cause, errOutputClosed) {
			t.Fatalf("cause %v, want %v", cause, errOutputClosed)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a SIGPIPE from the closed output did not end the context")
	}
}
