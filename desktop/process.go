package desktop

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// markerEnv names the variable every process of a session is started
// with. Its value, "<session>/<process>", survives in the environment of
// all their descendants, including daemons that leave the process group
// or are re-parented, so Close can find and kill every last one.
const markerEnv = "ORCHARD_DESKTOP_PROC"

// killGrace is how long Close lets processes exit on SIGTERM before
// SIGKILL: Xvfb removes its lock file and socket when it can, and the
// rest exit in milliseconds.
const killGrace = 500 * time.Millisecond

// proc is one process the session started.
type proc struct {
	name    string // "xvfb", "openbox", "xterm", ...
	marker  string // the value of markerEnv it and its descendants carry
	pid     int
	started time.Time
	gen     uint64        // for the X server: its generation
	exited  chan struct{} // closed when the process has been waited for
	err     error         // its exit status, once exited is closed
	log     string        // the file its stdout and stderr go to
}

// spawn starts path with args in a process group of its own, with the
// session's marker in env, output to a log file in dir, and extra as
// file descriptors 3 and up.
func spawn(dir, session, name, path string, args, env []string, extra []*os.File, seq int) (*proc, error) {
	p := &proc{name: name, marker: session + "/" + name + "-" + strconv.Itoa(seq), exited: make(chan struct{})}
	p.log = filepath.Join(dir, fmt.Sprintf("%s-%d.log", name, seq))
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(path, args...)
	cmd.Env = append(env[:len(env):len(env)], markerEnv+"="+p.marker)
	// Files, not pipes: with a pipe, Wait would also wait for every
	// descendant that inherited it.
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = extra
	// A group of its own so one signal reaches the process and the
	// children it keeps there; Pdeathsig so it dies with us even when we
	// are killed before Close.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the thread that forked the child exits, so
		// that thread stays locked to this goroutine until the child is
		// gone.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			runtime.UnlockOSThread()
			return
		}
		p.pid, p.started = cmd.Process.Pid, time.Now()
		started <- nil
		p.err = cmd.Wait()
		close(p.exited)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return p, nil
}

// done reports whether the process has exited.
func (p *proc) done() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// logTail returns the end of the process's output, for error messages.
func (p *proc) logTail() string {
	const tailMax = 2048
	f, err := os.Open(p.log)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > tailMax {
		_, _ = f.Seek(-tailMax, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	return strings.TrimSpace(string(b))
}

// stop ends the process and everything it started: SIGTERM to all of
// them, SIGKILL to what is left after grace; it waits for the process
// itself and adds every process it signalled to killed, for reaping.
func (p *proc) stop(grace time.Duration, killed map[int]bool) {
	if p == nil {
		return
	}
	for _, pid := range signalTree(p, syscall.SIGTERM) {
		killed[pid] = true
	}
	if grace > 0 {
		t := time.NewTimer(grace)
		select {
		case <-p.exited:
		case <-t.C:
		}
		t.Stop()
	}
	// The process may be gone while children it started live on.
	killTree(p, killed)
	<-p.exited
}

// killTree SIGKILLs the process and its descendants until none is left,
// adding every process it signalled to killed; they can fork while it
// runs, so it looks again until two passes in a row find nothing alive.
func killTree(p *proc, killed map[int]bool) {
	const (
		quietPasses = 2
		pause       = 5 * time.Millisecond
		limit       = 3 * time.Second
	)
	deadline := time.Now().Add(limit)
	for quiet := 0; quiet < quietPasses && time.Now().Before(deadline); {
		hit := signalTree(p, syscall.SIGKILL)
		for _, pid := range hit {
			killed[pid] = true
		}
		if len(hit) == 0 {
			quiet++
		} else {
			quiet = 0
		}
		time.Sleep(pause)
	}
}

// signalTree sends sig to the process, its group, and every live process
// that carries its marker or descends from it, and returns them all: the
// group signal can kill members before they are signalled one by one, and
// those are still to be reaped.
func signalTree(p *proc, sig syscall.Signal) []int {
	if p.pid == 0 {
		return nil
	}
	// Scan first: the group signal may take members out of the tree.
	tree := treeOf(p)
	if !p.done() {
		// The group covers children not yet visible in /proc.
		_ = syscall.Kill(-p.pid, sig)
	}
	hit := 0
	for _, pid := range tree {
		if syscall.Kill(pid, sig) == nil {
			hit++
		}
	}
	if hit == 0 {
		return nil
	}
	return tree
}

// treeOf lists the live (not zombie) processes that carry p's marker or
// descend from p.
func treeOf(p *proc) []int {
	procs := scanProcs()
	children := map[int][]int{}
	for _, st := range procs {
		children[st.ppid] = append(children[st.ppid], st.pid)
	}
	seen := map[int]bool{}
	var out []int
	var walk func(pid int)
	walk = func(pid int) {
		if seen[pid] {
			return
		}
		seen[pid] = true
		if st, ok := procs[pid]; ok && st.live() && pid != os.Getpid() {
			out = append(out, pid)
		}
		for _, c := range children[pid] {
			walk(c)
		}
	}
	if !p.done() {
		walk(p.pid)
	}
	for pid, st := range procs {
		if st.live() && hasMarker(pid, p.marker) {
			walk(pid)
		}
	}
	return out
}

// procStat is what process management needs from /proc/PID/stat.
type procStat struct {
	pid, ppid, pgrp int
	state           string
}

func (s procStat) live() bool { return s.state != "" && s.state != "Z" && s.state != "X" }

// scanProcs reads every process's stat.
func scanProcs() map[int]procStat {
	out := map[int]procStat{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat(pid); ok {
			out[pid] = st
		}
	}
	return out
}

func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	// The command name is in parentheses and may hold spaces.
	j := bytes.LastIndexByte(b, ')')
	if j < 0 {
		return procStat{}, false
	}
	f := strings.Fields(string(b[j+1:]))
	if len(f) < 3 {
		return procStat{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	pgrp, _ := strconv.Atoi(f[2])
	return procStat{pid: pid, ppid: ppid, pgrp: pgrp, state: f[0]}, true
}

// hasMarker reports whether pid's environment holds markerEnv for marker:
// the value itself, or, when marker names a whole session, any of its
// processes ("<session>/...").
func hasMarker(pid int, marker string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	prefix := []byte(markerEnv + "=" + marker)
	for _, kv := range bytes.Split(b, []byte{0}) {
		if rest, ok := bytes.CutPrefix(kv, prefix); ok && (len(rest) == 0 || rest[0] == '/') {
			return true
		}
	}
	return false
}

// sessionProcs lists the live processes that carry session's marker.
func sessionProcs(session string) []int {
	var out []int
	for pid, st := range scanProcs() {
		if st.live() && hasMarker(pid, session) {
			out = append(out, pid)
		}
	}
	return out
}

// reap waits for zombie children of ours among killed: descendants of
// the session's processes re-parented to this process because it is PID 1
// or a subreaper. Only those are waited for: waiting for any child would
// steal other code's exit statuses. A killed process whose parent is
// killed too may become ours only when that parent is gone, so it is
// watched until then.
func reap(killed map[int]bool) {
	self := os.Getpid()
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		pending := 0
		for pid := range killed {
			st, ok := readStat(pid)
			switch {
			case !ok:
				delete(killed, pid) // gone
			case st.live():
				pending++ // killed, not yet dead
			case st.ppid == self:
				var ws syscall.WaitStatus
				_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
			case killed[st.ppid]:
				pending++ // its dying parent reaps it, or leaves it to us
			}
		}
		if pending == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
