package sites

import (
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/orchard/orchard/tasks"
)

// refs are the href, src and action attributes of a page or of the
// markup its scripts build (where quotes are escaped): the links a visitor
// can follow and the resources the page loads.
var refs = regexp.MustCompile(`(?:href|src|action)=\\?"([^"\\]*)\\?"`)

// Every page of every site answers 200 with the right content type, and
// every link and resource of the static pages resolves — a crawl from the
// index, no browser needed.
func TestHandlerCrawl(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()
	base, _ := url.Parse(srv.URL + "/")
	seen, linked := map[string]bool{}, map[string]bool{}
	// Every file is fetched, reached by a link or not.
	queue := []string{base.String()}
	_ = fs.WalkDir(webFS, "web", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			queue = append(queue, srv.URL+strings.TrimPrefix(p, "web"))
		}
		return err
	})
	for len(queue) > 0 {
		u := queue[0]
		queue = queue[1:]
		if seen[u] {
			continue
		}
		seen[u] = true
		res, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Errorf("GET %s: %d", u, res.StatusCode)
			continue
		}
		if res.Header.Get(Header) == "" {
			t.Errorf("GET %s: no %s header", u, Header)
		}
		ct := res.Header.Get("Content-Type")
		if !strings.HasPrefix(ct, "text/html") && !strings.HasPrefix(ct, "text/javascript") {
			continue
		}
		page, _ := url.Parse(u)
		for _, m := range refs.FindAllSubmatch(body, -1) {
			ref := string(m[1])
			// Links built in scripts ("..." + id) are checked by the
			// scripted suite in a real browser.
			if strings.ContainsAny(ref, `"'+`) || ref == "" {
				continue
			}
			next, err := page.Parse(ref)
			if err != nil {
				t.Errorf("%s: bad link %q", u, ref)
				continue
			}
			if next.Host != base.Host {
				t.Errorf("%s: external link %q", u, ref)
				continue
			}
			next.Fragment = ""
			linked[next.String()] = true
			queue = append(queue, next.String())
		}
	}
	for _, want := range []string{"/shop/", "/wiki/", "/travel/", "/recipes/", "/shop/search.html", "/wiki/article.html?id=morning-gull", "/travel/trips.html", "/recipes/saved.html"} {
		if !linked[srv.URL+want] {
			t.Errorf("crawl did not reach %s", want)
		}
	}
	t.Logf("crawled %d URLs", len(seen))
}

