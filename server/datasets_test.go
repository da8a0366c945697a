package server_test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/dataset"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/recordings"
	"github.com/orchard/orchard/server"
)

// POST /datasets answers the built folder as a tar: the shards, card and
// manifest of a gui build, or an Online-Mind2Web folder per task; it
// takes the API key like every route, and a body past its bound is 413.
func TestDatasetsREST(t *testing.T) {
	dir := t.TempDir()
	st, err := recordings.NewStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range []string{recordings.OutcomeSuccess, recordings.OutcomeFailure, recordings.OutcomeEnvError} {
		w, err := st.Create(recordings.Manifest{ID: fmt.Sprintf("r%d", i), TaskID: fmt.Sprintf("t%d", i), Suite: "s", Kind: "browser",
			Question: "q", CreatedAt: time.Now().UTC().Add(time.Duration(i) * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Append(recordings.Step{N: 0, URL: "http://x.test/"}, []byte("\x89PNG fake"), "png"); err != nil {
			t.Fatal(err)
		}
		if err := w.Finish(func(m *recordings.Manifest) { m.Outcome = o }); err != nil {
			t.Fatal(err)
		}
	}
	srv := testserver.Start(t, testserver.Options{Server: server.Config{RecordingsDir: dir}})

	post := func(key, body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/datasets", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	untar := func(resp *http.Response) map[string][]byte {
		t.Helper()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-tar" {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("%d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
		files := map[string][]byte{}
		tr := tar.NewReader(resp.Body)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				return files
			}
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(tr)
			files[h.Name] = b
		}
	}

	files := untar(post(srv.APIKey, `{"layout":"gui","select":{"suite":"s"}}`))
	for _, name := range []string{"README.md", "manifest.json", "data/train-00000-of-00001.parquet"} {
		if _, ok := files[name]; !ok {
			t.Errorf("no %s in %v", name, keys(files))
		}
	}
	var man dataset.Manifest
	if err := json.Unmarshal(files["manifest.json"], &man); err != nil || man.Included != 2 || man.Excluded["env_error"] != 1 {
		t.Errorf("manifest %+v: %v", man, err)
	}
	if _, err := dataset.ParseCard(files["README.md"]); err != nil {
		t.Error(err)
	}

	files = untar(post(srv.APIKey, `{"layout":"mind2web","select":{"outcomes":["success"]}}`))
	if !bytes.Equal(files["t0/trajectory/0_screenshot.png"], []byte("\x89PNG fake")) || files["t0/result.json"] == nil || len(files) != 5 {
		t.Errorf("mind2web files %v", keys(files))
	}

	for _, c := range []struct {
		key, body string
		status    int
	}{
		{"", `{}`, http.StatusUnauthorized},
		{srv.APIKey, `{"layout":"csv"}`, http.StatusBadRequest},
		{srv.APIKey, `{"select":{"task_ids":["none"]}}`, http.StatusBadRequest},
		{srv.APIKey, `{"name":"` + strings.Repeat("x", 2<<20) + `"}`, http.StatusRequestEntityTooLarge},
	} {
		if resp := post(c.key, c.body); resp.StatusCode != c.status {
			b, _ := io.ReadAll(resp.Body)
			t.Errorf("%.40s: %d, want %d: %s", c.body, resp.StatusCode, c.status, b)
		}
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Episodes run on the server, then built: the recordings carry their
// suite, so a build selects them by it; the gui rows hold the episodes'
// screenshots.
func TestDatasetsFromEpisodes(t *testing.T) {
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	task := `{"id":"t%d","question":"Say %d","start_url":"file:///workspace/p.html","setup":{"files":[{"path":"/workspace/p.html","content":"<title>P</title>%d"}],"sandbox":{"block_network":true,"browser":{"viewport":{"width":320,"height":240}}}},"eval":{"type":"answer_match","references":["%d"]}}`
	var suite strings.Builder
	for i := range 3 {
		fmt.Fprintf(&suite, task+"\n", i, i, i, i)
	}
	// And two shell tasks: one the policy solves, one it does not.
	shell := `{"id":"s%d","question":"Make /workspace/t.sh pass.","setup":{"files":[{"path":"/workspace/t.sh","content":"test -e /workspace/ok\n"}],"sandbox":{"kind":"shell","block_network":true}},"eval":{"type":"exec","command":"sh {test}","fail_to_pass":["/workspace/t.sh"]}}`
	for i := range 2 {
		fmt.Fprintf(&suite, shell+"\n", i)
	}
	if r := call(t, srv, "POST", "/tasks?suite=mini&name=mini.jsonl", suite.String()); r.status != 200 {
		t.Fatalf("load suite: %d %s", r.status, r.raw)
	}
	for i := range 3 {
		r := call(t, srv, "POST", "/episodes", map[string]any{"task_id": fmt.Sprintf("mini/t%d", i)})
		if r.status != 200 {
			t.Fatalf("start: %d %s", r.status, r.raw)
		}
		id := r.body["episode_id"].(string)
		if r := call(t, srv, "POST", "/episodes/"+id+"/step", map[string]any{"action": map[string]any{"type": "wait", "ms": 10}}); r.status != 200 {
			t.Fatalf("step: %d %s", r.status, r.raw)
		}
		answer := fmt.Sprint(i)
		if i == 2 {
			answer = "wrong"
		}
		if r := call(t, srv, "POST", "/episodes/"+id+"/finish", map[string]any{"answer": answer}); r.status != 200 {
			t.Fatalf("finish: %d %s", r.status, r.raw)
		}
	}
	for i := range 2 {
		r := call(t, srv, "POST", "/episodes", map[string]any{"task_id": fmt.Sprintf("mini/s%d", i)})
		if r.status != 200 {
			t.Fatalf("start shell: %d %s", r.status, r.raw)
		}
		id := r.body["episode_id"].(string)
		actions := []map[string]any{{"type": "exec", "command": "sh /workspace/t.sh"}}
		if i == 0 {
			actions = append(actions, map[string]any{"type": "write_file", "path": "/workspace/ok", "content": "yes"})
		}
		for _, a := range actions {
			if r := call(t, srv, "POST", "/episodes/"+id+"/step", map[string]any{"action": a}); r.status != 200 {
				t.Fatalf("shell step: %d %s", r.status, r.raw)
			}
		}
		if r := call(t, srv, "POST", "/episodes/"+id+"/finish", nil); r.status != 200 {
			t.Fatalf("finish shell: %d %s", r.status, r.raw)
		}
	}
	build := func(body string) (map[string][]byte, dataset.Manifest) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/datasets", strings.NewReader(body))
		req.Header.Set("X-API-Key", srv.APIKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		files := map[string][]byte{}
		tr := tar.NewReader(resp.Body)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name], _ = io.ReadAll(tr)
		}
		var man dataset.Manifest
		if err := json.Unmarshal(files["manifest.json"], &man); err != nil {
			t.Fatal(err)
		}
		return files, man
	}

	// The shell layout takes the shell episodes of the mixed run, resolved
	// or not, and leaves the browser ones out as of another kind.
	shellFiles, sman := build(`{"select":{"suite":"mini"},"layout":"shell","splits":{"test_percent":50}}`)
	if sman.Included != 2 || sman.Outcomes["success"] != 1 || sman.Outcomes["failure"] != 1 || sman.Excluded[dataset.ReasonKind] != 3 {
		t.Fatalf("shell manifest: included %d outcomes %v excluded %v", sman.Included, sman.Outcomes, sman.Excluded)
	}
	for _, e := range sman.Recordings {
		if e.Kind != "shell" || e.Steps < 2 {
			t.Errorf("shell recording %+v", e)
		}
	}
	if !strings.Contains(string(shellFiles["README.md"]), "resolved") {
		t.Errorf("shell card without the resolved feature:\n%s", shellFiles["README.md"])
	}

	files, man := build(`{"select":{"suite":"mini"},"splits":{"test_percent":50}}`)
	if man.Included != 3 || man.Outcomes["success"] != 2 || man.Outcomes["failure"] != 1 || man.Excluded[dataset.ReasonKind] != 2 {
		t.Fatalf("manifest: included %d outcomes %v excluded %v", man.Included, man.Outcomes, man.Excluded)
	}
	for _, e := range man.Recordings {
		if e.Kind != "browser" || e.Steps != 2 {
			t.Errorf("recording %+v", e)
		}
	}
	shards := 0
	for name, b := range files {
		if strings.HasPrefix(name, "data/") && strings.HasSuffix(name, ".parquet") {
			shards++
			if !bytes.HasPrefix(b, []byte("PAR1")) {
				t.Errorf("%s is not Parquet", name)
			}
		}
	}
	if shards == 0 {
		t.Errorf("no shards in %v", keys(files))
	}
}
