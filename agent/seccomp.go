package agent

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxSeccompInsns is the kernel's limit on a classic BPF program
// (BPF_MAXINSNS).
const maxSeccompInsns = 4096

// installSeccomp reads a seccomp BPF program (struct sock_filter array, as
// the server compiled it for every sandbox) from the inherited descriptor
// fd, closes it and installs the program with flags on every thread of
// this process, so that everything the agent runs is filtered. It runs
// before the agent does anything else; on error the agent must exit,
// never serve.
func installSeccomp(fd int, flags uint) error {
	f := os.NewFile(uintptr(fd), "seccomp-filter")
	if f == nil {
		return fmt.Errorf("seccomp filter: bad descriptor %d", fd)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("seccomp filter: %w", err)
	}
	n := st.Size() / int64(unsafe.Sizeof(unix.SockFilter{}))
	if n == 0 || n > maxSeccompInsns || st.Size()%int64(unsafe.Sizeof(unix.SockFilter{})) != 0 {
		return fmt.Errorf("seccomp filter: %d bytes is not a BPF program", st.Size())
	}
	prog := make([]unix.SockFilter, n)
	buf := unsafe.Slice((*byte)(unsafe.Pointer(&prog[0])), st.Size())
	// ReadAt: every sandbox shares the descriptor's file offset.
	if _, err := f.ReadAt(buf, 0); err != nil {
		return fmt.Errorf("seccomp filter: %w", err)
	}
	// Set by the container's init already; without it an unprivileged
	// process may not install a filter.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("seccomp filter: no_new_privs: %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(n), Filter: &prog[0]}
	// TSYNC: the Go runtime has started threads already; all must be
	// filtered. A positive result is the id of a thread that could not be.
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, uintptr(flags)|unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	if errno != 0 {
		return fmt.Errorf("seccomp filter: install: %w", errno)
	}
	if r != 0 {
		return errors.New("seccomp filter: install: a thread could not be synchronised")
	}
	return nil
}
