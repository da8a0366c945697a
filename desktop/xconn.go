package desktop

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/shm"
	"github.com/jezek/xgb/xproto"
	"github.com/jezek/xgb/xtest"
	"golang.org/x/sys/unix"
)

// xDialTimeout bounds connecting to a local X server that is up: the
// handshake is one round trip, so this only absorbs a loaded machine.
const xDialTimeout = 5 * time.Second

// xCloseTimeout bounds closing a connection: xgb's Close waits for one
// last round trip, which a hung server would never answer.
const xCloseTimeout = time.Second

// xconn is one connection to the X server with what the session needs
// from it: the screen's geometry and pixel layout, the keyboard mapping,
// and a shared-memory segment for captures. It is used under the
// session's X lock, one operation at a time.
type xconn struct {
	c    *xgb.Conn
	nc   net.Conn
	gen  uint64 // the X server generation it was opened on
	root xproto.Window
	w, h int
	// bgr reports a 32-bit ZPixmap whose bytes are B, G, R, X (the
	// little-endian layout of Xvfb's depth-24 TrueColor); false means
	// X, R, G, B.
	bgr bool
	// released are the core button masks of the buttons released since
	// the last settle.
	released uint16

	shm *shmSeg // nil when MIT-SHM is unavailable

	// grant pushes the current operation's deadline back (see extend);
	// withX sets it for the time of an operation.
	grant func(time.Duration)

	keys      *keymap
	keysStale atomic.Bool // a MappingNotify arrived since keys was read
	// loans are the spare keycodes mapped to keysyms the map lacks
	// (Session.loans).
	loans map[xproto.Keycode]*loan
	// interrupted: a canceled operation cut the connection with a past
	// deadline; xgb notices only later, so the next operation must not
	// take it for alive.
	interrupted atomic.Bool
	dead        chan struct{} // closed when the connection has ended
	minKeycode  xproto.Keycode
	maxKeycode  xproto.Keycode
}

// dialX connects to display number disp.
func dialX(disp int, gen uint64, useShm bool) (*xconn, error) {
	nc, err := net.DialTimeout("unix", "/tmp/.X11-unix/X"+strconv.Itoa(disp), xDialTimeout)
	if err != nil {
		return nil, err
	}
	_ = nc.SetDeadline(time.Now().Add(xDialTimeout))
	c, err := xgb.NewConnNet(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("x handshake: %w", err)
	}
	x := &xconn{c: c, nc: nc, gen: gen, dead: make(chan struct{})}
	go x.drain()
	if err := x.setup(useShm); err != nil {
		x.close()
		return nil, err
	}
	_ = nc.SetDeadline(time.Time{})
	return x, nil
}

func (x *xconn) setup(useShm bool) error {
	setup := xproto.Setup(x.c)
	scr := setup.DefaultScreen(x.c)
	x.root = scr.Root
	x.w, x.h = int(scr.WidthInPixels), int(scr.HeightInPixels)
	x.minKeycode, x.maxKeycode = setup.MinKeycode, setup.MaxKeycode
	bpp := 0
	for _, f := range setup.PixmapFormats {
		if f.Depth == scr.RootDepth {
			bpp = int(f.BitsPerPixel)
		}
	}
	var visual *xproto.VisualInfo
	for _, d := range scr.AllowedDepths {
		for i := range d.Visuals {
			if d.Visuals[i].VisualId == scr.RootVisual {
				visual = &d.Visuals[i]
			}
		}
	}
	if scr.RootDepth != 24 || bpp != 32 || visual == nil || visual.RedMask != 0xff0000 || visual.BlueMask != 0xff {
		return fmt.Errorf("unsupported screen format: depth %d, %d bits per pixel", scr.RootDepth, bpp)
	}
	x.bgr = setup.ImageByteOrder == xproto.ImageOrderLSBFirst
	if err := xtest.Init(x.c); err != nil {
		return fmt.Errorf("XTEST extension: %w", err)
	}
	if useShm {
		// A failure only costs speed: captures fall back to GetImage.
		x.shm, _ = attachShm(x, x.w*x.h*4)
	}
	return nil
}

