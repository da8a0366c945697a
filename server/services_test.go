package server_test

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/orchard/orchard/internal/testing/testserver"
)

// serviceScript is the HTTP service the tests run inside a sandbox that has
// no network: /health, /echo (what arrived), /gz (a gzip body with its
// Content-Encoding) and /big (64 MiB that stop after the first MiB until
// /tmp/go exists, so a client that gets that MiB first proves the proxy
// streams rather than buffering the body).
const serviceScript = `
import http.server, gzip, json, os, sys, time
CHUNK = bytes(range(256)) * 4096
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def reply(self, code, body, ctype="text/plain", extra=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra: self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/health": return self.reply(200, b"ok")
        if self.path == "/gz": return self.reply(200, gzip.compress(b"compressed " * 1000, mtime=0), extra=[("Content-Encoding", "gzip")])
        if self.path == "/big":
            self.send_response(200)
            self.send_header("Content-Length", str(64 * len(CHUNK)))
            self.end_headers()
            self.wfile.write(CHUNK); self.wfile.flush()
            for _ in range(600):
                if os.path.exists("/tmp/go"): break
                time.sleep(0.05)
            for _ in range(63): self.wfile.write(CHUNK)
            return
        self.reply(404, b"no")
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        data = self.rfile.read(n)
        self.reply(200, json.dumps({"path": self.path, "host": self.headers.get("Host"), "api_key": self.headers.get("X-API-Key"), "body": data.decode()}).encode(), "application/json")
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
`

// wsScript is a WebSocket echo server (RFC 6455; each frame is echoed as
// it came, fragments as fragments):
// python3's standard library has none, and a script needs no build step
// and runs in any image with python3.
const wsScript = `
import base64, hashlib, socket, struct, sys, threading
def readn(f, n):
    b = b""
    while len(b) < n:
        d = f.read(n - len(b))
        if not d: break
        b += d
    return b
def serve(c):
    f = c.makefile("rb")
    key = ""
    while True:
        line = f.readline()
        if line in (b"\r\n", b""): break
        k, _, v = line.decode().partition(":")
        if k.strip().lower() == "sec-websocket-key": key = v.strip()
    acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
    c.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n" % acc).encode())
    while True:
        h = readn(f, 2)
        if len(h) < 2: break
        op, n = h[0] & 15, h[1] & 127
        if n == 126: n = struct.unpack(">H", readn(f, 2))[0]
        elif n == 127: n = struct.unpack(">Q", readn(f, 8))[0]
        mask = readn(f, 4) if h[1] & 128 else b"\0\0\0\0"
        data = readn(f, n)
        if n: data = (int.from_bytes(data, "big") ^ int.from_bytes((mask * (n // 4 + 1))[:n], "big")).to_bytes(n, "big")
        if op == 8:
            c.sendall(bytes([0x88, len(data)]) + data); break
        if op == 9: op = 10
        hdr = bytes([(h[0] & 0x80) | op])  # fragments echo as fragments
        if n < 126: hdr += bytes([n])
        elif n < 65536: hdr += bytes([126]) + struct.pack(">H", n)
        else: hdr += bytes([127]) + struct.pack(">Q", n)
        c.sendall(hdr + data)
    c.close()
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(16)
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
`

// startServices starts the HTTP service on 8000 and the WebSocket echo on
// 8001 inside sandbox id.
func startServices(t *testing.T, srv *testserver.Server, id string) {
	t.Helper()
	cmd := "cat > /tmp/svc.py <<'EOF'\n" + serviceScript + "EOF\ncat > /tmp/ws.py <<'EOF'\n" + wsScript + "EOF\n" +
		"(python3 /tmp/svc.py 8000 >/tmp/svc.log 2>&1 &); (python3 /tmp/ws.py 8001 >/tmp/ws.log 2>&1 &); true"
	if j := execWait(t, srv, id, map[string]any{"command": cmd}); j.ExitCode == nil || *j.ExitCode != 0 {
		t.Fatalf("start services: %+v", j)
	}
}

// plain sends a request with no API key (unless key) and returns status,
// header and body.
func plain(t *testing.T, method, url string, body io.Reader, hdr map[string]string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	tr := &http.Transport{DisableCompression: true}
	defer tr.CloseIdleConnections()
	res, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, b
}

func wantService(t *testing.T, status int, b []byte, wantStatus int, code string) map[string]any {
	t.Helper()
	var env struct {
		Detail any            `json:"detail"`
		Error  map[string]any `json:"error"`
	}
	if status != wantStatus || json.Unmarshal(b, &env) != nil || env.Error["code"] != code {
		t.Fatalf("got %d %s, want %d with code %s", status, b, wantStatus, code)
	}
	return map[string]any{"detail": env.Detail, "error": env.Error}
}

func expose(t *testing.T, srv *testserver.Server, id string, body map[string]any) resp {
	t.Helper()
	return call(t, srv, "POST", "/sandboxes/"+id+"/services", body)
}

