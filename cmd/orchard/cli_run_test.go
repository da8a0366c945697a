package main

import (
	"bytes"
	"encoding/json"
	"image/gif"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/runner"
	"github.com/orchard/orchard/sites"
)

// tinyTask is a task file of one task: a page written into the sandbox.
const tinyTask = `{"id":"tiny","question":"What is the secret word?","start_url":"file:///workspace/tiny.html",` +
	`"setup":{"files":[{"path":"/workspace/tiny.html","content":"<html><title>Tiny</title><p id=w>orchard</p></html>"}],"sandbox":{"block_network":true}},` +
	`"eval":{"type":"answer_match","references":["orchard"]}}
`

// `orchard run --in-process` starts its own server, uploads the task file,
// runs it with the scripts given, prints the table and writes the JSON
// and the HTML report.
func TestRunInProcess(t *testing.T) {
	testenv.RequireChromium(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "tiny.jsonl")
	scripts := filepath.Join(dir, "scripts.json")
	out := filepath.Join(dir, "summary.json")
	if err := os.WriteFile(file, []byte(tinyTask), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(scripts, []byte(`{"tiny":[{"type":"answer","text":"orchard"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	c := &cli{t: t, env: map[string]string{"ORCHARD_AGENT": testenv.AgentBinary(t)}}
	stdout, stderr, err := c.run("", "run", file, "--in-process", "--policy", "scripted", "--scripts", scripts, "--json", out)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr)
	}
	if !strings.Contains(stdout, "tiny  success  1") || !strings.Contains(stdout, "success rate 100.0%") {
		t.Errorf("stdout:\n%s", stdout)
	}
	if !strings.Contains(stderr, "embedded server on http://127.0.0.1:") || !strings.Contains(stderr, "1/1 done: 1 success") {
		t.Errorf("stderr:\n%s", stderr)
	}
	var s runner.Summary
	b, _ := os.ReadFile(out)
	if err := json.Unmarshal(b, &s); err != nil || s.Success != 1 || len(s.Tasks) != 1 || s.Tasks[0].TaskID != "tiny" {
		t.Errorf("summary JSON: %v\n%s", err, b)
	}
	// The HTML report beside it.
	if page, err := os.ReadFile(filepath.Join(dir, "summary.html")); err != nil || !strings.Contains(string(page), `data-task="tiny"`) {
		t.Errorf("report: %v", err)
	}
}

// `orchard run` against a server: the bundled suite, a suite name the
// server does not have, and a bad policy.
func TestRunAgainstServer(t *testing.T) {
	testenv.RequireChromium(t)
	c := newCLI(t)
	stdout := c.mustRun("run", "bundled", "--concurrency", "2", "--limit", "3")
	if !strings.Contains(stdout, "3 tasks: 3 success") || !strings.Contains(stdout, "success rate 100.0%") {
		t.Errorf("bundled run:\n%s", stdout)
	}
	// Once loaded, the bundled suite runs by name like any other.
	if _, stderr, err := c.run("", "run", "nope"); err == nil || !strings.Contains(err.Error(), `suite "nope" is not loaded`) {
		t.Errorf("unknown suite: %v %s", err, stderr)
	}
	if _, _, err := c.run("", "run", "bundled", "--policy", "smart"); err == nil || !strings.Contains(err.Error(), "--policy") {
		t.Errorf("bad policy: %v", err)
	}
}

// `orchard demo` runs the bundled tasks on its own server and leaves an
// HTML replay with the screenshots inlined, and a GIF, per task.
func TestDemo(t *testing.T) {
	testenv.RequireChromium(t)
	dir := filepath.Join(t.TempDir(), "demo")
	c := &cli{t: t, env: map[string]string{"ORCHARD_AGENT": testenv.AgentBinary(t)}}
	stdout, stderr, err := c.run("", "demo", "--tasks", "1", "--out", dir)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, stderr)
	}
	suite, err := sites.Suite()
	if err != nil {
		t.Fatal(err)
	}
	first := suite[0].ID
	html := filepath.Join(dir, first+".html")
	if !strings.Contains(stdout, html) || !strings.Contains(stdout, "success rate 100.0%") {
		t.Errorf("stdout:\n%s", stdout)
	}
	page, err := os.ReadFile(html)
	if err != nil || !bytes.Contains(page, []byte(`src="data:image/`)) {
		t.Errorf("replay %s: %v, embeds an image: %v", html, err, bytes.Contains(page, []byte("data:image/")))
	}
	g, err := os.ReadFile(filepath.Join(dir, first+".gif"))
	if err != nil {
		t.Fatal(err)
	}
	if anim, err := gif.DecodeAll(bytes.NewReader(g)); err != nil || len(anim.Image) < 2 {
		t.Errorf("gif: %v", err)
	}
}

// `orchard run swe --attempts 2` runs shell episodes of the SWE suite on
// its own server, scores pass@1 and pass@2 in the table and the JSON.
func TestRunSWEAttempts(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "summary.json")
	c := &cli{t: t, env: map[string]string{"ORCHARD_AGENT": testenv.AgentBinary(t)}}
	stdout, stderr, err := c.run("", "run", "--suite", "swe", "--in-process", "--tasks", "py-clamp,c-gcd", "--attempts", "2", "--json", out)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr)
	}
	if !strings.Contains(stdout, "pass@1 1.000, pass@2 1.000 over 2 attempts per task") || !strings.Contains(stdout, "PASS@2") {
		t.Errorf("stdout:\n%s", stdout)
	}
	var s struct {
		Attempts int                `json:"attempts"`
		PassAtK  map[string]float64 `json:"pass_at_k"`
		Tasks    []struct {
			TaskID  string             `json:"task_id"`
			PassAtK map[string]float64 `json:"pass_at_k"`
			Scored  int                `json:"scored"`
		} `json:"tasks"`
	}
	b, _ := os.ReadFile(out)
	if err := json.Unmarshal(b, &s); err != nil || s.Attempts != 2 || s.PassAtK["pass@1"] != 1 || s.PassAtK["pass@2"] != 1 || len(s.Tasks) != 2 {
		t.Fatalf("summary JSON: %v\n%s", err, b)
	}
	for _, tr := range s.Tasks {
		if tr.Scored != 2 || tr.PassAtK["pass@2"] != 1 {
			t.Errorf("task %s: %+v", tr.TaskID, tr)
		}
	}
	if _, _, err := c.run("", "run", "swe", "--in-process", "--attempts", "0"); err == nil || !strings.Contains(err.Error(), "--attempts") {
		t.Errorf("--attempts 0: %v", err)
	}
	if _, _, err := c.run("", "run", "swe", "--suite", "bundled"); err == nil || !strings.Contains(err.Error(), "two suites") {
		t.Errorf("two suites: %v", err)
	}
	if _, _, err := c.run("", "run"); err == nil || !strings.Contains(err.Error(), "no suite") {
		t.Errorf("no suite: %v", err)
	}
}

