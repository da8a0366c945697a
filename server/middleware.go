package server

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"

	"github.com/orchard/orchard/faults"
)

const (
	requestIDKey = "request_id"
	bodyKey      = "body"
)

// requestID sets X-Request-ID on every response (a client's own id is kept
// when it is a sane token).
func requestID() gin.HandlerFunc {
	return func(c *gin.Context) {
		id := c.GetHeader("X-Request-ID")
		if id == "" || len(id) > 128 || strings.ContainsAny(id, " \t\r\n") {
			id = uuid.NewString()
		}
		c.Set(requestIDKey, id)
		c.Header("X-Request-ID", id)
		c.Next()
	}
}

// recovery turns a panic into Orchard's 500 body; it never takes the
// process down.
func (s *Server) recovery() gin.HandlerFunc {
	return func(c *gin.Context) {
		defer func() {
			if r := recover(); r != nil {
				if r == http.ErrAbortHandler {
					panic(r) // a response broken off on purpose: net/http drops the connection
				}
				rid := c.GetString(requestIDKey)
				_ = c.Error(faults.New(faults.CodeInternal, faults.Internal, faults.Platform, "panic in handler"))
				s.log.Error("panic in handler", "request_id", rid, "path", c.FullPath(), "panic", r)
				c.AbortWithStatusJSON(http.StatusInternalServerError, gin.H{
					"error": "Internal server error", "detail": fmt.Sprint(r), "request_id": rid,
					"error_info": faults.Info{Category: faults.Internal, Source: faults.Platform, Code: faults.CodeInternal, Message: "internal error"},
				})
			}
		}()
		c.Next()
	}
}

// unauthenticatedBody bounds what is read of a request that carries no
// valid key: enough for any malformed-JSON answer, far from the limit a
// key holder's upload may reach.
const unauthenticatedBody = 64 << 10

// readBody reads the bounded request body once. Malformed JSON is refused
// with 422 here, before authentication, as FastAPI does. For a request
// without a valid key on a guarded path only the first 64 KiB are read:
// past that it is refused for its key, so a stranger cannot make the
// server hold a quarter gigabyte per connection. A stream route's body is
// its handler's to read, as it arrives; only a stranger's is read here.
func (s *Server) readBody(limit int64, raw, public, stream bool) gin.HandlerFunc {
	return func(c *gin.Context) {
		if c.Request.Body == nil || c.Request.Method == http.MethodGet {
			c.Next()
			return
		}
		stranger := !public && s.cfg.RequireAPIKey && !s.validKey(c.GetHeader("X-API-Key"))
		if stream && !stranger {
			c.Next()
			return
		}
		max := limit
		if stranger {
			max = min(limit, unauthenticatedBody)
		}
		body, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, max))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) && stranger {
				c.Next() // auth refuses it
				return
			}
			if errors.As(err, &mbe) {
				renderError(c, s.log, faults.Newf(faults.CodeTooLarge, faults.TooLarge, faults.Client,
					"request body exceeds %d bytes", limit))
				return
			}
			renderError(c, s.log, faults.Wrap(err, faults.CodeInvalidJSON, faults.InvalidRequest, faults.Client, "could not read request body"))
			return
		}
		if !raw && len(bytes.TrimSpace(body)) > 0 && !json.Valid(body) {
			e := faults.Validation(faults.FieldError{Type: "json_invalid", Loc: []any{"body", 0}, Msg: "JSON decode error", Input: map[string]any{}})
			e.Code = faults.CodeInvalidJSON
			renderError(c, s.log, e)
			return
		}
		c.Set(bodyKey, body)
		c.Next()
	}
}

func body(c *gin.Context) []byte {
	b, _ := c.Get(bodyKey)
	bb, _ := b.([]byte)
	return bb
}

// auth checks X-API-Key as ORCHARD_COMPAT §2 describes. For WebSockets the
// key may also come from the api_key query parameter or a
// "Sec-WebSocket-Protocol: api_key.<key>" entry.
func (s *Server) auth(ws bool) gin.HandlerFunc {
	return func(c *gin.Context) {
		if !s.cfg.RequireAPIKey {
			c.Next()
			return
		}
		if len(s.cfg.APIKeys) == 0 {
			renderError(c, s.log, faults.New(faults.CodeMisconfigured, faults.Internal, faults.Platform,
				"Server misconfiguration: no API keys configured"))
			return
		}
		key := c.GetHeader("X-API-Key")
		if ws {
			if q := c.Query("api_key"); q != "" {
				key = q
			} else if p := wsProtocolKey(c.GetHeader("Sec-WebSocket-Protocol")); p != "" {
				key = p
			}
		}
		var e *faults.Error
		switch {
		case key == "":
			e = faults.New(faults.CodeUnauthenticated, faults.Unauthenticated, faults.Client,
				"Missing API key. Please provide X-API-Key header.")
		case !s.validKey(key):
			e = faults.New(faults.CodeForbidden, faults.PermissionDenied, faults.Client, "Invalid API key")
		}
		if e != nil {
			if ws {
				// Orchard refuses WebSocket handshakes with 403 whatever the reason.
				e.Status = http.StatusForbidden
			}
			renderError(c, s.log, e)
			return
		}
		c.Next()
	}
}

func (s *Server) validKey(key string) bool {
	ok := 0
	for _, k := range s.cfg.APIKeys {
		ok |= subtle.ConstantTimeCompare([]byte(k), []byte(key))
	}
	return ok == 1
}

func wsProtocolKey(h string) string {
	for _, p := range strings.Split(h, ",") {
		p = strings.TrimSpace(p)
		if k, ok := strings.CutPrefix(p, "api_key."); ok {
			return k
		}
	}
	return ""
}
