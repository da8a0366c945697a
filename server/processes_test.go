package server_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/client"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// Bounds the server keeps (server/manager), mirrored here to know how long
// to wait for it to settle after a replica dies.
const (
	// lostJobSlack is how long past its timeout a running job whose replica
	// died stays running before the cleanup leader fails it: 2×waitSlack
	// plus a minute (manager.Sweep).
	lostJobSlack = 2*30*time.Second + time.Minute
	// leaderLease is how long cleanup pauses when its leader dies
	// (manager.leaderTTL).
	leaderLease = 30 * time.Second
)

// killedJobTimeout is the timeout_seconds of the jobs running on the
// replica that is killed: short, so the sweep may fail them soon.
const killedJobTimeout = 5

// replicaProc is one `orchard serve` process.
type replicaProc struct {
	name string
	url  string
	c    *client.Client
	log  string
	cmd  *exec.Cmd

	exited  chan struct{} // closed once the process has been reaped
	waitErr error         // the exit; read after exited is closed
}

// errPortTaken: the replica could not bind its port (someone took it
// between our probe and its listen).
var errPortTaken = errors.New("port taken")

// startReplicas starts one `orchard serve --store redis` per name, each on
// a free port, concurrently, and waits for their /health. Each is killed at
// cleanup unless already stopped.
func startReplicas(t *testing.T, bin, stateDir, logDir string, env []string, names ...string) []*replicaProc {
	t.Helper()
	reps := make([]*replicaProc, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				reps[i], errs[i] = launchReplica(name, bin, stateDir, logDir, env)
				if !errors.Is(errs[i], errPortTaken) {
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, r := range reps {
		if r == nil {
			continue
		}
		t.Cleanup(func() {
			r.kill()
			if t.Failed() {
				b, _ := os.ReadFile(r.log)
				t.Logf("log of replica %s (%s):\n%s", r.name, r.url, tail(string(b), 4000))
			}
		})
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("replica %s: %v", names[i], err)
		}
	}
	return reps
}

func launchReplica(name, bin, stateDir, logDir string, env []string) (*replicaProc, error) {
	return launchServe(name, bin, logDir, env, "--state-dir", stateDir, "--store", "redis")
}

// launchServe starts `orchard serve` with args on a free loopback port
// and waits for its /health.
func launchServe(name, bin, logDir string, env []string, args ...string) (*replicaProc, error) {
	port, err := freeLoopbackPort()
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	logPath := filepath.Join(logDir, fmt.Sprintf("%s-%d.log", name, port))
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, append([]string{"serve", "--addr", addr}, args...)...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	// The replica dies with the test process even when that is killed
	// before its cleanups run; the signal comes when the starting thread
	// ends, so that thread stays with the goroutine that reaps the child.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	r := &replicaProc{name: name, url: "http://" + addr, log: logPath, cmd: cmd, exited: make(chan struct{})}
	r.c = client.New(r.url, testserver.APIKey)
	started := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		r.waitErr = cmd.Wait()
		close(r.exited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if res, err := http.Get(r.url + "/health"); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return r, nil
			}
		}
		select {
		case <-r.exited:
			b, _ := os.ReadFile(logPath)
			if strings.Contains(string(b), "address already in use") {
				return nil, errPortTaken
			}
			return nil, fmt.Errorf("exited before serving (%v):\n%s", r.waitErr, b)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.kill()
			b, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("no /health within 30s:\n%s", b)
		}
	}
}

// kill SIGKILLs the replica, as a crash would, and reaps it.
func (r *replicaProc) kill() {
	select {
	case <-r.exited:
		return
	default:
	}
	_ = r.cmd.Process.Kill()
	<-r.exited
}

// terminate sends SIGTERM and waits up to timeout for the exit.
func (r *replicaProc) terminate(timeout time.Duration) error {
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("SIGTERM: %w", err)
	}
	select {
	case <-r.exited:
		if r.waitErr != nil {
			return fmt.Errorf("exit after SIGTERM: %v", r.waitErr)
		}
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("still running %v after SIGTERM", timeout)
	}
}