// `orchard demo --suite swe` runs shell tasks and leaves an HTML replay and
// a GIF of text frames per task.
func TestDemoSWE(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "demo")
	c := &cli{t: t, env: map[string]string{"ORCHARD_AGENT": testenv.AgentBinary(t)}}
	stdout, stderr, err := c.run("", "demo", "--suite", "swe", "--tasks", "2", "--out", dir)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, stderr)
	}
	if !strings.Contains(stdout, "2 tasks: 2 success") {
		t.Errorf("stdout:\n%s", stdout)
	}
	gifs, _ := filepath.Glob(filepath.Join(dir, "*.gif"))
	htmls, _ := filepath.Glob(filepath.Join(dir, "*.html"))
	if len(gifs) != 2 || len(htmls) != 2 {
		t.Fatalf("replays: %v %v", gifs, htmls)
	}
	g, err := os.ReadFile(gifs[0])
	if err != nil {
		t.Fatal(err)
	}
	if anim, err := gif.DecodeAll(bytes.NewReader(g)); err != nil || len(anim.Image) != 4 {
		t.Errorf("gif: %v", err)
	}
	if _, _, err := c.run("", "demo", "--suite", "nope"); err == nil || !strings.Contains(err.Error(), "--suite") {
		t.Errorf("--suite nope: %v", err)
	}
}
