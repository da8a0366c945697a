// Package deptest enforces the project's dependency rules and conventions
// with tests, so they cannot erode silently.
package deptest

import (
	"encoding/json"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

type pkg struct {
	ImportPath string
	Dir        string
	Name       string
	Deps       []string
	Imports    []string
	GoFiles    []string
	CgoFiles   []string
}

func goList(t *testing.T, env []string, args ...string) []pkg {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = moduleRoot(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func moduleRoot(t *testing.T) string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

const mod = "github.com/orchard/orchard/"

// Libraries the sandbox-side packages must never pull in: they run inside
// every sandbox and must stay small, static and free of the control plane.
var forbiddenInAgent = []string{"github.com/gin-gonic/", "k8s.io/client-go", "github.com/redis/go-redis", "github.com/opencontainers/runc"}

func TestAgentSideDependencies(t *testing.T) {
	for _, p := range goList(t, []string{"CGO_ENABLED=0"}, mod+"agent", mod+"cmd/orchard-agent") {
		for _, d := range p.Deps {
			for _, f := range forbiddenInAgent {
				if strings.HasPrefix(d, f) {
					t.Errorf("%s depends on %s", p.ImportPath, d)
				}
			}
		}
	}
}

// What runs inside sandboxes the server must not link: the browser and
// desktop drivers (and their CDP, X11 and imaging libraries) and the
// agent's server; the server reaches agents through agentclient.
var forbiddenInServer = []string{"github.com/chromedp/", "github.com/jezek/xgb", "github.com/disintegration/imaging",
	mod + "browser", mod + "desktop", mod + "agent"}

func TestServerSideDependencies(t *testing.T) {
	for _, p := range goList(t, nil, mod+"cmd/orchard", mod+"server", mod+"server/manager", mod+"agentclient") {
		if len(p.Deps) == 0 {
			t.Fatalf("%s: go list gave no dependencies", p.ImportPath)
		}
		for _, d := range p.Deps {
			for _, f := range forbiddenInServer {
				if d == f || strings.HasPrefix(d, f) && (strings.HasSuffix(f, "/") || strings.HasPrefix(d[len(f):], "/")) {
					t.Errorf("%s depends on %s", p.ImportPath, d)
				}
			}
		}
	}
}

func TestAgentBuildsWithoutCgo(t *testing.T) {
	cmd := exec.Command("go", "build", "-o", os.DevNull, "./cmd/orchard-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Dir = moduleRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 build of the agent: %v\n%s", err, out)
	}
}

func TestBottomPackagesUseOnlyStdlib(t *testing.T) {
	for _, p := range goList(t, nil, mod+"faults", mod+"api") {
		for _, d := range p.Deps {
			if strings.Contains(strings.Split(d, "/")[0], ".") && !strings.HasPrefix(d, mod+"faults") {
				t.Errorf("%s imports %s; faults and api must import only the standard library", p.ImportPath, d)
			}
		}
	}
}

// The episode engine is the server's rules without its transport: no
// HTTP framework, no server package, no concrete store (the caller passes
// one) and no HTTP of its own.
var forbiddenInEpisodes = []string{"github.com/gin-gonic/", mod + "server", mod + "store/memory", mod + "store/redis",
	"github.com/redis/go-redis", mod + "runtime"}

func TestEpisodesDependencies(t *testing.T) {
	for _, p := range goList(t, nil, mod+"episodes") {
		if len(p.Deps) == 0 {
			t.Fatalf("%s: go list gave no dependencies", p.ImportPath)
		}
		for _, d := range p.Deps {
			for _, f := range forbiddenInEpisodes {
				if strings.HasPrefix(d, f) {
					t.Errorf("%s depends on %s", p.ImportPath, d)
				}
			}
		}
		for _, i := range p.Imports {
			if i == "net/http" || strings.HasPrefix(i, "net/http/") {
				t.Errorf("%s imports %s; HTTP is the server's", p.ImportPath, i)
			}
		}
	}
}

// internal/ holds two levels. Its leaf libraries (failpoint, chromium,
// jsonstream, ordered, ...) sit below everything else: they may import
// faults and api and each other, nothing of the module above them. The
// test harnesses under internal/testing sit above everything: they start
// servers, runtimes and agents, so only tests may import them.
const harnesses = mod + "internal/testing/"

// leafMayImport are the module packages a leaf under internal/ may
// depend on besides other leaves.
var leafMayImport = []string{mod + "faults", mod + "api"}

func TestInternalLeavesImportNothingAbove(t *testing.T) {
	pkgs := goList(t, nil, "./internal/...")
	leaves := 0
	for _, p := range pkgs {
		if !strings.HasPrefix(p.ImportPath, mod+"internal/") || strings.HasPrefix(p.ImportPath, harnesses) ||
			p.ImportPath == mod+"internal/deptest" {
			continue
		}
		leaves++
		for _, d := range p.Deps {
			if !strings.HasPrefix(d, mod) || (strings.HasPrefix(d, mod+"internal/") && !strings.HasPrefix(d, harnesses)) ||
				slices.Contains(leafMayImport, d) {
				continue
			}
			t.Errorf("%s depends on %s; a leaf of internal/ may import only faults, api and other leaves", p.ImportPath, d)
		}
	}
	if leaves == 0 {
		t.Fatal("go list found no leaf package under internal/")
	}
}

func TestOnlyTestsImportTheHarnesses(t *testing.T) {
	for _, p := range goList(t, nil, "./...") {
		if strings.HasPrefix(p.ImportPath, harnesses) {
			continue // testserver builds on testenv
		}
		for _, i := range p.Imports {
			if strings.HasPrefix(i, harnesses) {
				t.Errorf("%s imports the test harness %s in a non-test file", p.ImportPath, i)
			}
		}
	}
}

func TestEveryPackageHasADocComment(t *testing.T) {
	for _, p := range goList(t, nil, "./...") {
		documented := false
		for _, f := range p.GoFiles {
			file, err := parser.ParseFile(token.NewFileSet(), filepath.Join(p.Dir, f), nil, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if file.Doc != nil && strings.TrimSpace(file.Doc.Text()) != "" {
				documented = true
				break
			}
		}
		if !documented && len(p.GoFiles) > 0 {
			t.Errorf("package %s has no doc comment", p.ImportPath)
		}
	}
}
