package local

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"
	"unsafe"

	profiles "github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/seccomp"
	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
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

// seccompCompileEnv, set in the environment of "<exe> init", makes Init
// load a filter and wait (seccompCompileChild) instead of starting a
// container.
const seccompCompileEnv = "_ORCHARD_SECCOMP_COMPILE"

// compileSeccomp returns the BPF program that libcontainer loads for cfg,
// byte for byte: libcontainer builds it with libseccomp and patches it
// (runc's patchbpf: unknown syscalls fail with ENOSYS, not EPERM) inside
// each container's init, ≈4 ms of CPU per create for a program that is the
// same for every sandbox. Neither step is exported, so a child process
// (this binary, see seccompCompileChild) runs libcontainer's own code to
// load the filter on itself, and this process reads the loaded program
// back with ptrace (PTRACE_SECCOMP_GET_FILTER, as CRIU does). Sandboxes
// then get the program ready-made (create.go, agent.installSeccomp).
//
// The flags libcontainer loads the program with are not part of it, and
// are returned apart (seccompFlags).
func compileSeccomp(cfg *configs.Seccomp) (_ []byte, flags uint, err error) {
	if flags, err = seccompFlags(cfg); err != nil {
		return nil, 0, fmt.Errorf("compile seccomp filter: %w", err)
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		return nil, 0, fmt.Errorf("compile seccomp filter: %w", err)
	}
	// ptrace requests must come from the thread that attached.
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	cmd := exec.Command("/proc/self/exe", "init")
	cmd.Env = []string{seccompCompileEnv + "=1"}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, 0, fmt.Errorf("compile seccomp filter: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, 0, fmt.Errorf("compile seccomp filter: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, 0, fmt.Errorf("compile seccomp filter: %w", err)
	}
	defer func() {
		// The child exits when its stdin closes; kill it if it does not.
		stdin.Close()
		timer := time.AfterFunc(5*time.Second, func() { _ = cmd.Process.Kill() })
		werr := cmd.Wait()
		timer.Stop()
		if err == nil && werr != nil {
			err = fmt.Errorf("compile seccomp filter: child: %w: %s", werr, stderr.String())
		}
	}()
	if _, err := stdin.Write(append(js, '\n')); err != nil {
		return nil, 0, fmt.Errorf("compile seccomp filter: %w", err)
	}
	// The child names the thread that loaded the filter: libcontainer
	// loads it on the calling thread only, as an init's exec keeps just
	// that thread.
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	tid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "loaded ")))
	if !strings.HasPrefix(line, "loaded ") || err != nil {
		return nil, 0, fmt.Errorf("compile seccomp filter: child: %q: %s", line, stderr.String())
	}
	prog, err := readFilter(tid)
	return prog, flags, err
}

// seccompFlags are the seccomp(2) flags libcontainer loads cfg's program
// with (runc's seccomp.setFlag and patchbpf.filterFlags): a filter that
// logs, or leaves speculative store bypass unmitigated (Docker's profile
// asks for that), must stay so when precompiled. TSYNC is left out: the
// agent always sets it. Programs that notify a listener are not
// precompiled: their descriptor goes back to the runtime from the init.
func seccompFlags(cfg *configs.Seccomp) (uint, error) {
	var flags uint
	for _, f := range cfg.Flags {
		switch f {
		case specs.LinuxSeccompFlagLog:
			flags |= unix.SECCOMP_FILTER_FLAG_LOG
		case specs.LinuxSeccompFlagSpecAllow:
			flags |= unix.SECCOMP_FILTER_FLAG_SPEC_ALLOW
		case specs.LinuxSeccompFlagWaitKillableRecv:
			flags |= unix.SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV
		case "SECCOMP_FILTER_FLAG_TSYNC":
		default:
			return 0, fmt.Errorf("seccomp flag %s not known", f)
		}
	}
	for _, call := range cfg.Syscalls {
		if call.Action == configs.Notify {
			return 0, fmt.Errorf("syscall %s notifies a listener", call.Name)
		}
	}
	return flags, nil
}

// readFilter returns the newest seccomp program of thread pid (stopped for
// the purpose with ptrace, then released).
func readFilter(pid int) ([]byte, error) {
	if err := unix.PtraceSeize(pid); err != nil {
		return nil, fmt.Errorf("read seccomp filter: ptrace: %w", err)
	}
	defer unix.PtraceDetach(pid)
	if err := unix.PtraceInterrupt(pid); err != nil {
		return nil, fmt.Errorf("read seccomp filter: ptrace: %w", err)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != nil || !ws.Stopped() {
		return nil, fmt.Errorf("read seccomp filter: wait for stop: %v (status %v)", err, ws)
	}
	// Index 0 is the newest filter; a nil buffer asks for its length.
	n, _, errno := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SECCOMP_GET_FILTER, uintptr(pid), 0, 0, 0, 0)
	if errno != 0 {
		return nil, fmt.Errorf("read seccomp filter: %w", errno)
	}
	prog := make([]unix.SockFilter, n)
	if n == 0 {
		return nil, fmt.Errorf("read seccomp filter: empty program")
	}
	if _, _, errno := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SECCOMP_GET_FILTER, uintptr(pid), 0, uintptr(unsafe.Pointer(&prog[0])), 0, 0); errno != 0 {
		return nil, fmt.Errorf("read seccomp filter: %w", errno)
	}
	return bytes.Clone(unsafe.Slice((*byte)(unsafe.Pointer(&prog[0])), len(prog)*int(unsafe.Sizeof(prog[0])))), nil
}

// seccompCompileChild is compileSeccomp's child: it loads the filter read
// from stdin with libcontainer's code, says on which thread, and waits on
// that thread for stdin to close. It returns the exit code.
func seccompCompileChild() int {
	goruntime.LockOSThread()
	var cfg configs.Seccomp
	if err := json.NewDecoder(os.Stdin).Decode(&cfg); err != nil {
		fmt.Fprintln(os.Stderr, "seccomp filter:", err)
		return 1
	}
	if _, err := seccomp.InitSeccomp(&cfg); err != nil {
		fmt.Fprintln(os.Stderr, "seccomp filter:", err)
		return 1
	}
	fmt.Fprintf(os.Stdout, "loaded %d\n", unix.Gettid())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}