// Each kind of file has its content type; unknown paths and listings of
// directories without an index are 404; writes are refused.
func TestHandlerContentTypes(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()
	cases := []struct {
		path, ct string
		status   int
	}{
		{"/", "text/html", 200},
		{"/shop/", "text/html", 200},
		{"/shop/product.html?id=1", "text/html", 200},
		{"/common/base.css", "text/css", 200},
		{"/shop/shop.js", "text/javascript", 200},
		{"/shop/data/products.json", "application/json", 200},
		{"/wiki/data/articles.json", "application/json", 200},
		{"/travel/data/airports.json", "application/json", 200},
		{"/recipes/data/recipes.json", "application/json", 200},
		{"/shop/data/", "", 404},
		{"/common/", "", 404},
		{"/nope.html", "", 404},
	}
	for _, c := range cases {
		res, err := http.Get(srv.URL + c.path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != c.status || !strings.HasPrefix(res.Header.Get("Content-Type"), c.ct) {
			t.Errorf("GET %s: %d %q, want %d %q", c.path, res.StatusCode, res.Header.Get("Content-Type"), c.status, c.ct)
		}
	}
	res, err := http.Post(srv.URL+"/shop/", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", res.StatusCode)
	}
}

// No file reaches outside the sandbox: no absolute http(s) URL, no
// protocol-relative URL, no web font or CDN.
func TestNoExternalURLs(t *testing.T) {
	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}|@import|@font-face|url\(\s*['"]?(https?:)?//`)
	err := fs.WalkDir(webFS, "web", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := webFS.ReadFile(p)
		if err != nil {
			return err
		}
		if m := external.Find(b); m != nil {
			t.Errorf("%s refers outside the sandbox: %q", p, m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The data the pages link to by id exists: every wiki link names an
// article, and the JSON files decode.
func TestSiteData(t *testing.T) {
	var articles []struct {
		ID      string `json:"id"`
		Summary string `json:"summary"`
	}
	read := func(p string, v any) {
		b, err := webFS.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
	read("web/wiki/data/articles.json", &articles)
	ids := map[string]bool{}
	for _, a := range articles {
		ids[a.ID] = true
	}
	raw, _ := webFS.ReadFile("web/wiki/data/articles.json")
	for _, m := range regexp.MustCompile(`\[\[([a-z0-9-]+)\|`).FindAllSubmatch(raw, -1) {
		if !ids[string(m[1])] {
			t.Errorf("wiki link to missing article %s", m[1])
		}
	}
	var products, recipes, airports []map[string]any
	read("web/shop/data/products.json", &products)
	read("web/recipes/data/recipes.json", &recipes)
	read("web/travel/data/airports.json", &airports)
	if len(products) < 40 || len(articles) < 25 || len(recipes) < 25 || len(airports) < 5 {
		t.Errorf("%d products, %d articles, %d recipes, %d airports", len(products), len(articles), len(recipes), len(airports))
	}
}

// The suite parses, is big and mixed enough, every task runs offline
// against the sites, and scripts and tasks match one to one.
func TestSuite(t *testing.T) {
	ts, err := Suite()
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) < 30 {
		t.Errorf("%d tasks, want at least 30", len(ts))
	}
	if err := tasks.NewRegistry().Add(SuiteName, ts); err != nil {
		t.Fatal(err)
	}
	perSite, perEval := map[string]int{}, map[string]int{}
	all, err := scripts()
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range ts {
		if task.Suite != SuiteName {
			t.Errorf("%s: suite %q", task.ID, task.Suite)
		}
		site, _, _ := strings.Cut(strings.TrimPrefix(task.StartURL, "http://127.0.0.1:8100/"), "/")
		perSite[site]++
		perEval[task.Eval.Type]++
		if task.Setup == nil || len(task.Setup.Exec) != 1 || task.Setup.Exec[0] != "/.orchard/bin/orchard-agent sites --addr 127.0.0.1:8100" {
			t.Errorf("%s: setup does not start the sites", task.ID)
		}
		var sb struct {
			BlockNetwork bool `json:"block_network"`
		}
		if task.Setup != nil {
			_ = json.Unmarshal(task.Setup.Sandbox, &sb)
		}
		if !sb.BlockNetwork {
			t.Errorf("%s: network not blocked", task.ID)
		}
		steps, ok := Script(task.ID)
		if !ok || len(steps) == 0 {
			t.Errorf("%s: no script", task.ID)
			continue
		}
		if max := task.MaxSteps; max == 0 && len(steps) > 30 || max > 0 && len(steps) > max {
			t.Errorf("%s: %d scripted steps exceed max_steps %d", task.ID, len(steps), max)
		}
		for i, raw := range steps {
			var a map[string]any
			if err := json.Unmarshal(raw, &a); err != nil {
				t.Errorf("%s step %d: %v", task.ID, i, err)
				continue
			}
			switch a["type"] {
			case "navigate", "new_tab":
				t.Errorf("%s step %d: %v — reach pages by clicking", task.ID, i, a["type"])
			case "answer":
				if i != len(steps)-1 {
					t.Errorf("%s step %d: answer before the last step", task.ID, i)
				}
			}
		}
		last := map[string]any{}
		_ = json.Unmarshal(steps[len(steps)-1], &last)
		if (task.Eval.Type == tasks.EvalAnswerMatch) != (last["type"] == "answer") {
			t.Errorf("%s: %s eval, script ends with %v", task.ID, task.Eval.Type, last["type"])
		}
	}
	for id := range all {
		found := false
		for _, task := range ts {
			found = found || task.ID == id
		}
		if !found {
			t.Errorf("script %s has no task", id)
		}
	}
	for _, s := range []string{"shop", "wiki", "travel", "recipes"} {
		if perSite[s] < 5 {
			t.Errorf("site %s has %d tasks", s, perSite[s])
		}
	}
	for _, e := range []string{tasks.EvalAnswerMatch, tasks.EvalURLMatch, tasks.EvalDOMMatch, tasks.EvalJS} {
		if perEval[e] == 0 {
			t.Errorf("no %s task", e)
		}
	}
	if _, ok := Script("no-such-task"); ok {
		t.Error("Script of an unknown task")
	}
}
