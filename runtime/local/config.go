package local

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/opencontainers/cgroups"
	devices "github.com/opencontainers/cgroups/devices/config"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/specconv"
	"golang.org/x/sys/unix"

	// Lets the cgroup managers apply device rules.
	_ "github.com/opencontainers/cgroups/devices"

	"github.com/orchard/orchard/runtime"
)

// capabilities is runc's default set.
var capabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// maskedPaths and readonlyPaths are runc's defaults.
var (
	maskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
		"/proc/sched_debug", "/proc/scsi", "/sys/firmware",
		"/sys/devices/virtual/powercap",
	}
	readonlyPaths = []string{
		"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
	}
)

// agentOOMScoreAdj keeps the kernel's OOM killer off the agent: when a
// sandbox runs out of memory, the user's process should die, not the
// sandbox. Not -1000, so a leaking agent can still be killed.
const agentOOMScoreAdj = -998

// cpuPeriod is the CFS period of CPU quotas: the kernel's default, which
// new cgroups start with.
const cpuPeriod = 100000

// masks are the host folders and files hidden from "host" sandboxes: by
// the masks layer (buildMasksLayer), or where the kernel cannot stack it,
// by a tmpfs or bind mount each.
type masks struct {
	writable []string // scratch folders: empty and writable
	hidden   []string // private data: empty (and read-only, as mounts)
	// visible are folders inside hidden ones that sandboxes still see as
	// the host has them (writable in the sandbox's own layer; read-only
	// mounts without a masks layer).
	visible []string
}

// varFolders are the folders under /var that hold other programs' data:
// databases and state (/var/lib), logs and the journal (/var/log), mail,
// print and cron queues, backups (shadow.bak), caches (debconf's
// passwords). Every other directory found in /var is hidden too (varMasks).
var varFolders = []string{"/var/lib", "/var/log", "/var/spool", "/var/mail", "/var/backups", "/var/cache"}

// varVisible stays visible inside the hidden /var folders: the package
// database, so dpkg and apt answer what is installed (nothing the visible
// /usr does not tell), and the font cache, without which every program
// that draws text (Chromium, X clients) scans the fonts again at start.
var varVisible = []string{"/var/lib/dpkg", "/var/lib/apt", "/var/cache/fontconfig"}