// drain reads the events and asynchronous errors xgb queues, until the
// connection ends. Nothing here selects events, but every client gets
// MappingNotify, and xgb stops reading replies once its queue of 5000
// unread events is full.
func (x *xconn) drain() {
	defer close(x.dead)
	for {
		ev, err := x.c.WaitForEvent()
		if ev == nil && err == nil {
			return
		}
		if _, ok := ev.(xproto.MappingNotifyEvent); ok {
			x.keysStale.Store(true)
		}
	}
}

// alive reports whether the connection still works.
func (x *xconn) alive() bool {
	if x.interrupted.Load() {
		return false
	}
	select {
	case <-x.dead:
		return false
	default:
		return true
	}
}

// close ends the connection and waits for xgb's goroutines to stop.
func (x *xconn) close() {
	_ = x.nc.SetDeadline(time.Now().Add(xCloseTimeout))
	x.c.Close()
	select {
	case <-x.dead:
	case <-time.After(2 * xCloseTimeout):
		// xgb is stuck on a write to a server that stopped reading;
		// closing the socket ends its loops.
		x.nc.Close()
		<-x.dead
	}
	if x.shm != nil {
		x.shm.detach()
		x.shm = nil
	}
}

// extend pushes the current operation's deadline back by d, for a wait
// of the operation's own that its timeout must not count.
func (x *xconn) extend(d time.Duration) {
	if x.grant != nil {
		x.grant(d)
	}
}

// sync waits until the server has processed every request sent so far:
// GetInputFocus is the cheapest request with a reply.
func (x *xconn) sync() error {
	r, err := xproto.GetInputFocus(x.c).Reply()
	return replyErr(r == nil, err)
}

// errConnClosed is what a missing reply means: xgb answers a request
// cut off by the end of the connection with io.EOF or with nothing.
var errConnClosed = errors.New("X connection closed")

// replyErr is the error of a request whose reply was missing (noReply)
// or failed.
func replyErr(noReply bool, err error) error {
	switch {
	case err != nil:
		return err
	case noReply:
		return errConnClosed
	}
	return nil
}

// shmSeg is a System V shared-memory segment attached both here and in
// the X server, which writes captures straight into it.
type shmSeg struct {
	id  int
	seg uint32 // the X resource id of the attachment
	mem []byte
}

// attachShm creates a segment of size bytes and attaches it to x's
// server. The segment is marked for removal as soon as both sides are
// attached, so the kernel frees it when the last one detaches, even if
// this process dies.
func attachShm(x *xconn, size int) (*shmSeg, error) {
	reply, err := xproto.QueryExtension(x.c, uint16(len("MIT-SHM")), "MIT-SHM").Reply()
	if err != nil || reply == nil || !reply.Present {
		return nil, fmt.Errorf("no MIT-SHM extension")
	}
	// Registered by hand rather than with shm.Init, which also writes
	// xgb's process-wide event and error tables while other connections'
	// readers use them (a data race). Those tables only matter for MIT-SHM's
	// own events and BadSeg errors, which these requests do not expect.
	x.c.ExtLock.Lock()
	x.c.Extensions["MIT-SHM"] = reply.MajorOpcode
	x.c.ExtLock.Unlock()

	id, err := unix.SysvShmGet(unix.IPC_PRIVATE, size, unix.IPC_CREAT|0o600)
	if err != nil {
		return nil, fmt.Errorf("shmget: %w", err)
	}
	mem, err := unix.SysvShmAttach(id, 0, 0)
	if err != nil {
		_, _ = unix.SysvShmCtl(id, unix.IPC_RMID, nil)
		return nil, fmt.Errorf("shmat: %w", err)
	}
	s := &shmSeg{id: id, mem: mem}
	segID, err := x.c.NewId()
	if err == nil {
		s.seg = segID
		err = shm.AttachChecked(x.c, shm.Seg(s.seg), uint32(id), false).Check()
	}
	// Removal waits for the last detach; marking it now means a crash
	// cannot leak the segment. Linux lets the X server attach first.
	_, _ = unix.SysvShmCtl(id, unix.IPC_RMID, nil)
	if err != nil {
		_ = unix.SysvShmDetach(mem)
		return nil, fmt.Errorf("MIT-SHM attach (the X server must share this IPC namespace): %w", err)
	}
	return s, nil
}

func (s *shmSeg) detach() {
	if s.mem != nil {
		_ = unix.SysvShmDetach(s.mem)
		s.mem = nil
	}
}
