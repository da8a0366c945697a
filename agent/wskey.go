package agent

import (
	"bufio"
	"bytes"
	"crypto/sha1"
	"encoding/base64"
	"net"
	"net/http"
	"sync"
)

// Some DevTools clients send a Sec-WebSocket-Key that is not the base64 of
// 16 bytes (rod sends "nil"). Chromium's own endpoint accepts any key, and
// such a client checks the accept value against the key it sent, so the
// proxy must too; gorilla's upgrader refuses the handshake. lenientKey
// hands the upgrader a valid stand-in key and puts the accept value of the
// client's own key back into the handshake response.
func lenientKey(w http.ResponseWriter, r *http.Request) http.ResponseWriter {
	key := r.Header.Get("Sec-WebSocket-Key")
	if key == "" || validKey(key) {
		return w
	}
	sum := sha1.Sum([]byte(key))
	stand := base64.StdEncoding.EncodeToString(sum[:16])
	r.Header.Set("Sec-WebSocket-Key", stand)
	return &acceptRewriter{ResponseWriter: w, from: []byte(acceptValue(stand)), to: []byte(acceptValue(key))}
}

func validKey(k string) bool {
	b, err := base64.StdEncoding.DecodeString(k)
	return err == nil && len(b) == 16
}

// acceptValue is RFC 6455's Sec-WebSocket-Accept for key.
func acceptValue(key string) string {
	h := sha1.New()
	h.Write([]byte(key))
	h.Write([]byte("258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	return base64.StdEncoding.EncodeToString(h.Sum(nil))
}

type acceptRewriter struct {
	http.ResponseWriter
	from, to []byte
}

func (a *acceptRewriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := a.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, http.ErrNotSupported
	}
	c, rw, err := h.Hijack()
	if err != nil {
		return c, rw, err
	}
	return &rewriteConn{Conn: c, from: a.from, to: a.to}, rw, nil
}

// rewriteConn replaces the accept value in the first write (the upgrader
// writes its whole handshake response at once) and passes the rest on.
type rewriteConn struct {
	net.Conn
	once     sync.Once
	from, to []byte
}

func (c *rewriteConn) Write(p []byte) (int, error) {
	first := false
	c.once.Do(func() { first = true })
	if !first {
		return c.Conn.Write(p)
	}
	q := bytes.Replace(p, c.from, c.to, 1)
	if _, err := c.Conn.Write(q); err != nil {
		return 0, err
	}
	return len(p), nil
}
