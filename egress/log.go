package egress

import (
	"strconv"
	"sync"
	"time"

	"github.com/orchard/orchard/faults"
)

// Entry is one connection (CONNECT) or one request (plain HTTP) a sandbox
// made through its proxy.
type Entry struct {
	ID      int64     `json:"id"`
	Start   time.Time `json:"start"`
	Method  string    `json:"method"`
	URL     string    `json:"url"`
	Host    string    `json:"host"`
	Port    int       `json:"port"`
	Scheme  string    `json:"scheme"` // "http", or "tunnel" for CONNECT (TLS, WebSocket over TLS)
	Status  int       `json:"status,omitempty"`
	MIME    string    `json:"mime,omitempty"`
	Sent    int64     `json:"bytes_sent"`
	Recv    int64     `json:"bytes_received"`
	Timings Timings   `json:"timings"`
	// Done is false while a tunnel or response is still open.
	Done     bool          `json:"done"`
	Error    *faults.Info  `json:"error,omitempty"`
	Injected *faults.Truth `json:"injected,omitempty"`
}

// Timings are milliseconds; -1 where a phase did not happen.
type Timings struct {
	Connect float64 `json:"connect"`
	Wait    float64 `json:"wait"` // first response byte after the request was sent
	Total   float64 `json:"total"`
}

// Log keeps the last entries of one sandbox.
type Log struct {
	mu   sync.Mutex // guards ring, next
	ring []*Entry
	next int64
	cap  int
}

// DefaultLogSize bounds the entries kept: a long episode on a heavy site
// makes thousands of requests; older ones roll off.
const DefaultLogSize = 10_000

// NewLog returns a log keeping the last n entries.
func NewLog(n int) *Log {
	if n <= 0 {
		n = DefaultLogSize
	}
	return &Log{cap: n}
}

// begin adds an entry and returns it for its owner to finish under update.
func (l *Log) begin(e Entry) *Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.next++
	e.ID = l.next
	p := &e
	if len(l.ring) < l.cap {
		l.ring = append(l.ring, p)
	} else {
		l.ring[int((l.next-1)%int64(l.cap))] = p
	}
	return p
}

// update changes an entry under the log's lock.
func (l *Log) update(e *Entry, fn func(*Entry)) {
	l.mu.Lock()
	fn(e)
	l.mu.Unlock()
}

// Entries returns copies of the entries with ID > since, oldest first.
func (l *Log) Entries(since int64) []Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Entry, 0, len(l.ring))
	n := len(l.ring)
	start := 0
	if n == l.cap {
		start = int(l.next % int64(l.cap))
	}
	for i := range n {
		e := l.ring[(start+i)%n]
		if e.ID > since {
			out = append(out, *e)
		}
	}
	return out
}

// Evidence is the latest failure met on host since t: what a browser
// that saw only "tunnel failed" needs to attribute a navigation.
func (l *Log) Evidence(host string, since time.Time) (Entry, bool) {
	host = normalizeHost(host)
	l.mu.Lock()
	defer l.mu.Unlock()
	var best *Entry
	for _, e := range l.ring {
		if e.Host != host || e.Start.Before(since) || (e.Error == nil && e.Injected == nil) {
			continue
		}
		if best == nil || e.ID > best.ID {
			best = e
		}
	}
	if best == nil {
		return Entry{}, false
	}
	return *best, true
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// HAR is an HTTP Archive 1.2 document of entries. Tunnelled (TLS)
// connections appear as CONNECT entries: the proxy sees their host, bytes
// and timings, not their requests.
func HAR(entries []Entry, creator string) map[string]any {
	list := make([]map[string]any, 0, len(entries))
	for _, e := range entries {
		status := e.Status
		text := ""
		if e.Error != nil {
			text = e.Error.Code
		}
		resp := map[string]any{
			"status": status, "statusText": text, "httpVersion": "HTTP/1.1",
			"headers": []any{}, "cookies": []any{}, "redirectURL": "", "headersSize": -1, "bodySize": e.Recv,
			"content": map[string]any{"size": e.Recv, "mimeType": e.MIME},
		}
		entry := map[string]any{
			"startedDateTime": e.Start.UTC().Format(time.RFC3339Nano),
			"time":            e.Timings.Total,
			"request": map[string]any{
				"method": e.Method, "url": e.URL, "httpVersion": "HTTP/1.1",
				"headers": []any{}, "queryString": []any{}, "cookies": []any{}, "headersSize": -1, "bodySize": e.Sent,
			},
			"response": resp,
			"cache":    map[string]any{},
			"timings": map[string]any{
				"blocked": -1, "dns": -1, "ssl": -1,
				"connect": e.Timings.Connect, "send": 0, "wait": e.Timings.Wait,
				"receive": max(0, e.Timings.Total-max(e.Timings.Connect, 0)-max(e.Timings.Wait, 0)),
			},
			"connection": strconv.FormatInt(e.ID, 10),
			"_orchard":   map[string]any{"scheme": e.Scheme, "done": e.Done, "error": e.Error, "injected": e.Injected},
		}
		list = append(list, entry)
	}
	return map[string]any{"log": map[string]any{
		"version": "1.2",
		"creator": map[string]any{"name": creator, "version": "1"},
		"pages":   []any{},
		"entries": list,
	}}
}
