package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorilla/websocket"

	"github.com/orchard/orchard/faults"
)

// Live view of a desktop: Debian's x11vnc serves RFB on the sandbox's own
// loopback and GET /desktop/vnc carries it over WebSocket, the transport
// noVNC speaks. x11vnc rather than an RFB server of our own: it tracks
// damage and speaks the compressed encodings (tight, ZRLE) viewers expect,
// where a minimal server would send raw frames (4 MB each at 1280x800).
// It starts with the first viewer, is shared by all of them and is
// view-only: the agent's actions are the only input.

// vncStartTimeout bounds x11vnc's start (it answers in well under a second).
const vncStartTimeout = 10 * time.Second

// maxVNCViewers bounds concurrent viewers of one desktop.
const maxVNCViewers = 8

type vncServer struct {
	display func() string
	log     *slog.Logger

	mu      sync.Mutex // guards cmd, port, viewers
	cmd     *exec.Cmd
	done    chan struct{}
	port    int
	viewers int
}

var vncUpgrader = websocket.Upgrader{
	ReadBufferSize:  64 << 10,
	WriteBufferSize: 64 << 10,
	Subprotocols:    []string{"binary"},
	// The server authenticated the caller.
	CheckOrigin: func(*http.Request) bool { return true },
}

// addr starts x11vnc if it is not running and returns where it listens.
func (v *vncServer) addr(ctx context.Context) (string, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cmd != nil {
		select {
		case <-v.done:
			v.cmd = nil // it died: start another
		default:
			return "127.0.0.1:" + strconv.Itoa(v.port), nil
		}
	}
	path, err := exec.LookPath("x11vnc")
	if err != nil {
		return "", faults.New(faults.CodeKindUnsupported, faults.NotImplemented, faults.Desktop,
			"live view needs x11vnc in the sandbox's image (apt-get install x11vnc)")
	}
	disp := v.display()
	n, _ := strconv.Atoi(strings.TrimPrefix(disp, ":"))
	port := 5900 + n
	cmd := exec.Command(path, "-display", disp, "-localhost", "-rfbport", strconv.Itoa(port),
		"-shared", "-forever", "-viewonly", "-nopw", "-quiet", "-noxrecord", "-nowf", "-noxkb")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = append(os.Environ(), "DISPLAY="+disp)
	if err := cmd.Start(); err != nil {
		return "", faults.Wrap(err, faults.CodeDesktopLaunch, faults.Unavailable, faults.Desktop, "start x11vnc")
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	addr := "127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(vncStartTimeout)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-done:
			return "", faults.New(faults.CodeDesktopLaunch, faults.Unavailable, faults.Desktop, "x11vnc exited while starting")
		case <-ctx.Done():
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			return "", faults.Of(context.Cause(ctx))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			return "", faults.New(faults.CodeDesktopLaunch, faults.Timeout, faults.Desktop, "x11vnc did not start in time")
		}
	}
	v.cmd, v.done, v.port = cmd, done, port
	return addr, nil
}

// stop ends x11vnc.
func (v *vncServer) stop() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cmd != nil {
		_ = syscall.Kill(-v.cmd.Process.Pid, syscall.SIGKILL)
		<-v.done
		v.cmd = nil
	}
}

// serve relays one viewer: WebSocket binary messages to RFB bytes and back.
func (v *vncServer) serve(w http.ResponseWriter, r *http.Request) error {
	v.mu.Lock()
	if v.viewers >= maxVNCViewers {
		v.mu.Unlock()
		return faults.Newf(faults.CodeCapacity, faults.Capacity, faults.Desktop, "at most %d live viewers per desktop", maxVNCViewers)
	}
	v.viewers++
	v.mu.Unlock()
	defer func() {
		v.mu.Lock()
		v.viewers--
		v.mu.Unlock()
	}()
	addr, err := v.addr(r.Context())
	if err != nil {
		return err
	}
	rfb, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return faults.Wrap(err, faults.CodeDesktopLaunch, faults.Unavailable, faults.Desktop, "connect to x11vnc")
	}
	defer rfb.Close()
	ws, err := vncUpgrader.Upgrade(w, r, nil)
	if err != nil {
		return nil // the upgrader answered
	}
	defer ws.Close()
	errc := make(chan error, 2)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := rfb.Read(buf)
			if n > 0 {
				if werr := ws.WriteMessage(websocket.BinaryMessage, buf[:n]); werr != nil {
					errc <- werr
					return
				}
			}
			if err != nil {
				errc <- err
				return
			}
		}
	}()
	go func() {
		for {
			_, data, err := ws.ReadMessage()
			if err != nil {
				errc <- err
				return
			}
			if _, err := rfb.Write(data); err != nil {
				errc <- err
				return
			}
		}
	}()
	err = <-errc
	if errors.Is(err, net.ErrClosed) || websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseGoingAway) {
		return nil
	}
	v.log.Debug("vnc viewer ended", "err", fmt.Sprint(err))
	return nil
}