// The SDK's calls (expose_service, list_services, revoke_service, the
// ServiceEndpoint's url and ws_url) as raw HTTP against a sandbox without
// a network.
func TestServiceEndpoints(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	id := createReady(t, srv, map[string]any{"block_network": true})
	startServices(t, srv, id)

	// expose_service(8000, wait_ready=True): the service may still be
	// starting, the wait covers it.
	r := expose(t, srv, id, map[string]any{"port": 8000, "wait_ready": true, "health_path": "/health", "ready_timeout": 30})
	want(t, r, 200)
	url, _ := r.body["url"].(string)
	if r.body["sandbox_id"] != id || r.body["port"] != float64(8000) || !strings.HasPrefix(url, srv.URL+"/s/") {
		t.Fatalf("expose: %s", r.raw)
	}
	g := call(t, srv, "GET", "/sandboxes/"+id, nil)
	if exp, _ := r.body["expires_at"].(float64); exp != g.body["expires_at"].(float64) {
		t.Errorf("expires_at %v, want the sandbox's %v (the default TTL)", r.body["expires_at"], g.body["expires_at"])
	}
	if tok := strings.TrimPrefix(url, srv.URL+"/s/"); len(tok) < 43 {
		t.Errorf("token %q is shorter than 256 bits", tok)
	}

	t.Run("http without an API key", func(t *testing.T) {
		st, _, b := plain(t, "GET", url+"/health", nil, nil)
		if st != 200 || string(b) != "ok" {
			t.Fatalf("GET /health: %d %s", st, b)
		}
		// The bare URL is the service's "/" (which answers 404 "no").
		if st, _, b = plain(t, "GET", url, nil, nil); st != 404 || string(b) != "no" {
			t.Fatalf("GET the bare URL: %d %s", st, b)
		}
		st, _, b = plain(t, "POST", url+"/echo?x=1&y=%2F", strings.NewReader("payload"), map[string]string{"X-API-Key": srv.APIKey})
		var got map[string]any
		if st != 200 || json.Unmarshal(b, &got) != nil {
			t.Fatalf("POST /echo: %d %s", st, b)
		}
		if got["path"] != "/echo?x=1&y=%2F" || got["body"] != "payload" || got["api_key"] != nil || got["host"] != "127.0.0.1:8000" {
			t.Errorf("the service saw %v", got)
		}
	})

	t.Run("content-encoding passes untouched", func(t *testing.T) {
		st, h, b := plain(t, "GET", url+"/gz", nil, map[string]string{"Accept-Encoding": "gzip"})
		if st != 200 || h.Get("Content-Encoding") != "gzip" {
			t.Fatalf("GET /gz: %d %v", st, h)
		}
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("body is not the service's gzip: %v", err)
		}
		plainText, _ := io.ReadAll(zr)
		if string(plainText) != strings.Repeat("compressed ", 1000) {
			t.Errorf("decompressed %d bytes", len(plainText))
		}
	})

	t.Run("64 MiB streamed", func(t *testing.T) {
		req, _ := http.NewRequest("GET", url+"/big", nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		chunk := make([]byte, 256*4096)
		for i := range chunk {
			chunk[i] = byte(i)
		}
		// The service holds back all but its first MiB until /tmp/go
		// exists: that MiB arriving first shows nothing waits for the
		// whole body.
		first := make([]byte, len(chunk))
		done := make(chan error, 1)
		go func() { _, err := io.ReadFull(res.Body, first); done <- err }()
		select {
		case err := <-done:
			if err != nil || !bytes.Equal(first, chunk) {
				t.Fatalf("first MiB: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the first MiB did not arrive before the rest was sent: the proxy buffers")
		}
		if j := execWait(t, srv, id, map[string]any{"command": "touch /tmp/go"}); *j.ExitCode != 0 {
			t.Fatal(j)
		}
		h := sha256.New()
		h.Write(first)
		n, err := io.Copy(h, res.Body)
		if err != nil || n+int64(len(first)) != 64<<20 {
			t.Fatalf("read %d bytes: %v", n+int64(len(first)), err)
		}
		w := sha256.New()
		for range 64 {
			w.Write(chunk)
		}
		if !bytes.Equal(h.Sum(nil), w.Sum(nil)) {
			t.Fatal("the download's hash differs from what the service sent")
		}
	})

	// expose_service(8001) without wait: a WebSocket echo at ws_url + "/ws".
	r = expose(t, srv, id, map[string]any{"port": 8001, "wait_ready": false, "health_path": "/health", "ready_timeout": 60, "ttl_seconds": 600})
	want(t, r, 200)
	wsURL := "ws" + strings.TrimPrefix(r.body["url"].(string), "http") + "/ws"
	if exp := r.body["expires_at"].(float64); exp > float64(time.Now().Unix()+601) {
		t.Errorf("ttl_seconds 600 gave expires_at %v", exp)
	}
	t.Run("websocket echo", func(t *testing.T) {
		var conn *websocket.Conn
		var err error
		for range 50 { // the echo server may still be starting
			if conn, _, err = websocket.DefaultDialer.Dial(wsURL, nil); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("dial %s: %v", wsURL, err)
		}
		defer conn.Close()
		big := make([]byte, 300<<10)
		_, _ = rand.Read(big)
		for _, m := range []struct {
			typ  int
			data []byte
		}{{websocket.TextMessage, []byte("hello")}, {websocket.BinaryMessage, big}, {websocket.TextMessage, []byte("again")}} {
			if err := conn.WriteMessage(m.typ, m.data); err != nil {
				t.Fatal(err)
			}
			typ, got, err := conn.ReadMessage()
			if err != nil || typ != m.typ || !bytes.Equal(got, m.data) {
				t.Fatalf("echo: type %d, %d bytes, %v", typ, len(got), err)
			}
		}
	})

	// list_services()
	l := call(t, srv, "GET", "/sandboxes/"+id+"/services", nil)
	want(t, l, 200)
	if fmt.Sprint(l.body["ports"]) != "[8000 8001]" || l.body["sandbox_id"] != id {
		t.Fatalf("list: %s", l.raw)
	}

	t.Run("ports that cannot be exposed", func(t *testing.T) {
		for _, p := range []any{0, -1, 65536, 7070, 3128} {
			r := expose(t, srv, id, map[string]any{"port": p})
			wantService(t, r.status, r.raw, 400, "service.port_invalid")
		}
		r := expose(t, srv, id, map[string]any{"port": "eighty"})
		want(t, r, 422)
		r = expose(t, srv, id, map[string]any{"wait_ready": true})
		want(t, r, 422)
		r = expose(t, srv, id, map[string]any{"port": 8000, "ttl_seconds": 0})
		want(t, r, 422)
		r = expose(t, srv, "no-such-sandbox", map[string]any{"port": 8000})
		want(t, r, 404)
	})

	t.Run("a port nothing listens on", func(t *testing.T) {
		start := time.Now()
		r := expose(t, srv, id, map[string]any{"port": 8009, "wait_ready": true, "ready_timeout": 1})
		e := wantService(t, r.status, r.raw, 408, "service.not_ready")
		if d := fmt.Sprint(e["detail"]); !strings.Contains(d, "port 8009") || !strings.Contains(d, "nothing accepts connections") {
			t.Errorf("detail %q", d)
		}
		if time.Since(start) > 10*time.Second {
			t.Errorf("ready_timeout 1 took %v", time.Since(start))
		}
		r = expose(t, srv, id, map[string]any{"port": 8009})
		want(t, r, 200)
		st, _, b := plain(t, "GET", r.body["url"].(string)+"/", nil, nil)
		e = wantService(t, st, b, 502, "service.unreachable")
		if !strings.Contains(fmt.Sprint(e["detail"]), "8009") {
			t.Errorf("detail %q does not name the port", e["detail"])
		}
		want(t, call(t, srv, "DELETE", "/sandboxes/"+id+"/services/8009", nil), 200)
	})

	t.Run("unknown and expired tokens", func(t *testing.T) {
		tok := make([]byte, 32)
		_, _ = rand.Read(tok)
		st, _, b := plain(t, "GET", srv.URL+"/s/"+base64.RawURLEncoding.EncodeToString(tok)+"/health", nil, map[string]string{"X-API-Key": srv.APIKey})
		wantService(t, st, b, 403, "service.token_invalid")
		r := expose(t, srv, id, map[string]any{"port": 8000, "ttl_seconds": 1})
		want(t, r, 200)
		short := r.body["url"].(string)
		time.Sleep(2100 * time.Millisecond)
		st, _, b = plain(t, "GET", short+"/health", nil, nil)
		wantService(t, st, b, 403, "service.token_invalid")
	})

	// revoke_service(8001): at once, for HTTP and WebSocket alike.
	rv := call(t, srv, "DELETE", "/sandboxes/"+id+"/services/8001", nil)
	want(t, rv, 200)
	if rv.body["status"] != "revoked" || rv.body["port"] != float64(8001) {
		t.Fatalf("revoke: %s", rv.raw)
	}
	if _, res, err := websocket.DefaultDialer.Dial(wsURL, nil); err == nil || res == nil || res.StatusCode != 403 {
		t.Fatalf("websocket after revoke: %v %v", err, res)
	}
	rv = call(t, srv, "DELETE", "/sandboxes/"+id+"/services/8001", nil)
	wantService(t, rv.status, rv.raw, 404, "service.not_exposed")
	l = call(t, srv, "GET", "/sandboxes/"+id+"/services", nil)
	if fmt.Sprint(l.body["ports"]) != "[8000]" {
		t.Fatalf("list after revoke: %s", l.raw)
	}

	// Deleting the sandbox revokes its URLs, and a new sandbox with the
	// same id does not inherit them.
	want(t, call(t, srv, "DELETE", "/sandboxes/"+id, nil), 200)
	st, _, b := plain(t, "GET", url+"/health", nil, nil)
	wantService(t, st, b, 403, "service.token_invalid")
}

// Orchard's Python client's service calls, sync and async, and Orchard Env
// SDK's request sequence (with requests, when installed), against a real
// server: sdk/python/tests/test_services.py.
func TestServicePythonClient(t *testing.T) {
	runPythonTests(t, testserver.Start(t, testserver.Options{}), "tests.test_services")
}
