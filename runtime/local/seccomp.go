package local

import (
	"fmt"
	goruntime "runtime"

	profiles "github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/seccomp"
	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// seccompEnabled reports whether this binary can filter sandboxes'
// syscalls: libcontainer enforces seccomp only when built with cgo and the
// "seccomp" build tag (libseccomp). Without it, a container config that
// asks for a filter fails to start, so sandboxes then run without one.
const seccompEnabled = seccomp.Enabled

// SeccompEnabled reports whether this binary filters sandboxes' syscalls
// (see seccompEnabled); orchard-init must be built with the same choice.
const SeccompEnabled = seccompEnabled

// sandboxSeccomp is Docker's default seccomp profile (moby's), resolved for
// this host's architecture and kernel and for the capabilities sandboxes
// get: the profile allows some syscalls only to holders of a capability
// (chroot with CAP_SYS_CHROOT, mount and unshare with CAP_SYS_ADMIN, ...),
// so it must see the same set the container config grants. Nil when
// seccomp is not compiled in.
//
// The filter covers the native ABI only. libseccomp compiles it in every
// container's init, once per ABI listed; with the compat ABIs (x86 and x32
// on amd64) that took ≈35 ms of a ≈18 ms create, native only ≈4 ms. A
// syscall through a compat ABI then fails the architecture check and kills
// the process: sandboxes run 64-bit programs only, which also closes the
// compat syscall paths, a known source of kernel bugs, to them.
func sandboxSeccomp() (*configs.Seccomp, error) {
	if !seccompEnabled {
		return nil, nil
	}
	rs := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{
		Bounding:  capabilities,
		Effective: capabilities,
		Permitted: capabilities,
	}}}
	profile, err := profiles.GetDefaultProfile(rs)
	if err != nil {
		return nil, fmt.Errorf("seccomp profile: %w", err)
	}
	if native := nativeArch(); native != "" {
		profile.Architectures = []specs.Arch{native}
	}
	cfg, err := specconv.SetupSeccomp(profile)
	if err != nil {
		return nil, fmt.Errorf("seccomp profile: %w", err)
	}
	return cfg, nil
}

// nativeArch is the seccomp name of the architecture this binary runs on.
func nativeArch() specs.Arch {
	switch goruntime.GOARCH {
	case "amd64":
		return specs.ArchX86_64
	case "arm64":
		return specs.ArchAARCH64
	case "386":
		return specs.ArchX86
	case "ppc64le":
		return specs.ArchPPC64LE
	case "s390x":
		return specs.ArchS390X
	case "riscv64":
		return specs.ArchRISCV64
	}
	return ""
}