func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// trackedJob is a job the test created, and the token its command appends
// to /workspace/log when (and each time) it runs.
type trackedJob struct {
	id, sandbox, token, via string
	// onKilled: created on the replica that is killed while it runs or
	// waits, so it may end failed (with a classified fault) instead.
	onKilled bool
}

// ledger records every job created, so that afterwards each one can be
// matched against the sandboxes' logs.
type ledger struct {
	seq  atomic.Int64
	mu   sync.Mutex // guards jobs
	jobs []trackedJob
}

func (l *ledger) token(sandbox string) string {
	return fmt.Sprintf("tok-%s-%d", sandbox, l.seq.Add(1))
}

func (l *ledger) add(j trackedJob) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.jobs = append(l.jobs, j)
}

func (l *ledger) all() []trackedJob {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.jobs)
}

// appendToken is a command that records one run of itself.
func appendToken(prefix, token string) *api.Command {
	return client.Command(prefix + "echo " + token + " >> /workspace/log")
}

// parallel runs fn for 0..n-1 concurrently and reports each error.
func parallel(t *testing.T, what string, n int, fn func(i int) error) {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(i)
		}()
	}
	wg.Wait()
	failed := false
	for i, err := range errs {
		if err != nil {
			t.Errorf("%s [%d]: %v", what, i, err)
			failed = true
		}
	}
	if failed {
		t.FailNow()
	}
}

// workRound exercises sandbox sb through three replicas: an exec waited
// in its request, an upload read back through another replica, and an
// exec started on one replica and waited on another.
func workRound(ctx context.Context, reps []*replicaProc, i int, sb string, led *ledger) error {
	a, b, c := reps[i%3], reps[(i+1)%3], reps[(i+2)%3]
	tok := led.token(sb)
	j, err := c.c.Exec(ctx, sb, api.ExecRequest{Command: appendToken("", tok), TimeoutSeconds: client.Ptr(60), Wait: true})
	if err != nil {
		return fmt.Errorf("exec on %s: %w", c.name, err)
	}
	led.add(trackedJob{id: j.JobID, sandbox: sb, token: tok, via: c.name})
	if j.Status != api.JobSucceeded {
		return fmt.Errorf("exec on %s: %+v", c.name, j)
	}

	path := "/workspace/files/" + tok
	data := []byte(fmt.Sprintf("%s written through %s\n", tok, a.name))
	if _, err := a.c.Upload(ctx, sb, path, data); err != nil {
		return fmt.Errorf("upload on %s: %w", a.name, err)
	}
	got, err := b.c.Download(ctx, sb, path)
	if err != nil {
		return fmt.Errorf("download on %s: %w", b.name, err)
	}
	if string(got) != string(data) {
		return fmt.Errorf("download on %s: %q, uploaded %q", b.name, got, data)
	}

	tok = led.token(sb)
	id, err := b.c.ExecNoWait(ctx, sb, api.ExecRequest{Command: appendToken("", tok), TimeoutSeconds: client.Ptr(60)})
	if err != nil {
		return fmt.Errorf("exec (no wait) on %s: %w", b.name, err)
	}
	led.add(trackedJob{id: id, sandbox: sb, token: tok, via: b.name})
	jw, err := c.c.WaitJob(ctx, id, 90*time.Second)
	if err != nil {
		return fmt.Errorf("job wait on %s: %w", c.name, err)
	}
	if jw.Status != api.JobSucceeded {
		return fmt.Errorf("job %s started on %s, waited on %s: %+v", id, b.name, c.name, jw)
	}
	return nil
}

