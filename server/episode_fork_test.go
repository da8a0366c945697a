package server_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"image/gif"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/failpoint"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/sites"
)

// An episode of a bundled task forked at step 4 into three on a real
// browser: each branch starts where the parent was (the quantity typed
// in the page's form carried by the browser's state, the sites' server
// started again), goes its own way and is evaluated on its own; the parent goes
// on and finishes too; the tree shows the family; each branch's
// recording holds only its own steps on disk and exports the whole
// trajectory with the parent's first screenshots; the parent's
// recording cannot be deleted while branches continue it.
func TestEpisodeFork(t *testing.T) {
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	loadBundled(t, srv)
	script, ok := sites.Script("shop-add-two-bottles")
	if !ok || len(script) != 5 {
		t.Fatalf("script of shop-add-two-bottles: %d steps", len(script))
	}
	step := func(id string, a any) map[string]any {
		t.Helper()
		r := call(t, srv, "POST", "/episodes/"+id+"/step", map[string]any{"action": a})
		want(t, r, 200)
		if info, _ := r.body["info"].(map[string]any); info["error"] != nil {
			t.Fatalf("step %s of %s: %s", a, id, r.raw)
		}
		return r.body
	}
	finish := func(id string) map[string]any {
		t.Helper()
		r := call(t, srv, "POST", "/episodes/"+id+"/finish", map[string]any{})
		want(t, r, 200)
		return r.body
	}
	e := call(t, srv, "POST", "/episodes", map[string]any{"task_id": sites.SuiteName + "/shop-add-two-bottles", "max_steps": 10})
	want(t, e, 200)
	parent := e.body["episode_id"].(string)
	// Search, open the bottle, type 2 in the quantity: k = 4, the cart
	// still empty, the 2 only in the page's form.
	const k = 4
	for _, a := range script[:k] {
		step(parent, a)
	}

	f := call(t, srv, "POST", "/episodes/"+parent+"/fork", map[string]any{"count": 3})
	want(t, f, 200)
	if f.body["branch_step"] != float64(k) || f.body["episode_id"] != parent {
		t.Fatalf("fork: %s", f.raw)
	}
	var ids []string
	for _, b := range f.body["branches"].([]any) {
		b := b.(map[string]any)
		ids = append(ids, b["episode_id"].(string))
		info := b["info"].(map[string]any)
		obs, _ := b["observation"].(map[string]any)
		if info["step"] != float64(k) || b["done"] != false || obs == nil || !strings.Contains(obs["url"].(string), "/shop/product") || obs["screenshot"] == nil {
			t.Errorf("branch's first answer: %v", b)
		}
		if b["sandbox_id"] == e.body["sandbox_id"] || b["sandbox_id"] == "" {
			t.Errorf("branch sandbox %v", b["sandbox_id"])
		}
	}
	if len(ids) != 3 {
		t.Fatalf("branches: %s", f.raw)
	}
	for _, id := range ids {
		g := call(t, srv, "GET", "/episodes/"+id, nil)
		want(t, g, 200)
		if g.body["parent"] != parent || g.body["branch_step"] != float64(k) || g.body["steps"] != float64(k) || g.body["status"] != "running" {
			t.Errorf("branch %s: %s", id, g.raw)
		}
	}

	// Branch 0 adds to the cart (the 2 it holds is its parent's form
	// value): success. Branch 1 stops: failure. Branch 2 waits, then
	// adds: success. The parent types 1 and adds: failure.
	add := script[k]
	step(ids[0], add)
	step(ids[2], map[string]any{"type": "wait", "ms": 10})
	step(ids[2], add)
	step(parent, map[string]any{"type": "type", "selector": "#qty", "text": "1", "clear": true})
	step(parent, add)
	wantOutcome := map[string]string{ids[0]: "success", ids[1]: "failure", ids[2]: "success", parent: "failure"}
	wantSteps := map[string]int{ids[0]: k + 1, ids[1]: k, ids[2]: k + 2, parent: k + 2}
	recs := map[string]string{}
	for _, id := range append([]string{parent}, ids...) {
		res := finish(id)
		if res["outcome"] != wantOutcome[id] || res["steps"] != float64(wantSteps[id]) {
			t.Errorf("episode %s finished %v after %v steps, want %s after %d: %v", id, res["outcome"], res["steps"], wantOutcome[id], wantSteps[id], res)
		}
		recs[id], _ = res["recording_id"].(string)
	}

	// The tree, asked of a branch: the root first, its three children.
	tr := call(t, srv, "GET", "/episodes/"+ids[1]+"/tree", nil)
	want(t, tr, 200)
	nodes := tr.body["episodes"].([]any)
	if tr.body["root"] != parent || len(nodes) != 4 {
		t.Fatalf("tree: %s", tr.raw)
	}
	root := nodes[0].(map[string]any)
	var children []string
	for _, c := range root["children"].([]any) {
		children = append(children, c.(string))
	}
	if root["episode_id"] != parent || root["parent"] != nil || !slices.Equal(children, ids) || root["outcome"] != "failure" {
		t.Errorf("tree root: %v", root)
	}
	for i, n := range nodes[1:] {
		n := n.(map[string]any)
		id := ids[i]
		if n["episode_id"] != id || n["parent"] != parent || n["branch_step"] != float64(k) || n["outcome"] != wantOutcome[id] ||
			n["steps"] != float64(wantSteps[id]) || n["status"] != "finished" || len(n["children"].([]any)) != 0 {
			t.Errorf("tree node %d: %v", i+1, n)
		}
		if want := map[string]float64{"success": 1, "failure": 0}[wantOutcome[id]]; n["reward"] != want {
			t.Errorf("tree node %s reward %v, want %v", id, n["reward"], want)
		}
	}

	// Recordings: each branch's directory holds its own steps, numbered
	// from k; its export is the parent's first k steps and its own.
	parentShots := map[int][]byte{}
	for n := range k {
		parentShots[n], _ = getBody(t, srv, "/recordings/"+recs[parent]+"/steps/"+strconv.Itoa(n)+"/screenshot")
	}
	for _, id := range ids {
		rec := recs[id]
		r := call(t, srv, "GET", "/recordings/"+rec, nil)
		want(t, r, 200)
		m := r.body["manifest"].(map[string]any)
		if p, _ := m["parent"].(map[string]any); p == nil || p["recording_id"] != recs[parent] || p["steps"] != float64(k) {
			t.Errorf("recording %s manifest: %v", rec, m)
		}
		var own []int
		for _, s := range r.body["steps"].([]any) {
			own = append(own, int(s.(map[string]any)["n"].(float64)))
		}
		wantOwn := []int{}
		for n := k; n <= wantSteps[id]; n++ {
			wantOwn = append(wantOwn, n)
		}
		if !slices.Equal(own, wantOwn) {
			t.Errorf("recording %s holds steps %v, want %v", rec, own, wantOwn)
		}
		dir := filepath.Join(srv.StateDir, "recordings", rec)
		lines, _ := os.ReadFile(filepath.Join(dir, "steps.jsonl"))
		imgs, _ := os.ReadDir(filepath.Join(dir, "images"))
		var names []string
		for _, e := range imgs {
			names = append(names, e.Name())
		}
		if bytes.Count(lines, []byte("\n")) != len(wantOwn) || len(names) != len(wantOwn) || names[0] != "000004.jpeg" {
			t.Errorf("recording %s on disk: %d lines, images %v", rec, bytes.Count(lines, []byte("\n")), names)
		}

		ex, _ := getBody(t, srv, "/recordings/"+rec+"/export?format=jsonl")
		sc := bufio.NewScanner(bytes.NewReader(ex))
		sc.Buffer(nil, 64<<20)
		var ns []int
		for i := 0; sc.Scan(); i++ {
			var line struct {
				Type     string
				Manifest map[string]any
				Step     struct {
					N      int
					Action json.RawMessage
				}
				Image string
			}
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				if line.Manifest["steps"] != float64(wantSteps[id]+1) {
					t.Errorf("export of %s: manifest steps %v", rec, line.Manifest["steps"])
				}
				continue
			}
			ns = append(ns, line.Step.N)
			img, _ := base64.StdEncoding.DecodeString(line.Image)
			if p, ok := parentShots[line.Step.N]; ok && !bytes.Equal(img, p) {
				t.Errorf("export of %s: step %d's image is not the parent's", rec, line.Step.N)
			}
			if len(img) == 0 {
				t.Errorf("export of %s: step %d has no image", rec, line.Step.N)
			}
			if line.Step.N == k && !strings.Contains(string(line.Step.Action), `#qty`) {
				t.Errorf("export of %s: step %d's action %s, want the parent's", rec, k, line.Step.Action)
			}
		}
		if wantAll := append([]int{0, 1, 2, 3}, wantOwn...); !slices.Equal(ns, wantAll) {
			t.Errorf("export of %s: steps %v, want %v", rec, ns, wantAll)
		}
		g, _ := getBody(t, srv, "/recordings/"+rec+"/export?format=gif")
		if anim, err := gif.DecodeAll(bytes.NewReader(g)); err != nil || len(anim.Image) != wantSteps[id]+1 {
			t.Errorf("gif of %s: %v", rec, err)
		}
		if h, _ := getBody(t, srv, "/recordings/"+rec+"/export?format=html"); bytes.Count(h, []byte(`src="data:image/`)) != wantSteps[id]+1 {
			t.Errorf("html of %s: %d images, want %d", rec, bytes.Count(h, []byte(`src="data:image/`)), wantSteps[id]+1)
		}
		if pq, _ := getBody(t, srv, "/recordings/"+rec+"/export?format=parquet"); !bytes.HasPrefix(pq, []byte("PAR1")) {
			t.Errorf("parquet of %s", rec)
		}
		if _, ct := getBody(t, srv, "/recordings/"+rec+"/steps/0/screenshot"); !strings.HasPrefix(ct, "image/") {
			t.Errorf("branch %s step 0 screenshot: %s", rec, ct)
		}
	}

	// The parent's recording stays while branches continue it.
	d := call(t, srv, "DELETE", "/recordings/"+recs[parent], nil)
	if d.status != 409 || !strings.Contains(string(d.raw), recs[ids[0]]) {
		t.Errorf("delete of a parent recording: %d %s", d.status, d.raw)
	}
	for _, id := range ids {
		want(t, call(t, srv, "DELETE", "/recordings/"+recs[id], nil), 200)
	}
	want(t, call(t, srv, "DELETE", "/recordings/"+recs[parent], nil), 200)
	want(t, call(t, srv, "GET", "/recordings/"+recs[parent], nil), 404)
}

