package agentclient

import "testing"

func TestPoolReusesAndBounds(t *testing.T) {
	p := NewPool(2)
	a := p.Client("unix:/a")
	if p.Client("unix:/a") != a {
		t.Fatal("same address, different client")
	}
	p.Client("unix:/b")
	p.Client("unix:/c") // evicts a
	if p.Client("unix:/a") == a {
		t.Fatal("oldest client not evicted past the bound")
	}
	if len(p.clients) != 2 || len(p.order) != 2 {
		t.Fatalf("pool holds %d clients, order %v", len(p.clients), p.order)
	}
	p.Forget("unix:/a")
	if _, ok := p.clients["unix:/a"]; ok || len(p.order) != 1 {
		t.Fatalf("forget left %v", p.order)
	}
}