// TestThreeReplicaProcesses runs three real `orchard serve` processes on
// one Redis and one state directory, spreads work across them, SIGKILLs
// one while it runs jobs, starts a replacement, and checks that no job ran
// twice or was lost, every sandbox survived, and nothing leaked.
func TestThreeReplicaProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four server processes and waits out the lost-job bound")
	}
	testenv.RequireRoot(t)
	begin := time.Now()
	phase := begin
	mark := func(name string) {
		t.Logf("%-28s %6.1fs (total %5.1fs)", name, time.Since(phase).Seconds(), time.Since(begin).Seconds())
		phase = time.Now()
	}

	bin := testenv.OrchardBinary(t)
	agentPath := testenv.AgentBinary(t)
	rs := testenv.StartRedis(t)
	dir := testserver.StateDir(t)
	logDir := t.TempDir()
	// Whatever the outcome, no sandbox outlives the test: StateDir's
	// cleanup runs after the replicas are gone (cleanups run
	// last-registered first) and deletes what the runtime still holds.
	runtimeDir := filepath.Join(dir, "runtime")

	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"REDIS_URL=" + rs.URL(),
		"REDIS_PREFIX=procs:",
		"API_KEYS=" + testserver.APIKey,
		"ORCHARD_AGENT=" + agentPath,
		"LOG_LEVEL=WARN",
		"CLEANUP_INTERVAL_SECONDS=1",
	}
	if d := os.Getenv("TMPDIR"); d != "" {
		env = append(env, "TMPDIR="+d)
	}
	mark("build binaries, redis")

	reps := startReplicas(t, bin, dir, logDir, env, "r0", "r1", "r2")
	mark("start 3 replicas")

	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	led := &ledger{}
	const n = 12
	ids := make([]string, n)

	// Create on one replica, wait on the next, work through all three.
	parallel(t, "create", n, func(i int) error {
		cr, err := reps[i%3].c.CreateSandbox(ctx, api.CreateSandboxRequest{
			Image: "host", BlockNetwork: client.Ptr(true), Memory: client.Ptr("256Mi"), Timeout: client.Ptr(120),
			Labels: map[string]string{"test": "processes"},
		})
		if err != nil {
			return fmt.Errorf("create on %s: %w", reps[i%3].name, err)
		}
		ids[i] = cr.SandboxID
		sb, err := reps[(i+1)%3].c.WaitSandbox(ctx, cr.SandboxID, 120*time.Second)
		if err != nil {
			return fmt.Errorf("wait on %s: %w", reps[(i+1)%3].name, err)
		}
		if sb.Status != api.StatusReady || !sb.Ready {
			return fmt.Errorf("wait on %s: %+v", reps[(i+1)%3].name, sb)
		}
		return nil
	})
	mark("create+wait 12 sandboxes")
	parallel(t, "work before the kill", n, func(i int) error { return workRound(ctx, reps, i, ids[i], led) })
	mark("work round 1")

	// Load the replica about to die: on even sandboxes a job that runs
	// (sleep, then its token) and one queued behind it on the same replica;
	// on odd sandboxes a job on a surviving replica that runs across the
	// kill.
	victim, survivors := reps[0], reps[1:]
	running := make([]string, n)
	parallel(t, "jobs across the kill", n, func(i int) error {
		sb := ids[i]
		if i%2 == 1 {
			s := survivors[(i/2)%2]
			tok := led.token(sb)
			id, err := s.c.ExecNoWait(ctx, sb, api.ExecRequest{Command: appendToken("sleep 2; ", tok), TimeoutSeconds: client.Ptr(30)})
			if err != nil {
				return fmt.Errorf("exec on %s: %w", s.name, err)
			}
			led.add(trackedJob{id: id, sandbox: sb, token: tok, via: s.name})
			return nil
		}
		tok := led.token(sb)
		id, err := victim.c.ExecNoWait(ctx, sb, api.ExecRequest{Command: appendToken("sleep 3; ", tok), TimeoutSeconds: client.Ptr(killedJobTimeout)})
		if err != nil {
			return fmt.Errorf("exec on %s: %w", victim.name, err)
		}
		led.add(trackedJob{id: id, sandbox: sb, token: tok, via: victim.name, onKilled: true})
		running[i] = id
		tok = led.token(sb)
		id, err = victim.c.ExecNoWait(ctx, sb, api.ExecRequest{Command: appendToken("", tok), TimeoutSeconds: client.Ptr(killedJobTimeout)})
		if err != nil {
			return fmt.Errorf("exec on %s: %w", victim.name, err)
		}
		led.add(trackedJob{id: id, sandbox: sb, token: tok, via: victim.name, onKilled: true})
		return nil
	})
	// Once the victim's jobs run (holding their sandboxes' exec locks), a
	// surviving replica queues a job behind each: it must run once the
	// dead holder's lease lapses.
	parallel(t, "queue behind the victim", n, func(i int) error {
		if running[i] == "" {
			return nil
		}
		s := survivors[(i/2)%2]
		deadline := time.Now().Add(20 * time.Second)
		for {
			j, err := s.c.GetJob(ctx, running[i])
			if err != nil {
				return fmt.Errorf("get job on %s: %w", s.name, err)
			}
			if j.Status == api.JobRunning {
				break
			}
			if j.Terminal() || time.Now().After(deadline) {
				return fmt.Errorf("job %s on %s did not start running: %+v", running[i], victim.name, j)
			}
			time.Sleep(50 * time.Millisecond)
		}
		tok := led.token(ids[i])
		id, err := s.c.ExecNoWait(ctx, ids[i], api.ExecRequest{Command: appendToken("", tok), TimeoutSeconds: client.Ptr(60)})
		if err != nil {
			return fmt.Errorf("exec on %s: %w", s.name, err)
		}
		led.add(trackedJob{id: id, sandbox: ids[i], token: tok, via: s.name})
		return nil
	})
	time.Sleep(500 * time.Millisecond)
	victim.kill()
	killedAt := time.Now()
	if ws, ok := victim.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("replica %s: exit %v, want death by SIGKILL", victim.name, victim.waitErr)
	}
	mark("load victim, SIGKILL it")

	reps = []*replicaProc{survivors[0], survivors[1], startReplicas(t, bin, dir, logDir, env, "r3")[0]}
	mark("start replacement r3")
	parallel(t, "work after the kill", n, func(i int) error { return workRound(ctx, reps, i, ids[i], led) })
	mark("work round 2")

	// Every job ends. Those of the dead replica end once the cleanup
	// leader (possibly after taking over from the dead one) finds them
	// past their bound.
	jobs := led.all()
	final := make([]api.Job, len(jobs))
	settle := killedAt.Add(killedJobTimeout*time.Second + lostJobSlack + leaderLease + 15*time.Second)
	t.Logf("waiting for %d jobs to end (up to %.0fs from now: the lost-job bound)", len(jobs), time.Until(settle).Seconds())
	var wg sync.WaitGroup
	for k, tj := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := reps[k%3]
			for {
				left := time.Until(settle)
				j, err := r.c.WaitJob(ctx, tj.id, max(min(left, 60*time.Second), time.Second))
				if err != nil {
					t.Errorf("wait for job %s on %s: %v", tj.id, r.name, err)
					return
				}
				final[k] = j
				if j.Terminal() || time.Now().After(settle) {
					return
				}
			}
		}()
	}
	wg.Wait()
	mark("all jobs ended")

	// Every sandbox is still there, ready, on every replica, and answers.
	for _, r := range reps {
		list, err := r.c.ListSandboxes(ctx, client.ListOptions{Labels: map[string]string{"test": "processes"}})
		if err != nil {
			t.Fatalf("list on %s: %v", r.name, err)
		}
		var got []string
		for _, sb := range list {
			got = append(got, sb.SandboxID)
			if sb.Status != api.StatusReady || !sb.Ready {
				t.Errorf("list on %s: sandbox %s is %s (%s)", r.name, sb.SandboxID, sb.Status, sb.StatusMessage)
			}
		}
		sort.Strings(got)
		want := slices.Sorted(slices.Values(ids))
		if !slices.Equal(got, want) {
			t.Errorf("list on %s: %v, want %v", r.name, got, want)
		}
	}
	logs := make([]string, n)
	parallel(t, "read log", n, func(i int) error {
		a, b := reps[i%3], reps[(i+1)%3]
		j, err := a.c.Exec(ctx, ids[i], api.ExecRequest{Command: client.Command("cat /workspace/log"), TimeoutSeconds: client.Ptr(60), Wait: true})
		if err != nil {
			return fmt.Errorf("exec on %s: %w", a.name, err)
		}
		if j.Status != api.JobSucceeded {
			return fmt.Errorf("exec on %s: %+v", a.name, j)
		}
		got, err := b.c.Download(ctx, ids[i], "/workspace/log")
		if err != nil {
			return fmt.Errorf("download on %s: %w", b.name, err)
		}
		if string(got) != j.Stdout {
			return fmt.Errorf("log through exec on %s and download on %s differ:\n%s\n---\n%s", a.name, b.name, j.Stdout, got)
		}
		logs[i] = j.Stdout
		return nil
	})
	mark("list, exec and read logs")

	// Each job ran once, or ended failed with a classified fault; none
	// ran twice; nothing ran that no job asked for.
	runs := map[string]int{}
	for _, l := range logs {
		for _, line := range strings.Fields(l) {
			runs[line]++
		}
	}
	known := map[string]bool{}
	outcomes := map[string]int{}
	for k, tj := range jobs {
		known[tj.token] = true
		j, c := final[k], runs[tj.token]
		if c > 1 {
			t.Errorf("job %s (%s, on %s) ran %d times", tj.id, tj.token, tj.via, c)
		}
		switch {
		case j.Status == api.JobSucceeded:
			outcomes["succeeded"]++
			if c != 1 {
				t.Errorf("job %s (%s, on %s) succeeded but ran %d times", tj.id, tj.token, tj.via, c)
			}
		case j.Status == api.JobFailed && j.Fault != nil && j.Fault.Code != "":
			outcomes["failed "+j.Fault.Code]++
			if !tj.onKilled {
				t.Errorf("job %s (%s, on %s, no replica of it died) failed: %s: %s", tj.id, tj.token, tj.via, j.Fault.Code, j.Fault.Message)
			}
		case j.Status == api.JobFailed:
			outcomes["failed unclassified"]++
			t.Errorf("job %s (%s, on %s) failed without a classified fault: %+v", tj.id, tj.token, tj.via, j)
		default:
			outcomes[j.Status]++
			age := "never started"
			if j.StartedAt != nil {
				age = fmt.Sprintf("started %.0fs before the kill", killedAt.Sub(time.Unix(0, int64(*j.StartedAt*1e9))).Seconds())
			}
			t.Errorf("job %s (%s, on %s) lost: still %q %.0fs after its replica died (%s)",
				tj.id, tj.token, tj.via, j.Status, time.Since(killedAt).Seconds(), age)
		}
	}
	for tok, c := range runs {
		if !known[tok] {
			t.Errorf("token %q in a sandbox log (%d times) belongs to no job", tok, c)
		}
	}
	t.Logf("%d jobs: %v", len(jobs), outcomes)

	// Delete through the replicas; each sees the others' deletes.
	parallel(t, "delete", n, func(i int) error {
		if err := reps[i%3].c.DeleteSandbox(ctx, ids[i]); err != nil {
			return fmt.Errorf("delete on %s: %w", reps[i%3].name, err)
		}
		_, err := reps[(i+1)%3].c.GetSandbox(ctx, ids[i])
		if !faults.Is(err, faults.CodeSandboxNotFound) {
			return fmt.Errorf("get on %s after delete: %v, want %s", reps[(i+1)%3].name, err, faults.CodeSandboxNotFound)
		}
		return nil
	})
	mark("delete 12 sandboxes")
	parallel(t, "SIGTERM", len(reps), func(i int) error {
		start := time.Now()
		if err := reps[i].terminate(15 * time.Second); err != nil {
			return fmt.Errorf("replica %s: %w", reps[i].name, err)
		}
		t.Logf("replica %s exited 0 %.1fs after SIGTERM", reps[i].name, time.Since(start).Seconds())
		return nil
	})
	mark("SIGTERM 3 replicas")

	// Nothing left: no sandbox directories, mounts or cgroups.
	if ents, err := os.ReadDir(filepath.Join(runtimeDir, "sandboxes")); err != nil && !os.IsNotExist(err) {
		t.Errorf("read sandboxes dir: %v", err)
	} else if len(ents) > 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("sandbox directories left: %v", names)
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err != nil {
		t.Errorf("read mountinfo: %v", err)
	} else {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, dir) {
				t.Errorf("mount left: %s", line)
			}
		}
	}
	for _, id := range ids {
		for _, pat := range []string{"/sys/fs/cgroup/*/orchard/" + id, "/sys/fs/cgroup/orchard/" + id} {
			left, _ := filepath.Glob(pat)
			for _, d := range left {
				t.Errorf("cgroup left: %s", d)
			}
		}
	}
	mark("leak checks")
}
