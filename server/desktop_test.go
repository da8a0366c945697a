package server_test

import (
	"bytes"
	"encoding/binary"
	"image"
	_ "image/jpeg"
	_ "image/png"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

func requireXvfb(t testing.TB) {
	t.Helper()
	for _, name := range []string{"Xvfb", "xterm", "xdpyinfo", "xwininfo", "xsetroot", "x11vnc", "xclip"} {
		_, err := exec.LookPath(name)
		testenv.Require(t, "xvfb", err == nil, name+" not in PATH (apt-get install xvfb openbox xterm x11-utils x11-xserver-utils x11vnc xclip)")
	}
}

// A desktop sandbox through the REST API: the X session starts with the
// sandbox, execs see its DISPLAY, actions in our own, Anthropic's and
// OpenAI's forms move the real pointer, and screenshots come back scaled
// with their frame and scale.
func TestDesktopSandbox(t *testing.T) {
	requireXvfb(t)
	srv := testserver.Start(t, testserver.Options{})
	r := call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "block_network": true, "kind": "desktop",
		"desktop": map[string]any{"width": 800, "height": 600, "apps": []string{"xterm"}}})
	want(t, r, 200)
	id := r.body["sandbox_id"].(string)
	if w := call(t, srv, "GET", "/sandboxes/"+id+"/wait?timeout=60", nil); w.body["status"] != "ready" {
		t.Fatalf("desktop sandbox: %s", w.raw)
	}
	j := execWait(t, srv, id, map[string]any{"command": "xdpyinfo | grep dimensions"})
	if !strings.Contains(j.Stdout, "800x600 pixels") {
		t.Fatalf("exec does not see the desktop: %+v", j)
	}

	cursor := func(body map[string]any) (float64, float64) {
		t.Helper()
		a := call(t, srv, "POST", "/sandboxes/"+id+"/desktop/actions", body)
		want(t, a, 200)
		if a.body["ok"] != true {
			t.Fatalf("actions: %s", a.raw)
		}
		res := a.body["results"].([]any)
		c := res[len(res)-1].(map[string]any)["cursor"].(map[string]any)
		return c["x"].(float64), c["y"].(float64)
	}
	cases := []struct {
		name string
		body map[string]any
		x, y float64
	}{
		{"ours", map[string]any{"actions": []map[string]any{{"type": "mouse_move", "x": 100, "y": 120}, {"type": "cursor_position"}}}, 100, 120},
		{"anthropic", map[string]any{"actions": []map[string]any{{"action": "mouse_move", "coordinate": []int{300, 200}}, {"action": "cursor_position"}}}, 300, 200},
		{"openai", map[string]any{"actions": []map[string]any{{"type": "move", "x": 50, "y": 60}, {"type": "cursor_position"}}}, 50, 60},
	}
	for _, c := range cases {
		if x, y := cursor(c.body); x != c.x || y != c.y {
			t.Errorf("%s: cursor at %v,%v, want %v,%v", c.name, x, y, c.x, c.y)
		}
	}

	// A screenshot scaled to 400 wide: its frame's scale is 0.5, and a
	// click at (100, 100) in its pixels lands at (200, 200) on the screen.
	if img := desktopShot(t, srv, id, "&width=400"); img.Bounds().Dx() != 400 || img.Bounds().Dy() != 300 {
		t.Fatalf("scaled screenshot: %v", img.Bounds())
	}
	if x, y := cursor(map[string]any{"actions": []map[string]any{{"type": "mouse_move", "x": 100, "y": 100}, {"type": "cursor_position"}}}); x != 100 || y != 100 {
		t.Errorf("cursor in the scaled frame's pixels: %v,%v, want 100,100", x, y)
	}
	// GET /desktop/cursor reads the same pointer, in both spaces.
	c := call(t, srv, "GET", "/sandboxes/"+id+"/desktop/cursor", nil)
	want(t, c, 200)
	if c.body["x"] != 100.0 || c.body["y"] != 100.0 || c.body["screen_x"] != 200.0 || c.body["screen_y"] != 200.0 ||
		c.body["scale"] != 0.5 || c.body["frame"].(float64) < 1 {
		t.Errorf("GET /desktop/cursor: %s, want x,y 100,100 in the 0.5 frame and 200,200 on the screen", c.raw)
	}
	// A full-size screenshot makes screen pixels the frame's: the pointer
	// is at (200, 200) there.
	if x, y := cursor(map[string]any{"actions": []map[string]any{{"type": "screenshot"}, {"type": "cursor_position"}}}); x != 200 || y != 200 {
		t.Errorf("cursor on the screen: %v,%v, want 200,200", x, y)
	}

	// Typing into the xterm runs a command whose output exec reads back.
	// The xterm's window is found with xwininfo, and clicked in its middle.
	cx, cy := xtermCenter(t, srv, id)
	a := call(t, srv, "POST", "/sandboxes/"+id+"/desktop/actions", map[string]any{"actions": []map[string]any{
		{"type": "screenshot"},
		{"type": "click", "x": cx, "y": cy},
		{"type": "type", "text": "echo typed-$((6*7)) ✓ > /tmp/typed"},
		{"type": "key", "keys": "Return"},
		{"type": "wait", "ms": 300},
	}})
	if a.status != 200 || a.body["ok"] != true {
		t.Fatalf("typing: %s", a.raw)
	}
	j = execWait(t, srv, id, map[string]any{"command": "for i in 1 2 3 4 5 6 7 8 9 10; do [ -s /tmp/typed ] && break; sleep 0.2; done; cat /tmp/typed"})
	if got := strings.TrimSpace(j.Stdout); got != "typed-42 ✓" {
		t.Errorf("typed into the xterm, read back %q", got)
	}

	// Pixel probe: the root window painted green shows green where no
	// window covers it.
	execWait(t, srv, id, map[string]any{"command": "xsetroot -solid '#00ff00'"})
	img := desktopShot(t, srv, id, "")
	if r, g, b, _ := img.At(790, 590).RGBA(); r>>8 > 16 || g>>8 < 240 || b>>8 > 16 {
		t.Errorf("root window pixel = %d,%d,%d, want green", r>>8, g>>8, b>>8)
	}

	// Live view: an RFB handshake over the WebSocket reaches the desktop.
	if w, h := vncHandshake(t, srv, id); w != 800 || h != 600 {
		t.Errorf("RFB ServerInit %dx%d, want 800x600", w, h)
	}
	if w2, _ := vncHandshake(t, srv, id); w2 != 800 { // a second viewer shares the server
		t.Errorf("second viewer: %d", w2)
	}

	// The window manager killed mid-session: restarted, and reported in
	// the status and the next actions response, which succeeds.
	if _, err := exec.LookPath("openbox"); err == nil {
		if st := call(t, srv, "GET", "/sandboxes/"+id+"/desktop/status", nil); st.body["window_manager"] != "running" {
			t.Errorf("status before killing openbox: %s", st.raw)
		}
		execWait(t, srv, id, map[string]any{"command": "pkill -KILL -x openbox; true"})
		fault := desktopFault(t, srv, id, "desktop.wm_died")
		if fault["source"] != "desktop" || fault["category"] != "unavailable" || fault["retryable"] != true || fault["restarts"] != 1.0 || fault["at"] == nil {
			t.Errorf("after killing openbox: last fault %v", fault)
		}
		st := call(t, srv, "GET", "/sandboxes/"+id+"/desktop/status", nil)
		for end := time.Now().Add(15 * time.Second); time.Now().Before(end) && st.body["window_manager"] != "running"; time.Sleep(100 * time.Millisecond) {
			st = call(t, srv, "GET", "/sandboxes/"+id+"/desktop/status", nil)
		}
		if st.body["window_manager"] != "running" {
			t.Errorf("openbox not restarted: status %s", st.raw)
		}
		a := call(t, srv, "POST", "/sandboxes/"+id+"/desktop/actions", map[string]any{"actions": []map[string]any{{"type": "mouse_move", "x": 10, "y": 10}}})
		faults, _ := a.body["faults"].([]any)
		if a.status != 200 || a.body["ok"] != true || len(faults) != 1 || faults[0].(map[string]any)["code"] != "desktop.wm_died" {
			t.Errorf("actions after the window manager restart: %d %s", a.status, a.raw)
		}
	}

	// The X server killed mid-session: detected, classified, recovered.
	execWait(t, srv, id, map[string]any{"command": "pkill -KILL -x Xvfb; true"})
	if fault := desktopFault(t, srv, id, "desktop.x_server_died"); fault["source"] != "desktop" {
		t.Errorf("after killing Xvfb: last fault %v", fault)
	}
	if img := desktopShot(t, srv, id, ""); img.Bounds().Dx() != 800 {
		t.Errorf("screenshot after the restart: %v", img.Bounds())
	}
	j = execWait(t, srv, id, map[string]any{"command": "xdpyinfo | grep dimensions"})
	if !strings.Contains(j.Stdout, "800x600") {
		t.Errorf("X after restart: %+v", j)
	}

	// Bad input is a classified 4xx; browser paths refuse a desktop sandbox.
	if a := call(t, srv, "POST", "/sandboxes/"+id+"/desktop/actions", map[string]any{"actions": []map[string]any{{"type": "teleport"}}}); a.status != 400 || !strings.Contains(string(a.raw), "action.invalid") {
		t.Errorf("bad action: %d %s", a.status, a.raw)
	}
	if a := call(t, srv, "GET", "/sandboxes/"+id+"/browser/tabs", nil); a.status != 400 {
		t.Errorf("browser path on a desktop: %d %s", a.status, a.raw)
	}
	if a := call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "desktop": map[string]any{"width": 10}}); a.status != 422 {
		t.Errorf("desktop settings on a shell: %d %s", a.status, a.raw)
	}
}

