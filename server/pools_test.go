package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/server/manager"
)

// shellSpec is the sandbox body of the shell pools below.
func shellSpec() map[string]any {
	return map[string]any{"image": "host", "block_network": true, "memory": "256Mi"}
}

// with returns a copy of body with the extra fields set.
func with(body map[string]any, kv ...any) map[string]any {
	out := map[string]any{}
	for k, v := range body {
		out[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

func poolOf(t testing.TB, r resp) api.Pool {
	t.Helper()
	var p api.Pool
	if err := json.Unmarshal(r.raw, &p); err != nil {
		t.Fatalf("pool body: %v: %s", err, r.raw)
	}
	return p
}

// awaitPool polls GET /pools/{name} until ok holds.
func awaitPool(t testing.TB, srv *testserver.Server, name string, ok func(api.Pool) bool) api.Pool {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		r := call(t, srv, "GET", "/pools/"+name, nil)
		want(t, r, 200)
		p := poolOf(t, r)
		if ok(p) {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s never got there: %s", name, r.raw)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func full(p api.Pool) bool { return p.Ready == p.Size && p.Starting == 0 }

func createPool(t testing.TB, srv *testserver.Server, name string, size int, sandbox map[string]any) {
	t.Helper()
	r := call(t, srv, "POST", "/pools", map[string]any{"name": name, "size": size, "sandbox": sandbox})
	want(t, r, 201)
	if p := poolOf(t, r); p.Name != name || p.Size != size || p.Max != size {
		t.Fatalf("created pool: %s", r.raw)
	}
}

// claim creates a sandbox and checks it came ready out of a pool.
func claim(t testing.TB, srv *testserver.Server, body map[string]any) string {
	t.Helper()
	r := call(t, srv, "POST", "/sandboxes", body)
	want(t, r, 200)
	if r.body["status"] != "ready" || r.body["ready"] != true || r.body["pool"] == nil {
		t.Fatalf("claim: %s", r.raw)
	}
	return r.body["sandbox_id"].(string)
}

func runtimeIDs(t testing.TB, srv *testserver.Server) []string {
	t.Helper()
	insts, err := srv.Runtime.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, in := range insts {
		ids = append(ids, in.ID)
	}
	slices.Sort(ids)
	return ids
}

func listedIDs(t testing.TB, srv *testserver.Server) []string {
	t.Helper()
	r := call(t, srv, "GET", "/sandboxes", nil)
	want(t, r, 200)
	var l api.SandboxList
	_ = json.Unmarshal(r.raw, &l)
	var ids []string
	for _, s := range l.Sandboxes {
		ids = append(ids, s.SandboxID)
	}
	slices.Sort(ids)
	return ids
}

func TestPoolClaimRefillAndMatch(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	createPool(t, srv, "sh", 2, shellSpec())
	awaitPool(t, srv, "sh", full)
	if ids := listedIDs(t, srv); len(ids) != 0 {
		t.Fatalf("unclaimed members are listed: %v", ids)
	}
	// They are no one's, but /resources counts what they hold.
	res := call(t, srv, "GET", "/resources", nil)
	want(t, res, 200)
	if pods, _ := res.body["sandbox_pods"].([]any); len(pods) != 2 {
		t.Fatalf("/resources does not count the pool's sandboxes: %s", res.raw)
	}

	// An explicit claim: ready at once, exec works at once, per-claim
	// labels and TTL applied, age counted from the claim.
	before := float64(time.Now().UnixNano()) / 1e9
	id := claim(t, srv, with(shellSpec(), "pool", "sh", "labels", map[string]string{"team": "a"}, "ttl_seconds", 600))
	if j := execWait(t, srv, id, map[string]any{"command": "echo hi"}); j.Stdout != "hi\n" {
		t.Fatalf("exec on a claimed sandbox: %+v", j)
	}
	g := call(t, srv, "GET", "/sandboxes/"+id, nil)
	want(t, g, 200)
	var sb api.Sandbox
	_ = json.Unmarshal(g.raw, &sb)
	if !sb.Ready || sb.Status != "ready" || sb.Labels["team"] != "a" || sb.CreatedAt < before || sb.ExpiresAt == nil ||
		*sb.ExpiresAt-sb.CreatedAt != 600 || sb.LastHeartbeat != nil {
		t.Fatalf("claimed sandbox: %s", g.raw)
	}
	if _, ok := sb.Labels[manager.PoolLabel]; ok {
		t.Errorf("the pool's reserved label leaks into the user's labels: %v", sb.Labels)
	}
	if ids := listedIDs(t, srv); !slices.Equal(ids, []string{id}) {
		t.Fatalf("GET /sandboxes = %v, want only the claimed %s", ids, id)
	}
	// The pool refills at once.
	p := awaitPool(t, srv, "sh", full)
	if p.Claims != 1 || p.Misses != 0 {
		t.Fatalf("counts after one claim: %+v", p)
	}

	// Implicit: the pool's body without "pool" is a claim; another cpu is not.
	id2 := claim(t, srv, with(shellSpec(), "labels", map[string]string{"k": "v"}))
	if id2 == id {
		t.Fatal("the same sandbox was handed out twice")
	}
	r := call(t, srv, "POST", "/sandboxes", with(shellSpec(), "cpu", "1"))
	want(t, r, 200)
	if r.body["status"] != "pending" || r.body["pool"] != nil {
		t.Fatalf("a create with another cpu was served by the pool: %s", r.raw)
	}
	// Named but differing in a setting a claim cannot change: 422 naming it.
	for field, v := range map[string]any{"cpu": "1", "env": map[string]string{"A": "1"}, "image": "busybox:latest"} {
		r := call(t, srv, "POST", "/sandboxes", with(shellSpec(), "pool", "sh", field, v))
		wantCode(t, r, 422, faults.CodePoolMismatch)
		if !strings.Contains(string(r.raw), `"loc":["body","`+field+`"]`) {
			t.Errorf("mismatch on %s does not name it: %s", field, r.raw)
		}
	}
	p = awaitPool(t, srv, "sh", full)
	if p.Claims != 2 || p.Misses != 0 {
		t.Fatalf("counts after two claims: %+v", p)
	}
	if len(listedIDs(t, srv)) != 3 {
		t.Fatalf("listed: %v", listedIDs(t, srv))
	}

	// A claim under a name of the client's (the SDK's prefix): the record
	// is the client's id, the container keeps its own.
	id3 := claim(t, srv, with(shellSpec(), "pool", "sh", "sandbox_id", "mine-1"))
	if id3 != "mine-1" {
		t.Fatalf("claim with sandbox_id got %s", id3)
	}
	if slices.Contains(runtimeIDs(t, srv), "mine-1") {
		t.Fatal("the runtime knows the alias: the test proves nothing")
	}
	// Reconciliation must not take the container for an orphan.
	srv.Manager.Sweep(context.Background())
	if j := execWait(t, srv, id3, map[string]any{"command": "echo alias"}); j.Stdout != "alias\n" {
		t.Fatalf("exec on an aliased claim after a sweep: %+v", j)
	}
	want(t, call(t, srv, "POST", "/sandboxes/"+id3+"/pause", nil), 200)
	want(t, call(t, srv, "POST", "/sandboxes/"+id3+"/resume", nil), 200)
	// The same id again is taken: the member goes back to its pool.
	r = call(t, srv, "POST", "/sandboxes", with(shellSpec(), "pool", "sh", "sandbox_id", "mine-1"))
	wantCode(t, r, 409, faults.CodeSandboxExists)
	awaitPool(t, srv, "sh", full)
	// Deleting the alias deletes its container.
	n := len(runtimeIDs(t, srv))
	want(t, call(t, srv, "DELETE", "/sandboxes/"+id3, nil), 200)
	deadline := time.Now().Add(30 * time.Second)
	for len(runtimeIDs(t, srv)) != n-1 {
		if time.Now().After(deadline) {
			t.Fatalf("the aliased sandbox's container outlived its delete: %v", runtimeIDs(t, srv))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// An empty pool's claim is a miss and a cold create that works.
func TestPoolMissIsColdCreate(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	createPool(t, srv, "none", 0, shellSpec())
	r := call(t, srv, "POST", "/sandboxes", with(shellSpec(), "pool", "none"))
	want(t, r, 200)
	if r.body["status"] != "pending" {
		t.Fatalf("a claim on an empty pool: %s", r.raw)
	}
	id := r.body["sandbox_id"].(string)
	w := call(t, srv, "GET", "/sandboxes/"+id+"/wait?timeout=60", nil)
	if w.body["status"] != "ready" {
		t.Fatalf("cold fallback: %s", w.raw)
	}
	if j := execWait(t, srv, id, map[string]any{"command": "echo cold"}); j.Stdout != "cold\n" {
		t.Fatalf("exec: %+v", j)
	}
	p := poolOf(t, call(t, srv, "GET", "/pools/none", nil))
	if p.Misses != 1 || p.Claims != 0 || p.Ready != 0 {
		t.Fatalf("counts: %+v", p)
	}
	b, _ := getBody(t, srv, "/metrics")
	if !strings.Contains(string(b), `orchard_pool_claims_total{pool="none",result="miss"} 1`) {
		t.Errorf("metrics lack the miss:\n%s", grepLines(string(b), "orchard_pool"))
	}
}

func TestPoolDeleteDrains(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	createPool(t, srv, "d", 2, shellSpec())
	awaitPool(t, srv, "d", full)
	id := claim(t, srv, with(shellSpec(), "pool", "d"))
	awaitPool(t, srv, "d", full)
	r := call(t, srv, "DELETE", "/pools/d", nil)
	want(t, r, 200)
	if r.body["drained"] != float64(2) {
		t.Fatalf("delete: %s", r.raw)
	}
	wantCode(t, call(t, srv, "GET", "/pools/d", nil), 404, faults.CodePoolNotFound)
	wantCode(t, call(t, srv, "DELETE", "/pools/d", nil), 404, faults.CodePoolNotFound)
	deadline := time.Now().Add(30 * time.Second)
	for ids := runtimeIDs(t, srv); !slices.Equal(ids, []string{id}); ids = runtimeIDs(t, srv) {
		if time.Now().After(deadline) {
			t.Fatalf("after the drain the runtime has %v, want only the claimed %s", ids, id)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if j := execWait(t, srv, id, map[string]any{"command": "echo mine"}); j.Stdout != "mine\n" {
		t.Fatalf("the claimed sandbox did not survive the drain: %+v", j)
	}
	r = call(t, srv, "GET", "/pools", nil)
	want(t, r, 200)
	if !strings.Contains(string(r.raw), `"pools":[]`) {
		t.Fatalf("pools after delete: %s", r.raw)
	}
}

func TestPoolBadInputs(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	createPool(t, srv, "taken", 0, shellSpec())
	cases := []struct {
		name   string
		body   any
		status int
		code   string
	}{
		{"negative size", map[string]any{"name": "a", "size": -1, "sandbox": shellSpec()}, 422, faults.CodeValidation},
		{"size over the cap", map[string]any{"name": "a", "size": manager.MaxPoolSize + 1, "sandbox": shellSpec()}, 422, faults.CodeValidation},
		{"max below size", map[string]any{"name": "a", "size": 2, "max": 1, "sandbox": shellSpec()}, 422, faults.CodeValidation},
		{"name not a DNS label", map[string]any{"name": "Bad_Name", "size": 1, "sandbox": shellSpec()}, 422, faults.CodeValidation},
		{"no name", map[string]any{"size": 1, "sandbox": shellSpec()}, 422, faults.CodeValidation},
		{"no sandbox", map[string]any{"name": "a", "size": 1}, 422, faults.CodeValidation},
		{"invalid sandbox cpu", map[string]any{"name": "a", "size": 1, "sandbox": with(shellSpec(), "cpu", "lots")}, 422, faults.CodeValidation},
		{"invalid sandbox browser settings", map[string]any{"name": "a", "size": 1, "sandbox": with(shellSpec(), "browser", map[string]any{})}, 422, faults.CodeValidation},
		{"sandbox names an id", map[string]any{"name": "a", "size": 1, "sandbox": with(shellSpec(), "sandbox_id", "x")}, 422, faults.CodeValidation},
		{"reserved label", map[string]any{"name": "a", "size": 1, "sandbox": with(shellSpec(), "labels", map[string]string{manager.PoolLabel: "x"})}, 422, faults.CodeValidation},
		{"duplicate name", map[string]any{"name": "taken", "size": 1, "sandbox": shellSpec()}, 409, faults.CodePoolExists},
		{"not JSON", "{", 422, faults.CodeInvalidJSON},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := call(t, srv, "POST", "/pools", c.body)
			wantCode(t, r, c.status, c.code)
		})
	}
	// Claims of an unknown pool are 404 with a code, and create nothing.
	wantCode(t, call(t, srv, "POST", "/sandboxes", with(shellSpec(), "pool", "nope")), 404, faults.CodePoolNotFound)
	// A user's create may not carry the pool's reserved label.
	wantCode(t, call(t, srv, "POST", "/sandboxes", with(shellSpec(), "labels", map[string]string{manager.PoolLabel: "taken"})), 422, faults.CodeValidation)
	time.Sleep(100 * time.Millisecond)
	if ids := runtimeIDs(t, srv); len(ids) != 0 {
		t.Fatalf("bad inputs created sandboxes: %v", ids)
	}
	p := poolOf(t, call(t, srv, "GET", "/pools/taken", nil))
	if p.Size != 0 || p.Claims != 0 || p.Misses != 0 {
		t.Fatalf("the existing pool changed: %+v", p)
	}
}

// A claim's egress allow-list replaces the pool's.
func TestPoolClaimEgressAllow(t *testing.T) {
	srv, port := egressServer(t)
	spec := map[string]any{"image": "host", "block_network": false, "memory": "256Mi",
		"egress": map[string]any{"allow": []string{"other.test"}}}
	createPool(t, srv, "net", 1, spec)
	awaitPool(t, srv, "net", full)
	id := claim(t, srv, with(spec, "pool", "net", "egress", map[string]any{"allow": []string{"site.test"}}))
	curl := func(host string) string {
		j := execWait(t, srv, id, map[string]any{"command": "curl -s -o /dev/null -w '%{http_code}' --max-time 20 http://" + host + ":" + port + "/"})
		return strings.TrimSpace(j.Stdout)
	}
	if got := curl("site.test"); got != "200" {
		t.Errorf("host on the claim's allow-list: %s", got)
	}
	if got := curl("other.test"); got != "403" {
		t.Errorf("host only on the pool's allow-list: %s", got)
	}
}

// A browser pool's claim lands on its start_url with its viewport.
func TestPoolBrowserClaim(t *testing.T) {
	testenv.RequireChromium(t)
	srv, port := egressServer(t)
	spec := map[string]any{"image": "host", "kind": "browser", "block_network": false,
		"egress": map[string]any{"allow": []string{"site.test"}}}
	createPool(t, srv, "web", 1, spec)
	awaitPool(t, srv, "web", full)
	start := "http://site.test:" + port + "/start"
	id := claim(t, srv, with(spec, "browser", map[string]any{"start_url": start, "viewport": map[string]any{"width": 800, "height": 600}}))
	o := call(t, srv, "GET", "/sandboxes/"+id+"/browser/observation?screenshot=none", nil)
	want(t, o, 200)
	var obs api.BrowserObservation
	_ = json.Unmarshal(o.raw, &obs)
	if obs.URL != start || obs.Title != "site site.test:"+port {
		t.Fatalf("claimed browser is at %q (%q), want %s", obs.URL, obs.Title, start)
	}
	ev := call(t, srv, "POST", "/sandboxes/"+id+"/browser/evaluate", map[string]any{"expression": "innerWidth + 'x' + innerHeight"})
	want(t, ev, 200)
	if ev.body["value"] != "800x600" {
		t.Fatalf("viewport after the claim: %s", ev.raw)
	}
	// Another launch setting is another browser: no match.
	r := call(t, srv, "POST", "/sandboxes", with(spec, "pool", "web", "browser", map[string]any{"user_agent": "x"}))
	wantCode(t, r, 422, faults.CodePoolMismatch)
}

// Claims from two replicas on one Redis never hand out one sandbox twice,
// and the pool never holds more than max.
func TestPoolReplicasNeverDoubleClaim(t *testing.T) {
	a, b, _ := replicas(t)
	const n = 3
	createPool(t, a, "shared", n, shellSpec())
	awaitPool(t, b, "shared", full)
	var (
		mu      sync.Mutex
		claimed []string
		wg      sync.WaitGroup
	)
	for i := range 2 * n {
		srv := a
		if i%2 == 1 {
			srv = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := call(t, srv, "POST", "/sandboxes", with(shellSpec(), "pool", "shared"))
			if r.status != 200 {
				t.Errorf("claim: %d %s", r.status, r.raw)
				return
			}
			if r.body["ready"] == true {
				mu.Lock()
				claimed = append(claimed, r.body["sandbox_id"].(string))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.Sort(claimed)
	if len(slices.Compact(slices.Clone(claimed))) != len(claimed) {
		t.Fatalf("a sandbox was claimed twice: %v", claimed)
	}
	if len(claimed) < n {
		t.Fatalf("only %d of %d ready members were claimed: %v", len(claimed), n, claimed)
	}
	// Both replicas refill; the pool never holds more than max.
	deadline := time.Now().Add(60 * time.Second)
	for {
		p := poolOf(t, call(t, a, "GET", "/pools/shared", nil))
		if p.Ready+p.Starting > p.Max {
			t.Fatalf("pool overshoots max: %+v", p)
		}
		if full(p) {
			if p.Claims+p.Misses != 2*n || p.Claims != len(claimed) {
				t.Fatalf("counts %+v, want %d claims of %d", p, len(claimed), 2*n)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool never refilled: %+v", p)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A restarted server (memory store) finds its pools, re-adopts the
// members and the claimed sandboxes, and leaks nothing.
func TestPoolSurvivesRestart(t *testing.T) {
	dir := testserver.StateDir(t)
	opts := testserver.Options{StateDir: dir, Manager: manager.Config{PoolsFile: filepath.Join(dir, "pools.json")}}
	first := testserver.Start(t, opts)
	createPool(t, first, "keep", 2, shellSpec())
	awaitPool(t, first, "keep", full)
	id := claim(t, first, with(shellSpec(), "pool", "keep", "sandbox_id", "kept-1", "labels", map[string]string{"x": "y"}))
	awaitPool(t, first, "keep", full)
	before := runtimeIDs(t, first)
	if len(before) != 3 {
		t.Fatalf("before the restart: %v", before)
	}
	first.Stop(t, false)

	second := testserver.Start(t, opts)
	p := awaitPool(t, second, "keep", full)
	if p.Size != 2 {
		t.Fatalf("pool after restart: %+v", p)
	}
	if after := runtimeIDs(t, second); !slices.Equal(after, before) {
		t.Fatalf("containers after the restart %v, before %v: members were not re-adopted", after, before)
	}
	g := call(t, second, "GET", "/sandboxes/"+id, nil)
	want(t, g, 200)
	if g.body["status"] != "ready" || fmt.Sprint(g.body["labels"]) != "map[x:y]" {
		t.Fatalf("claimed sandbox after restart: %s", g.raw)
	}
	if ids := listedIDs(t, second); !slices.Equal(ids, []string{id}) {
		t.Fatalf("listed after restart: %v", ids)
	}
	if j := execWait(t, second, id, map[string]any{"command": "echo back"}); j.Stdout != "back\n" {
		t.Fatalf("exec after restart: %+v", j)
	}
	// And the re-adopted members are claimable.
	claim(t, second, with(shellSpec(), "pool", "keep"))
	awaitPool(t, second, "keep", full)
}
