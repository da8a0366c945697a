package agentclient

import "sync"

// Pool hands out one Client per agent address, so calls to one sandbox
// share pooled connections. It holds at most max clients; past that the
// oldest is closed and dropped (a sandbox that comes back gets a new one).
type Pool struct {
	max int

	mu      sync.Mutex // guards clients and order
	clients map[string]*Client
	order   []string // insertion order, oldest first
}

// NewPool returns a pool of at most max clients (4096 if max ≤ 0).
func NewPool(max int) *Pool {
	if max <= 0 {
		max = 4096
	}
	return &Pool{max: max, clients: map[string]*Client{}}
}

// Client returns the client for addr.
func (p *Pool) Client(addr string) *Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.clients[addr]; ok {
		return c
	}
	for len(p.order) >= p.max {
		old := p.order[0]
		p.order = p.order[1:]
		if c, ok := p.clients[old]; ok {
			c.Close()
			delete(p.clients, old)
		}
	}
	c := NewClient(addr)
	p.clients[addr] = c
	p.order = append(p.order, addr)
	return c
}

// Forget closes and drops the client for addr (its sandbox is gone).
func (p *Pool) Forget(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.clients[addr]; ok {
		c.Close()
		delete(p.clients, addr)
		for i, a := range p.order {
			if a == addr {
				p.order = append(p.order[:i], p.order[i+1:]...)
				break
			}
		}
	}
}