// Bad forks are refused with their class and make nothing: no sandbox,
// no episode.
func TestEpisodeForkBadInput(t *testing.T) {
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	loadShop(t, srv)
	e := call(t, srv, "POST", "/episodes", map[string]any{"task_id": "search-dom", "max_steps": 10, "record": false})
	want(t, e, 200)
	running := e.body["episode_id"].(string)
	d := call(t, srv, "POST", "/episodes", map[string]any{"task_id": "search-dom", "max_steps": 10, "record": false})
	want(t, d, 200)
	finished := d.body["episode_id"].(string)
	want(t, call(t, srv, "POST", "/episodes/"+finished+"/finish", map[string]any{}), 200)
	count := func() (int, int) {
		s := call(t, srv, "GET", "/sandboxes", nil)
		l := call(t, srv, "GET", "/episodes", nil)
		live := 0
		for _, sb := range s.body["sandboxes"].([]any) {
			if st := sb.(map[string]any)["status"]; st != "deleted" && st != "terminated" {
				live++
			}
		}
		return live, len(l.body["episodes"].([]any))
	}
	sb0, ep0 := count()
	cases := []struct {
		name     string
		id       string
		body     any
		status   int
		category string
	}{
		{"unknown episode", "nosuchepisode", map[string]any{"count": 2}, 404, "not_found"},
		{"finished episode", finished, map[string]any{"count": 2}, 409, "conflict"},
		{"count 0", running, map[string]any{"count": 0}, 422, "invalid_request"},
		{"no count", running, map[string]any{}, 422, "invalid_request"},
		{"count over the cap", running, map[string]any{"count": 1000}, 422, "invalid_request"},
		{"negative count", running, map[string]any{"count": -1}, 422, "invalid_request"},
		{"not JSON", running, "{", 422, "invalid_request"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := call(t, srv, "POST", "/episodes/"+c.id+"/fork", c.body)
			cat := ""
			if e, _ := r.body["error"].(map[string]any); e != nil {
				cat, _ = e["category"].(string)
			}
			if r.status != c.status || cat != c.category {
				t.Errorf("status %d category %q, want %d %q: %s", r.status, cat, c.status, c.category, r.raw)
			}
		})
	}
	if sb, ep := count(); sb != sb0 || ep != ep0 {
		t.Errorf("refused forks made something: %d sandboxes, %d episodes; before %d, %d", sb, ep, sb0, ep0)
	}
	// The episode refused forks is untouched and still steps.
	r := call(t, srv, "POST", "/episodes/"+running+"/step", map[string]any{"action": searchSteps[0]})
	want(t, r, 200)
	if g := call(t, srv, "GET", "/episodes/"+running, nil); g.body["steps"] != 1.0 || g.body["parent"] != nil {
		t.Errorf("episode after refused forks: %s", g.raw)
	}
	tr := call(t, srv, "GET", "/episodes/"+running+"/tree", nil)
	want(t, tr, 200)
	if nodes := tr.body["episodes"].([]any); tr.body["root"] != running || len(nodes) != 1 || len(nodes[0].(map[string]any)["children"].([]any)) != 0 {
		t.Errorf("tree after refused forks: %s", tr.raw)
	}
	want(t, call(t, srv, "GET", "/episodes/nosuchepisode/tree", nil), 404)
}

