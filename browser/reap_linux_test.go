package browser

import (
	"fmt"
	"os"
	"syscall"
	"testing"
)

// becomeSubreaper makes the test process adopt orphaned descendants, as an
// agent running as PID 1 (or a subreaper) does, so Close's reaping shows.
func becomeSubreaper(t *testing.T) {
	const prSetChildSubreaper = 36
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		t.Logf("prctl(PR_SET_CHILD_SUBREAPER): %v", errno)
	}
}

// zombieChildren lists our children that are zombies.
func zombieChildren() []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		if st := procStat(pid); st.state == "Z" && st.ppid == os.Getpid() {
			out = append(out, pid)
		}
	}
	return out
}
