package testenv

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// redisReadyTimeout bounds how long a freshly started redis-server may take
// to accept connections; it starts in milliseconds, so this only absorbs a
// loaded CI machine.
const redisReadyTimeout = 10 * time.Second

// RedisServer is a real redis-server owned by one test: no persistence,
// loopback only, killed when the test ends. Stop and Start take it down and
// bring it back on the same port, for outage tests.
type RedisServer struct {
	t    testing.TB
	bin  string
	dir  string
	port int

	mu     sync.Mutex  // guards proc and exited
	proc   *os.Process // nil while stopped
	exited chan error  // receives the exit of proc
}

// RequireRedis starts a redis-server for t and returns its address
// (127.0.0.1:port). It skips the test when redis-server is not installed,
// or fails it when redis is required (see RequireEnv).
func RequireRedis(t testing.TB) (addr string) {
	t.Helper()
	return StartRedis(t).Addr()
}

// StartRedis is RequireRedis returning the server handle.
func StartRedis(t testing.TB) *RedisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	Require(t, "redis", err == nil, "redis-server not in PATH (apt-get install redis-server)")
	r := &RedisServer{t: t, bin: bin, dir: t.TempDir()}
	t.Cleanup(r.Stop)
	// A free port can be taken by someone else between our probe and the
	// server's bind; try a few.
	var last error
	for range 5 {
		if r.port, err = freePort(); err != nil {
			t.Fatalf("redis: free port: %v", err)
		}
		if last = r.start(); last == nil {
			return r
		}
	}
	t.Fatalf("redis: start redis-server: %v", last)
	return nil
}

// Addr is host:port.
func (r *RedisServer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// URL is the redis:// URL of the server.
func (r *RedisServer) URL() string { return "redis://" + r.Addr() + "/0" }

// Stop kills the server (SIGKILL, as a crash would) and waits for it to
// exit. Stopping a stopped server does nothing. Its data is lost: the
// server keeps none on disk.
func (r *RedisServer) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil {
		return
	}
	_ = r.proc.Kill() // also ends a paused server
	<-r.exited
	r.proc, r.exited = nil, nil
}

// Pause freezes the server (SIGSTOP): connections stay open and nothing
// answers, as with a hung server or a silent network partition.
func (r *RedisServer) Pause() { r.signal(syscall.SIGSTOP) }

// Resume lets a paused server carry on (SIGCONT).
func (r *RedisServer) Resume() { r.signal(syscall.SIGCONT) }

func (r *RedisServer) signal(sig os.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		_ = r.proc.Signal(sig)
	}
}

// Start brings a stopped server back on the same port.
func (r *RedisServer) Start() {
	r.t.Helper()
	if err := r.start(); err != nil {
		r.t.Fatalf("redis: restart on port %d: %v", r.port, err)
	}
}

func (r *RedisServer) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		return nil
	}
	cmd := exec.Command(r.bin,
		"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir,
		"--daemonize", "no", "--logfile", "", "--loglevel", "warning")
	log, err := os.Create(fmt.Sprintf("%s/redis-%d.log", r.dir, time.Now().UnixNano()))
	if err != nil {
		return err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	// The server dies with the test process even when that is killed
	// before its cleanups run. The signal comes when the thread that
	// started the child ends, so that thread stays locked to the goroutine
	// that waits for the child.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started, exited := make(chan error, 1), make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		exited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return err
	}
	deadline := time.Now().Add(redisReadyTimeout)
	for {
		if pingRedis(r.Addr()) {
			r.proc, r.exited = cmd.Process, exited
			return nil
		}
		select {
		case err := <-exited:
			b, _ := os.ReadFile(log.Name())
			return fmt.Errorf("redis-server exited (%v): %s", err, b)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("redis-server not ready after %v", redisReadyTimeout)
		}
	}
}

// pingRedis reports whether a server at addr answers PING.
func pingRedis(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && line == "+PONG\r\n"
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
