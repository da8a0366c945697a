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
