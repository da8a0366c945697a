package local

import (
	"fmt"
	"os"
	"strings"

	"github.com/opencontainers/runc/libcontainer/exeseal"
	"golang.org/x/sys/unix"
)

// ReexecSealed re-executes the current process from a sealed in-memory
// copy of its own binary, once, unless it already runs from one.
//
// libcontainer starts every container's init from the server binary and,
// so that a container can never overwrite that binary, from a sealed copy
// of it. When the process already runs from a sealed copy, it uses
// /proc/self/exe directly; otherwise it makes a copy per create — an
// overlay mount where the layout allows, else a full copy of the binary
// (tens of MiB, the main cost of a create). Paying once at start-up makes
// every create skip it.
//
// Call it first thing in the server's main (after the Init check); it
// returns only on failure.
func ReexecSealed() error {
	if exeseal.IsSelfExeCloned() {
		return nil
	}
	self, err := os.Open("/proc/self/exe")
	if err != nil {
		return fmt.Errorf("seal binary: %w", err)
	}
	defer self.Close()
	st, err := self.Stat()
	if err != nil {
		return fmt.Errorf("seal binary: %w", err)
	}
	sealed, err := exeseal.CloneBinary(self, st.Size(), "orchard-server", os.TempDir())
	if err != nil {
		return fmt.Errorf("seal binary: %w", err)
	}
	if !exeseal.IsCloned(sealed) {
		sealed.Close()
		return fmt.Errorf("seal binary: no sealable memfd on this kernel")
	}
	// The descriptor must survive the exec: clear close-on-exec.
	if _, err := unix.FcntlInt(sealed.Fd(), unix.F_SETFD, 0); err != nil {
		return fmt.Errorf("seal binary: %w", err)
	}
	path := fmt.Sprintf("/proc/self/fd/%d", sealed.Fd())
	return fmt.Errorf("re-exec sealed binary: %w", unix.Exec(path, os.Args, os.Environ()))
}

// sealInit returns a sealed in-memory copy of the orchard-init binary at
// path, named so that initredirect.go finds it in a container's init.
// Sealed for the reason the server's own copy is (see ReexecSealed): a
// container must never be able to change what later inits run.
func sealInit(path string) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return nil, fmt.Errorf("not an executable file")
	}
	sealed, err := exeseal.CloneBinary(f, st.Size(), "orchard-init", os.TempDir())
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	// CloneBinary falls back to a sealed temporary file where memfds are
	// missing; the redirect finds only a memfd.
	if link, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", sealed.Fd())); !strings.HasPrefix(link, "/memfd:") || !exeseal.IsCloned(sealed) {
		sealed.Close()
		return nil, fmt.Errorf("seal: no sealable memfd on this kernel")
	}
	return sealed, nil
}

// sealedData returns a sealed, read-only memfd holding data: what a
// sandbox's process is handed cannot be changed for the next one.
func sealedData(name string, data []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), "memfd:"+name)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, fmt.Errorf("memfd %s: %w", name, err)
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		f.Close()
		return nil, fmt.Errorf("memfd %s: seal: %w", name, err)
	}
	return f, nil
}