// desktopFault waits up to 15 s for the desktop status to report a last
// fault with code, and returns it.
func desktopFault(t *testing.T, srv *testserver.Server, id, code string) map[string]any {
	t.Helper()
	var fault map[string]any
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		st := call(t, srv, "GET", "/sandboxes/"+id+"/desktop/status", nil)
		if fault, _ = st.body["last_fault"].(map[string]any); fault != nil && fault["code"] == code {
			return fault
		}
	}
	t.Fatalf("no %s in the desktop status within 15 s; last fault %v", code, fault)
	return nil
}

// vncHandshake runs RFB 3.8 with no authentication over /desktop/vnc and
// returns the framebuffer size of the ServerInit.
func vncHandshake(t *testing.T, srv *testserver.Server, id string) (int, int) {
	t.Helper()
	u := "ws" + strings.TrimPrefix(srv.URL, "http") + "/sandboxes/" + id + "/desktop/vnc"
	d := websocket.Dialer{Subprotocols: []string{"binary"}, HandshakeTimeout: 10 * time.Second}
	conn, resp, err := d.Dial(u, http.Header{"X-API-Key": {srv.APIKey}})
	if err != nil {
		t.Fatalf("vnc websocket: %v %v", err, resp)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	var buf []byte
	read := func(n int) []byte {
		t.Helper()
		for len(buf) < n {
			_, msg, err := conn.ReadMessage()
			if err != nil {
				t.Fatalf("rfb read: %v", err)
			}
			buf = append(buf, msg...)
		}
		out := buf[:n]
		buf = buf[n:]
		return out
	}
	send := func(b []byte) {
		t.Helper()
		if err := conn.WriteMessage(websocket.BinaryMessage, b); err != nil {
			t.Fatal(err)
		}
	}
	if v := string(read(12)); !strings.HasPrefix(v, "RFB 003.") {
		t.Fatalf("rfb version %q", v)
	}
	send([]byte("RFB 003.008\n"))
	n := int(read(1)[0])
	types := read(n)
	if !bytes.Contains(types, []byte{1}) {
		t.Fatalf("security types %v: no None (view-only without a password)", types)
	}
	send([]byte{1})
	if res := binary.BigEndian.Uint32(read(4)); res != 0 {
		t.Fatalf("security result %d", res)
	}
	send([]byte{1})  // shared
	init := read(24) // width, height, pixel format (16), name length
	w, h := int(binary.BigEndian.Uint16(init[0:2])), int(binary.BigEndian.Uint16(init[2:4]))
	read(int(binary.BigEndian.Uint32(init[20:24]))) // the desktop's name
	// A full (non-incremental) update request is answered with a
	// FramebufferUpdate (message type 0) carrying at least one rectangle.
	req := []byte{3, 0, 0, 0, 0, 0, byte(w >> 8), byte(w), byte(h >> 8), byte(h)}
	send(req)
	hdr := read(4)
	if hdr[0] != 0 || binary.BigEndian.Uint16(hdr[2:4]) == 0 {
		t.Fatalf("no framebuffer update: % x", hdr)
	}
	return w, h
}

// desktopShot fetches a PNG screenshot and checks its headers.
func desktopShot(t *testing.T, srv *testserver.Server, id, query string) image.Image {
	t.Helper()
	req, _ := http.NewRequest("GET", srv.URL+"/sandboxes/"+id+"/desktop/screenshot?format=png"+query, nil)
	req.Header.Set("X-API-Key", srv.APIKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	wantScale := "1"
	if strings.Contains(query, "width=400") {
		wantScale = "0.5"
	}
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "image/png" || res.Header.Get("X-Orchard-Scale") != wantScale || res.Header.Get("X-Orchard-Frame") == "" {
		t.Fatalf("screenshot: %d %v %s", res.StatusCode, res.Header, data)
	}
	img, _, err := image.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// appPage reports what input did to it in its title, which the X window
// name carries, so exec (xwininfo) reads the app's state back.
const appPage = `<html><head><title>ready</title></head><body style="margin:0;height:5000px">
<button style="position:absolute;left:100px;top:100px;width:200px;height:80px" onclick="document.title='clicked'">press</button>
<textarea id="t" style="position:absolute;left:100px;top:250px;width:300px;height:80px">copy me</textarea>
<div id="d" style="position:absolute;left:500px;top:100px;width:80px;height:80px;background:red"></div>
<script>
let drag = null;
document.getElementById('d').onmousedown = e => { drag = [e.clientX, e.clientY]; e.preventDefault(); };
onmouseup = e => { if (drag) { document.title = 'drag=' + (e.clientX - drag[0]) + ',' + (e.clientY - drag[1]); drag = null; } };
onscroll = () => { document.title = 'scroll=' + Math.round(scrollY); };
document.addEventListener('copy', () => { const t = document.getElementById('t');
  document.title = 'copied:' + t.value.substring(t.selectionStart, t.selectionEnd); });
</script></body></html>`

// Click, scroll, drag and key chords reach a real app at the positions
// meant: a chromium app window with no window manager fills the screen
// from (0, 0), so page coordinates are screen coordinates.
func TestDesktopInputReachesApp(t *testing.T) {
	requireXvfb(t)
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	r := call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "block_network": true, "kind": "desktop",
		"desktop": map[string]any{"width": 1024, "height": 768, "apps": []string{"chromium"}, "window_manager": "none",
			"url": "data:text/html," + url.PathEscape(appPage)}})
	want(t, r, 200)
	id := r.body["sandbox_id"].(string)
	if w := call(t, srv, "GET", "/sandboxes/"+id+"/wait?timeout=60", nil); w.body["status"] != "ready" {
		t.Fatalf("desktop sandbox: %s", w.raw)
	}
	title := func(want string) string {
		t.Helper()
		j := execWait(t, srv, id, map[string]any{"command": "for i in $(seq 100); do xwininfo -root -tree | grep -q '\"" + want +
			"' && break; sleep 0.1; done; xwininfo -root -tree | grep -o '\"" + want + "[^\"]*\"' | head -1"})
		return strings.Trim(strings.TrimSpace(j.Stdout), `"`)
	}
	if got := title("ready"); got != "ready" {
		t.Fatalf("the app did not come up: %q", got)
	}
	act := func(actions ...map[string]any) {
		t.Helper()
		a := call(t, srv, "POST", "/sandboxes/"+id+"/desktop/actions", map[string]any{"actions": actions})
		if a.status != 200 || a.body["ok"] != true {
			t.Fatalf("actions: %s", a.raw)
		}
	}
	act(map[string]any{"type": "click", "x": 200, "y": 140})
	if got := title("clicked"); got != "clicked" {
		t.Errorf("click: title %q", got)
	}
	act(map[string]any{"type": "drag", "path": [][]int{{540, 140}, {590, 165}, {640, 190}}})
	if got := title("drag="); got != "drag=100,50" {
		t.Errorf("drag: title %q", got)
	}
	act(map[string]any{"type": "click", "x": 250, "y": 290}, map[string]any{"type": "key", "keys": "ctrl+a"}, map[string]any{"type": "key", "keys": "ctrl+c"})
	if got := title("copied:"); got != "copied:copy me" {
		t.Errorf("select-all and copy: title %q", got)
	}
	// The copy reached the X clipboard: read it back through exec.
	j := execWait(t, srv, id, map[string]any{"command": "for i in $(seq 50); do v=$(xclip -o -selection clipboard 2>/dev/null) && [ -n \"$v\" ] && break; sleep 0.1; done; printf %s \"$v\""})
	if j.Stdout != "copy me" {
		t.Errorf("clipboard: %q (%s)", j.Stdout, j.Stderr)
	}
	act(map[string]any{"type": "scroll", "x": 700, "y": 500, "dy": 5})
	if got := title("scroll="); got == "" || got == "scroll=0" {
		t.Errorf("scroll: title %q", got)
	}
}

// A browser authenticates the live view's WebSocket with an
// "api_key.<key>" subprotocol, as it can set no header. The handshake
// answers with that subprotocol (a browser fails one that answers none it
// offered), and the key stays out of the sandbox, where a process of the
// sandbox's can stand in for the desktop daemon's socket and read it.
func TestDesktopVNCKeyStaysOut(t *testing.T) {
	requireXvfb(t)
	srv := testserver.Start(t, testserver.Options{})
	r := call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "block_network": true, "kind": "desktop",
		"desktop": map[string]any{"width": 640, "height": 480, "window_manager": "none"}})
	want(t, r, 200)
	id := r.body["sandbox_id"].(string)
	if w := call(t, srv, "GET", "/sandboxes/"+id+"/wait?timeout=60", nil); w.body["status"] != "ready" {
		t.Fatalf("desktop sandbox: %s", w.raw)
	}
	u := "ws" + strings.TrimPrefix(srv.URL, "http") + "/sandboxes/" + id + "/desktop/vnc"
	keyProto := "api_key." + srv.APIKey

	d := websocket.Dialer{Subprotocols: []string{keyProto}, HandshakeTimeout: 10 * time.Second}
	conn, resp, err := d.Dial(u, nil)
	if err != nil {
		t.Fatalf("vnc websocket with the key as subprotocol: %v %v", err, resp)
	}
	conn.Close()
	if p := resp.Header.Get("Sec-WebSocket-Protocol"); p != keyProto {
		t.Errorf("handshake answered subprotocol %q to a client that offered only %q: a browser fails it", p, "api_key.…")
	}

	// A sandbox process takes the daemon's socket and records the next
	// request the agent forwards.
	script := "import socket,os\n" +
		"os.rename('/run/orchard-desktop.sock','/run/real-desktop.sock')\n" +
		"s=socket.socket(socket.AF_UNIX); s.bind('/run/orchard-desktop.sock'); s.listen(1)\n" +
		"open('/tmp/ready','w').close()\n" +
		"c,_=s.accept(); data=b''\n" +
		"while b'\\r\\n\\r\\n' not in data:\n" +
		"    d=c.recv(4096)\n" +
		"    if not d: break\n" +
		"    data+=d\n" +
		"open('/tmp/captured','wb').write(data)\n" +
		"c.sendall(b'HTTP/1.1 502 Bad Gateway\\r\\nContent-Length: 0\\r\\nConnection: close\\r\\n\\r\\n'); c.close()\n"
	j := execWait(t, srv, id, map[string]any{"command": "cat > /tmp/listen.py <<'EOF'\n" + script + "EOF\n" +
		"(python3 /tmp/listen.py >/tmp/listen.log 2>&1 &); for i in $(seq 100); do [ -f /tmp/ready ] && exit 0; sleep 0.1; done; cat /tmp/listen.log; exit 1"})
	if j.ExitCode == nil || *j.ExitCode != 0 {
		t.Fatalf("take the socket: %+v", j)
	}
	d.Subprotocols = []string{"binary", keyProto}
	_, _, _ = d.Dial(u, nil)
	got := execWait(t, srv, id, map[string]any{"command": "cat /tmp/captured"})
	if !strings.Contains(got.Stdout, "/desktop/vnc") {
		t.Fatalf("the socket's taker saw no request: %+v", got)
	}
	if strings.Contains(got.Stdout, srv.APIKey) {
		t.Errorf("the server's API key reached the sandbox with the live view's request:\n%s", got.Stdout)
	}
}
