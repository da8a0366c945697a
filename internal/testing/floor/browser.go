package floor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// floorPage is what each bare browser shows: one button whose click
// changes the page, as the benchmarks' pages do. Its title tells, from
// outside, that a renderer has loaded it.
const floorPage = "data:text/html,<title>floor</title><button onclick='this.textContent=Date.now()'>press</button>"

// BrowserPSS starts n copies of the browser at exe at once, each with
// nothing but its own profile, no sandbox of its own (it runs as root) and
// a page with one button, waits until each has loaded the page and then
// for settle, and returns their mean PSS (the sum of Pss over each one's
// process tree). It is the least memory this browser build takes per
// copy on this machine, with nothing of Orchard's: the pages of its
// binary are shared among the n copies as among n sandboxes.
func BrowserPSS(ctx context.Context, exe string, n int, settle time.Duration) (kb int64, err error) {
	type running struct {
		cmd *exec.Cmd
		dir string
	}
	all := make([]running, 0, n)
	defer func() {
		for _, r := range all {
			_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
			_ = r.cmd.Wait()
			os.RemoveAll(r.dir)
		}
	}()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		dir, err := os.MkdirTemp("", "orchard-floor-browser-")
		if err != nil {
			return 0, err
		}
		cmd, stderr, err := bareBrowser(ctx, exe, dir)
		if err != nil {
			os.RemoveAll(dir)
			return 0, err
		}
		if err := cmd.Start(); err != nil {
			os.RemoveAll(dir)
			return 0, fmt.Errorf("start %s: %w", exe, err)
		}
		all = append(all, running{cmd, dir})
		wg.Go(func() { errs[i] = waitLoaded(ctx, stderr) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(settle):
	}
	var total int64
	for _, r := range all {
		v, err := TreePSS(r.cmd.Process.Pid)
		if err != nil {
			return 0, err
		}
		total += v
	}
	return total / int64(n), nil
}

// BrowserStart starts one bare copy of the browser at exe as BrowserPSS
// does and returns the time until a renderer has loaded its page: the least a
// browser sandbox's cold ready time can be on this machine.
func BrowserStart(ctx context.Context, exe string) (time.Duration, error) {
	dir, err := os.MkdirTemp("", "orchard-floor-browser-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	cmd, stderr, err := bareBrowser(ctx, exe, dir)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s: %w", exe, err)
	}
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	}()
	if err := waitLoaded(ctx, stderr); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// bareBrowser is the command of one bare copy of the browser at exe, with
// its profile in dir, in a process group of its own, and its stderr.
func bareBrowser(ctx context.Context, exe, dir string) (*exec.Cmd, io.Reader, error) {
	cmd := exec.CommandContext(ctx, exe, "--headless", "--no-sandbox", "--user-data-dir="+dir,
		"--remote-debugging-port=0", floorPage)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	return cmd, stderr, err
}

// waitLoaded reads the browser's DevTools address from its stderr and
// polls its target list until the page has loaded (shows its title).
func waitLoaded(ctx context.Context, stderr io.Reader) error {
	sc := bufio.NewScanner(stderr)
	var addr string
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "DevTools listening on ws://"); ok {
			addr, _, _ = strings.Cut(rest, "/")
			break
		}
	}
	if addr == "" {
		return errors.New("the browser exited before it listened for DevTools")
	}
	go func() { // keep draining, or the browser blocks on a full pipe
		for sc.Scan() {
		}
	}()
	for {
		var targets []struct {
			Type, Title string
		}
		if resp, err := http.Get("http://" + addr + "/json/list"); err == nil {
			_ = json.NewDecoder(resp.Body).Decode(&targets)
			resp.Body.Close()
		}
		for _, t := range targets {
			if t.Type == "page" && t.Title == "floor" {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TreePSS sums Pss (kB) over pid and every process below it.
func TreePSS(pid int) (int64, error) {
	children := map[int][]int{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		// The command name in parentheses may hold spaces: fields start after it.
		s := string(stat)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 2 {
			continue
		}
		pp, _ := strconv.Atoi(f[1])
		children[pp] = append(children[pp], p)
	}
	var kb int64
	for todo := []int{pid}; len(todo) > 0; {
		p := todo[len(todo)-1]
		todo = append(todo[:len(todo)-1], children[p]...)
		v, err := PSS(p)
		if err != nil {
			if p == pid {
				return 0, err
			}
			continue
		}
		kb += v
	}
	return kb, nil
}

// PSS is one process's Pss in kB, from its smaps_rollup.
func PSS(pid int) (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "Pss:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no Pss in /proc/%d/smaps_rollup", pid)
}
