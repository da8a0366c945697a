package browser

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// smallShm reports a /dev/shm too small for Chromium's shared memory.
// 512 MiB: a default container's 64 MB fills up on heavy pages and crashes
// the renderer, while a host's (half the RAM) never does.
func smallShm() bool {
	var st syscall.Statfs_t
	if err := syscall.Statfs("/dev/shm", &st); err != nil {
		return true
	}
	return uint64(st.Blocks)*uint64(st.Bsize) < 512<<20
}

// processTree lists the browser's processes: every process whose command
// line names the session's profile directory (Chromium passes it to all
// its children), plus the browser itself.
func (s *Session) processTree() []int {
	flag := []byte("--user-data-dir=" + s.dataDir + "\x00")
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if bytes.Contains(append(cmd, 0), flag) || pid == s.pid {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killLeftovers kills the processes that still use the profile directory.
// Children can outlive a killed browser and fork as it dies, so it looks
// again until a few passes in a row find nothing.
func (s *Session) killLeftovers() {
	const (
		quietPasses = 3
		pause       = 10 * time.Millisecond
		limit       = 2 * time.Second
	)
	deadline := time.Now().Add(limit)
	for quiet := 0; quiet < quietPasses && time.Now().Before(deadline); time.Sleep(pause) {
		n := 0
		for _, pid := range s.processTree() {
			if pid == os.Getpid() || !alive(pid) {
				continue
			}
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				n++
			}
		}
		if n == 0 {
			quiet++
		} else {
			quiet = 0
		}
	}
}

// alive reports a process that is not a zombie.
func alive(pid int) bool {
	st := procStat(pid)
	return st.state != "" && st.state != "Z" && st.state != "X"
}

// stat is what reaping needs from /proc/PID/stat.
type stat struct {
	comm  string
	state string
	ppid  int
	start uint64 // clock ticks after boot
}

func procStat(pid int) stat {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return stat{}
	}
	// The command name is in parentheses and may hold spaces.
	i, j := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if i < 0 || j < i {
		return stat{}
	}
	f := strings.Fields(string(b[j+1:]))
	if len(f) < 20 {
		return stat{}
	}
	ppid, _ := strconv.Atoi(f[1])
	start, _ := strconv.ParseUint(f[19], 10, 64)
	return stat{comm: string(b[i+1 : j]), state: f[0], ppid: ppid, start: start}
}

// noteBrowser records what identifies the browser's processes once they
// are dead (a zombie has no command line left): their name and that they
// started no earlier than the browser.
func (s *Session) noteBrowser() {
	if st := procStat(s.pid); st.state != "" {
		s.procName, s.procStart = st.comm, st.start
	}
}

// reap waits for the browser's processes that became our children
// (Chromium's helpers are re-parented to us when we are PID 1 or a
// subreaper), so they do not stay zombies. It only waits for processes
// that carry the browser's name and started after it: waiting for any
// child would steal exit statuses from the rest of the program.
func (s *Session) reap() {
	if s.procName == "" {
		return
	}
	self := os.Getpid()
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		pending := 0
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == s.pid {
				continue // the browser itself is chromedp's child to wait for
			}
			st := procStat(pid)
			// Chromium's crash handler runs under its own name.
			if st.ppid != self || st.comm != s.procName && st.comm != "chrome_crashpad" || st.start < s.procStart {
				continue
			}
			if st.state != "Z" {
				pending++ // killed, not yet dead
				continue
			}
			var ws syscall.WaitStatus
			syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		}
		if pending == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// keepWithParent makes the browser die with the process that started it,
// as chromedp's default command setup does.
func keepWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = new(syscall.SysProcAttr)
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
