package testenv

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
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
	tls  *redisTLS // nil for a plain server

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
	return startRedis(t, &RedisServer{t: t, bin: bin, dir: t.TempDir()})
}

func startRedis(t testing.TB, r *RedisServer) *RedisServer {
	t.Helper()
	t.Cleanup(r.Stop)
	var err error
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

// URL is the redis:// URL of the server, or its rediss:// URL when it was
// started by StartRedisTLS.
func (r *RedisServer) URL() string {
	if r.tls != nil {
		return "rediss://" + r.Addr() + "/0"
	}
	return "redis://" + r.Addr() + "/0"
}

// CAFile is the PEM file of the CA that issued the certificate of a server
// started by StartRedisTLS; empty for a plain server.
func (r *RedisServer) CAFile() string {
	if r.tls == nil {
		return ""
	}
	return r.tls.caFile
}

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
	args := []string{"--port", strconv.Itoa(r.port)}
	if r.tls != nil {
		args = []string{"--port", "0", "--tls-port", strconv.Itoa(r.port),
			"--tls-cert-file", r.tls.certFile, "--tls-key-file", r.tls.keyFile,
			"--tls-ca-cert-file", r.tls.caFile, "--tls-auth-clients", "no"}
	}
	cmd := exec.Command(r.bin, append(args, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir,
		"--daemonize", "no", "--logfile", "", "--loglevel", "warning")...)
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
		if pingRedis(r.Addr(), r.tls.client()) {
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

// pingRedis reports whether a server at addr answers PING, over TLS when
// tc is not nil.
func pingRedis(addr string, tc *tls.Config) bool {
	d := &net.Dialer{Timeout: time.Second}
	var c net.Conn
	var err error
	if tc != nil {
		c, err = tls.DialWithDialer(d, "tcp", addr, tc)
	} else {
		c, err = d.Dial("tcp", addr)
	}
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

// redisTLS is the certificate material of a TLS server.
type redisTLS struct {
	caFile, certFile, keyFile string
	roots                     *x509.CertPool
}

// client is the TLS configuration that trusts the server's CA, or nil for
// a plain server.
func (c *redisTLS) client() *tls.Config {
	if c == nil {
		return nil
	}
	return &tls.Config{RootCAs: c.roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

// StartRedisTLS is StartRedis for a server that accepts only TLS: its
// certificate, for 127.0.0.1, is issued by a CA made for this test alone,
// and clients need no certificate. URL is rediss://, and CAFile is the
// PEM file of that CA. It skips the test (or fails it, see Require) when
// redis-server was built without TLS.
func StartRedisTLS(t testing.TB) *RedisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	Require(t, "redis", err == nil, "redis-server not in PATH (apt-get install redis-server)")
	Require(t, "redis-tls", redisTLSSupported(bin), "redis-server was built without TLS support")
	dir := t.TempDir()
	c, err := writeRedisCerts(dir)
	if err != nil {
		t.Fatalf("redis: certificates: %v", err)
	}
	return startRedis(t, &RedisServer{t: t, bin: bin, dir: dir, tls: c})
}

// redisTLSProbe remembers, per binary, whether redis-server supports TLS.
var redisTLSProbe sync.Map // bin -> bool

// redisTLSSupported reports whether bin was built with TLS. Asked for a
// TLS port without a certificate, a TLS build refuses to start because the
// certificate is missing; any other outcome means no TLS.
func redisTLSSupported(bin string) bool {
	if v, ok := redisTLSProbe.Load(bin); ok {
		return v.(bool)
	}
	port, err := freePort()
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--port", "0", "--tls-port", strconv.Itoa(port),
		"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", os.TempDir(),
		"--daemonize", "no", "--logfile", "", "--loglevel", "warning")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, _ := cmd.CombinedOutput()
	ok := bytes.Contains(out, []byte("tls-cert-file"))
	redisTLSProbe.Store(bin, ok)
	return ok
}

// writeRedisCerts makes a CA and a server certificate for 127.0.0.1 that it
// issued (ECDSA P-256, valid for a day) and writes them and the server's
// key as PEM files into dir.
func writeRedisCerts(dir string) (*redisTLS, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "orchard test redis CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	c := &redisTLS{
		caFile:   filepath.Join(dir, "ca.pem"),
		certFile: filepath.Join(dir, "server.pem"),
		keyFile:  filepath.Join(dir, "server-key.pem"),
		roots:    x509.NewCertPool(),
	}
	c.roots.AddCert(ca)
	for _, f := range []struct {
		path, typ string
		der       []byte
	}{{c.caFile, "CERTIFICATE", caDER}, {c.certFile, "CERTIFICATE", der}, {c.keyFile, "PRIVATE KEY", keyDER}} {
		b := pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der})
		if err := os.WriteFile(f.path, b, 0o600); err != nil {
			return nil, err
		}
	}
	return c, nil
}