// A fork one of whose branches cannot be made makes none: the branches
// made are taken back (their sandboxes, stored state and recordings),
// the error is the failed branch's, and the parent goes on.
func TestEpisodeForkDropsBranches(t *testing.T) {
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	loadBundled(t, srv)
	e := call(t, srv, "POST", "/episodes", map[string]any{"task_id": sites.SuiteName + "/shop-add-two-bottles", "max_steps": 10})
	want(t, e, 200)
	id := e.body["episode_id"].(string)
	live := func() (n int) {
		for _, sb := range call(t, srv, "GET", "/sandboxes", nil).body["sandboxes"].([]any) {
			if st := sb.(map[string]any)["status"]; st != "deleted" && st != "terminated" {
				n++
			}
		}
		return n
	}
	sb0, ep0, rec0 := live(), len(call(t, srv, "GET", "/episodes", nil).body["episodes"].([]any)), len(call(t, srv, "GET", "/recordings", nil).body["recordings"].([]any))
	t.Cleanup(failpoint.Enable("server.episode.fork.branch", failpoint.Return(
		faults.New(faults.CodeCapacity, faults.Capacity, faults.Platform, "no room (failpoint)")).Times(1)))
	r := call(t, srv, "POST", "/episodes/"+id+"/fork", map[string]any{"count": 3})
	if e, _ := r.body["error"].(map[string]any); r.status != 503 || e == nil || e["code"] != faults.CodeCapacity {
		t.Fatalf("fork with a failing branch: %d %s", r.status, r.raw)
	}
	if sb, ep, rec := live(), len(call(t, srv, "GET", "/episodes", nil).body["episodes"].([]any)), len(call(t, srv, "GET", "/recordings", nil).body["recordings"].([]any)); sb != sb0 || ep != ep0 || rec != rec0 {
		t.Errorf("a failed fork left %d sandboxes, %d episodes, %d recordings; before %d, %d, %d", sb, ep, rec, sb0, ep0, rec0)
	}
	if tr := call(t, srv, "GET", "/episodes/"+id+"/tree", nil); len(tr.body["episodes"].([]any)) != 1 {
		t.Errorf("tree after a failed fork: %s", tr.raw)
	}
	want(t, call(t, srv, "POST", "/episodes/"+id+"/step", map[string]any{"action": map[string]any{"type": "wait", "ms": 1}}), 200)
	f := call(t, srv, "POST", "/episodes/"+id+"/fork", map[string]any{"count": 1})
	want(t, f, 200)
	if b := f.body["branches"].([]any); len(b) != 1 {
		t.Errorf("fork after a failed one: %s", f.raw)
	}
}