// varMasks returns varFolders and every other directory in /var but
// /var/tmp, a scratch mask of its own (/var/www, /var/opt, /var/crash ...).
// Links are skipped: /var/run and /var/lock lead to /run, masked already.
func varMasks() []string {
	out := slices.Clone(varFolders)
	ents, _ := os.ReadDir("/var")
	for _, e := range ents {
		if p := "/var/" + e.Name(); e.IsDir() && p != "/var/tmp" && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// keyFiles are the host's secrets in folders sandboxes otherwise see.
func keyFiles() []string {
	files := []string{
		"/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-",
		"/etc/ssl/private", // TLS private keys (ssl-cert's snakeoil key, a web server's)
	}
	keys, _ := filepath.Glob("/etc/ssh/ssh_host_*key")
	return append(files, keys...)
}

// hostMasks lists what a "host" sandbox must not see of the host. /opt and
// /usr stay visible: users' tools live there.
func hostMasks(stateDir string, extra []string) masks {
	m := masks{
		writable: []string{"/tmp", "/var/tmp", "/root", "/home", "/run"},
		hidden:   []string{"/work", "/mnt", "/media", "/srv", "/var/lib/orchard"},
	}
	for _, p := range varVisible {
		// The host's folder as it is, if it has one.
		if rp, err := filepath.EvalSymlinks(p); err == nil {
			if fi, err := os.Stat(rp); err == nil && fi.IsDir() {
				m.visible = append(m.visible, rp)
			}
		}
	}
	m.hidden = append(m.hidden, varMasks()...)
	m.hidden = append(m.hidden, keyFiles()...)
	m.hidden = append(m.hidden, stateDir)
	m.hidden = append(m.hidden, extra...)
	// A path in a masked folder is already hidden, and masking it again
	// would create it inside the empty folder; one in a visible folder
	// inside a masked one is not.
	var hidden []string
	for _, p := range m.hidden {
		if !m.covered(p) && !slices.Contains(hidden, p) {
			hidden = append(hidden, p)
		}
	}
	m.hidden = hidden
	return m
}

// covered reports whether p lies inside a masked folder, and not inside a
// visible folder within that one: the innermost folder around p decides.
func (m masks) covered(p string) bool {
	best, masked := "", false
	consider := func(dirs []string, hides bool) {
		for _, d := range dirs {
			if d != p && within(p, d) && len(d) > len(best) {
				best, masked = d, hides
			}
		}
	}
	consider(m.writable, true)
	consider(m.hidden, true)
	consider(m.visible, false)
	return masked
}

// within reports whether p is dir or below it.
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// containerConfig is the libcontainer configuration of one sandbox.
func (l *Local) containerConfig(spec runtime.Spec, img *image, rootfs string) *configs.Config {
	const mountFlags = unix.MS_NOEXEC | unix.MS_NOSUID | unix.MS_NODEV
	mounts := []*configs.Mount{
		{Source: "proc", Destination: "/proc", Device: "proc", Flags: mountFlags},
		{Source: "tmpfs", Destination: "/dev", Device: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_STRICTATIME, Data: "mode=755,size=65536k"},
		{Source: "devpts", Destination: "/dev/pts", Device: "devpts", Flags: unix.MS_NOSUID | unix.MS_NOEXEC, Data: "newinstance,ptmxmode=0666,mode=0620,gid=5"},
		{Source: "shm", Destination: "/dev/shm", Device: "tmpfs", Flags: mountFlags, Data: "mode=1777,size=256m"},
		{Source: "mqueue", Destination: "/dev/mqueue", Device: "mqueue", Flags: mountFlags},
		{Source: "sysfs", Destination: "/sys", Device: "sysfs", Flags: mountFlags | unix.MS_RDONLY},
	}
	mounts = append(mounts, cgroupMounts(l.cgroups, l.cgroupPath(spec.ID))...)
	var hidden []string
	if img.host {
		var hostMounts []*configs.Mount
		if l.masks == nil {
			hostMounts, hidden = maskMounts(l.hostMasks, l.cfg.HostExpose)
		}
		for _, p := range l.cfg.HostExpose {
			hostMounts = append(hostMounts, readOnlyBind(p))
		}
		// Parents first: a bind mount lands in the tmpfs over its folder.
		slices.SortStableFunc(hostMounts, func(a, b *configs.Mount) int { return strings.Compare(a.Destination, b.Destination) })
		mounts = append(mounts, hostMounts...)
	}
	mounts = append(mounts,
		&configs.Mount{Source: l.cfg.AgentPath, Destination: agentMount, Device: "bind",
			Flags: unix.MS_BIND | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV},
	)

	var rules []*devices.Rule
	for _, d := range specconv.AllowedDevices {
		rules = append(rules, &d.Rule)
	}
	res := &cgroups.Resources{Devices: rules}
	pids := l.pidsLimit(spec)
	res.PidsLimit = &pids
	if spec.MemoryBytes > 0 {
		res.Memory = spec.MemoryBytes
		if l.swap {
			res.MemorySwap = spec.MemoryBytes
		}
	}
	if spec.CPU > 0 {
		// The period is left at the kernel's default, which cpuPeriod is:
		// each write of either walks every CPU cgroup on the host
		// (tg_set_cfs_bandwidth), so the fewer the better.
		res.CpuQuota = max(int64(spec.CPU*cpuPeriod), 1000)
	}

	var oom *int
	if l.protectAgent {
		v := agentOOMScoreAdj
		oom = &v
	}
	hostname := "sandbox-" + spec.ID
	if len(hostname) > 63 {
		hostname = hostname[:63]
	}
	sc := l.seccomp
	if l.seccompProg != nil {
		// The agent installs the precompiled program before it does
		// anything else (agentArgs).
		sc = nil
	}
	return &configs.Config{
		Rootfs:          rootfs,
		Hostname:        hostname,
		NoNewPrivileges: true,
		Seccomp:         sc,
		OomScoreAdj:     oom,
		Capabilities: &configs.Capabilities{
			Bounding:  capabilities,
			Effective: capabilities,
			Permitted: capabilities,
		},
		Namespaces: configs.Namespaces{
			{Type: configs.NEWNS}, {Type: configs.NEWPID}, {Type: configs.NEWUTS},
			{Type: configs.NEWIPC}, {Type: configs.NEWNET}, {Type: configs.NEWCGROUP},
		},
		Networks: []*configs.Network{{Type: "loopback", Address: "127.0.0.1/0", Gateway: "localhost"}},
		Cgroups: &cgroups.Cgroup{
			Path:      l.cgroupPath(spec.ID),
			Resources: res,
		},
		Devices:       specconv.AllowedDevices,
		Mounts:        mounts,
		MaskPaths:     append(slices.Clone(maskedPaths), hidden...),
		ReadonlyPaths: append(slices.Clone(readonlyPaths), cgroupFS),
		Rlimits: []configs.Rlimit{
			{Type: unix.RLIMIT_NOFILE, Hard: l.nofile, Soft: l.nofile},
		},
		Labels: []string{"orchard.sandbox=" + spec.ID, "orchard.image=" + spec.Image},
	}
}

// maskMounts are the mounts that hide m's folders without a masks layer
// (an older kernel), and the paths left to libcontainer's masking, which
// it applies after every mount: a tmpfs over each scratch folder; a tmpfs
// over each hidden folder that holds a visible or exposed path, so that
// their read-only bind mounts can land in it; a read-only bind mount of
// each visible folder. A hidden path exposed as a whole is not masked.
func maskMounts(m masks, expose []string) (mounts []*configs.Mount, masked []string) {
	for _, p := range m.writable {
		data := "mode=755"
		if p == "/tmp" || p == "/var/tmp" {
			data = "mode=1777"
		} else if p == "/root" {
			data = "mode=700"
		}
		mounts = append(mounts, &configs.Mount{Source: "tmpfs", Destination: p, Device: "tmpfs",
			Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: data})
	}
	for _, p := range m.hidden {
		holds := func(q string) bool { return q != p && within(q, p) }
		switch {
		case slices.Contains(expose, p):
		case slices.ContainsFunc(m.visible, holds) || slices.ContainsFunc(expose, holds):
			data := "mode=755"
			if fi, err := os.Stat(p); err == nil {
				st := fi.Sys().(*syscall.Stat_t)
				data = fmt.Sprintf("mode=%o,uid=%d,gid=%d", fi.Mode()&os.ModePerm, st.Uid, st.Gid)
			}
			mounts = append(mounts, &configs.Mount{Source: "tmpfs", Destination: p, Device: "tmpfs",
				Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: data})
		default:
			masked = append(masked, p)
		}
	}
	for _, p := range m.visible {
		if m.covered(p) {
			mounts = append(mounts, readOnlyBind(p))
		}
	}
	return mounts, masked
}

// readOnlyBind shows the host's p at the same path in a sandbox,
// read-only: one file system (mounts below p are not included), no
// devices, no set-uid.
func readOnlyBind(p string) *configs.Mount {
	return &configs.Mount{Source: p, Destination: p, Device: "bind",
		Flags: unix.MS_BIND | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV}
}

// cgroupPath is the sandbox's cgroup, the same in every hierarchy.
func (l *Local) cgroupPath(id string) string {
	return l.cfg.CgroupParent + "/" + id
}

// sandboxNofile is the open-file limit of sandbox processes: roomy for
// browsers and language servers, like container runtimes' defaults.
const sandboxNofile = 65536

// nofileLimit is sandboxNofile, or this process's hard limit when it is
// lower and cannot be raised (no CAP_SYS_RESOURCE).
func nofileLimit(canRaise bool) uint64 {
	var r unix.Rlimit
	if canRaise || unix.Getrlimit(unix.RLIMIT_NOFILE, &r) != nil {
		return sandboxNofile
	}
	return min(sandboxNofile, r.Max)
}

// capSysResource is the capability needed to lower oom_score_adj.
const capSysResource = 24

// canLowerOOMScore reports whether this process may lower oom_score_adj
// (CAP_SYS_RESOURCE), which protecting the agent needs.
func canLowerOOMScore() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<capSysResource) != 0
		}
	}
	return false
}

// swapAccounting reports whether memory+swap can be limited, so a memory
// limit cannot be escaped by swapping.
func swapAccounting() bool {
	if cgroups.IsCgroup2UnifiedMode() {
		b, err := os.ReadFile("/proc/swaps")
		return err == nil && strings.Count(string(b), "\n") > 1
	}
	_, err := os.Stat("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
	return err == nil
}

// pidsLimit is the sandbox's limit on processes and threads.
func (l *Local) pidsLimit(spec runtime.Spec) int64 {
	if spec.PidsLimit > 0 {
		return spec.PidsLimit
	}
	return l.cfg.DefaultPidsLimit
}
