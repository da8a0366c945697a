package faults

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/faults.md from the registry")

// declared holds the constants the package's sources declare, read with
// go/parser so that the test sees what the compiler sees, not what the
// registry claims.
type declared struct {
	codes      map[string]string // constant name → code
	categories map[Category]bool
	sources    map[Source]bool
}

func parseDeclared(t *testing.T) declared {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	d := declared{codes: map[string]string{}, categories: map[Category]bool{}, sources: map[Source]bool{}}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				typ := ""
				if id, ok := vs.Type.(*ast.Ident); ok {
					typ = id.Name
				}
				for i, id := range vs.Names {
					isCode := strings.HasPrefix(id.Name, "Code")
					if !isCode && typ != "Category" && typ != "Source" {
						continue
					}
					if i >= len(vs.Values) {
						t.Fatalf("%s: %s has no value of its own", fset.Position(id.Pos()), id.Name)
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						t.Fatalf("%s: %s is not a string literal; the registry test reads literals only", fset.Position(id.Pos()), id.Name)
					}
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					switch {
					case typ == "Category":
						d.categories[Category(v)] = true
					case typ == "Source":
						d.sources[Source(v)] = true
					default:
						d.codes[id.Name] = v
					}
				}
			}
		}
	}
	if len(d.codes) == 0 || len(d.categories) == 0 || len(d.sources) == 0 {
		t.Fatalf("parsed %d codes, %d categories, %d sources: the parser missed the declarations", len(d.codes), len(d.categories), len(d.sources))
	}
	return d
}

func TestRegistryCoversEveryCode(t *testing.T) {
	d := parseDeclared(t)
	inRegistry := map[string]int{}
	for _, c := range registry {
		inRegistry[c.Code]++
	}
	inSource := map[string]string{}
	for name, code := range d.codes {
		if other, dup := inSource[code]; dup {
			t.Errorf("%s and %s are both %q", name, other, code)
		}
		inSource[code] = name
		if inRegistry[code] == 0 {
			t.Errorf("%s (%q) is missing from the registry in registry.go", name, code)
		}
	}
	for code, n := range inRegistry {
		if n > 1 {
			t.Errorf("%q is in the registry %d times", code, n)
		}
		if _, ok := inSource[code]; !ok {
			t.Errorf("the registry lists %q, which no Code constant declares", code)
		}
	}
}

var codeFormat = regexp.MustCompile(`^[a-z]+\.[a-z0-9_]+$`)

func TestRegistryEntries(t *testing.T) {
	d := parseDeclared(t)
	for _, c := range registry {
		if !codeFormat.MatchString(c.Code) {
			t.Errorf("%q is not of the form segment.name", c.Code)
		}
		if !d.categories[c.Category] {
			t.Errorf("%s: unknown category %q", c.Code, c.Category)
		}
		if !d.sources[c.Source] {
			t.Errorf("%s: unknown source %q", c.Code, c.Source)
		}
		if c.Doc == "" || !strings.HasSuffix(c.Doc, ".") || strings.ToUpper(c.Doc[:1]) != c.Doc[:1] {
			t.Errorf("%s: Doc %q is not a sentence", c.Code, c.Doc)
		}
		// The policy must not be able to turn its own failure into an
		// episode nobody learns from, and the environment's failures must
		// never be scored against the policy.
		switch c.Source {
		case Policy, Client:
			if c.EnvError {
				t.Errorf("%s: source %s, yet env_error", c.Code, c.Source)
			}
		case Sandbox, Platform, Network, Desktop, Task:
			if !c.EnvError {
				t.Errorf("%s: source %s, yet not env_error", c.Code, c.Source)
			}
		}
	}
}

// subjectNotSource lists codes whose first segment names a source but whose
// source is another: the segment names what the code is about.
var subjectNotSource = map[string]string{
	CodeSandboxNotFound: "the caller named a sandbox that does not exist",
	CodeSandboxExists:   "the caller asked for an id that is taken",
	CodeSandboxNotReady: "the caller used a sandbox before it was ready",
	CodeSandboxPaused:   "the caller used a sandbox it had paused",
	CodeSandboxGone:     "the caller deleted the sandbox the work ran in",
	CodeExecTimeout:     "the command that outran its own timeout was the caller's choice",
}

func TestCodeSegmentNamesSource(t *testing.T) {
	d := parseDeclared(t)
	for _, c := range registry {
		seg, _, _ := strings.Cut(c.Code, ".")
		if !d.sources[Source(seg)] {
			continue
		}
		why, excepted := subjectNotSource[c.Code]
		switch {
		case Source(seg) != c.Source && !excepted:
			t.Errorf("%s has source %s; its first segment names source %s", c.Code, c.Source, seg)
		case Source(seg) == c.Source && excepted:
			t.Errorf("%s is listed in subjectNotSource (%s) but its source is %s", c.Code, why, seg)
		}
	}
	for code := range subjectNotSource {
		if _, ok := Lookup(code); !ok {
			t.Errorf("subjectNotSource lists unknown code %q", code)
		}
	}
}

func TestLookup(t *testing.T) {
	cases := []struct {
		code      string
		ok        bool
		cat       Category
		retryable bool
		envError  bool
	}{
		{"site.http_500", true, Unavailable, true, true},
		{"site.http_503", true, Unavailable, true, true},
		{"site.http_599", true, Unavailable, true, true},
		{"site.http_429", true, Unavailable, true, true},
		{"site.http_400", true, ActionFailed, false, false},
		{"site.http_404", true, ActionFailed, false, false},
		{"site.http_451", true, ActionFailed, false, false},
		{CodeSiteHTTPPrefix, true, ActionFailed, false, false},
		{CodeBrowserCrashed, true, Unavailable, true, true},
		{CodeActionNoSuchElement, true, ActionFailed, false, false},
		{CodeNavigationInvalidURL, true, InvalidRequest, false, false},
		{"site.http_200", false, "", false, false},
		{"site.http_302", false, "", false, false},
		{"site.http_600", false, "", false, false},
		{"site.http_5030", false, "", false, false},
		{"site.http_50", false, "", false, false},
		{"site.http_abc", false, "", false, false},
		{"site.http_+50", false, "", false, false},
		{"site.http_-50", false, "", false, false},
		{"SITE.HTTP_503", false, "", false, false},
		{"site.nonexistent", false, "", false, false},
		{"", false, "", false, false},
	}
	for _, tc := range cases {
		t.Run(tc.code, func(t *testing.T) {
			t.Parallel()
			c, ok := Lookup(tc.code)
			if ok != tc.ok {
				t.Fatalf("Lookup(%q) ok = %v, want %v", tc.code, ok, tc.ok)
			}
			if !ok {
				return
			}
			if c.Code != tc.code || c.Category != tc.cat || c.Retryable != tc.retryable || c.EnvError != tc.envError {
				t.Fatalf("Lookup(%q) = %+v, want category %s, retryable %v, env_error %v", tc.code, c, tc.cat, tc.retryable, tc.envError)
			}
			if c.Doc == "" {
				t.Fatal("no Doc")
			}
		})
	}
	for _, c := range Codes() {
		if got, ok := Lookup(c.Code); !ok || got != c {
			t.Errorf("Lookup(%q) = %+v, %v; want the registry entry", c.Code, got, ok)
		}
	}
}

// The family entry's class agrees with what the browser produces for an
// HTTP error and with the truth a fault plan records for one.
func TestSiteHTTPFamilyAgreesWithTruth(t *testing.T) {
	for _, status := range []int{400, 403, 404, 429, 500, 502, 503, 504} {
		truth := TruthOf(Injection{Kind: InjectHTTPStatus, Status: status})
		c, ok := Lookup(truth.Code)
		if !ok {
			t.Fatalf("Lookup(%q) failed", truth.Code)
		}
		if c.Source != truth.Source {
			t.Errorf("%s: registry source %s, truth source %s", truth.Code, c.Source, truth.Source)
		}
	}
}

// Faults a plan injects are the environment's by construction: an episode
// that meets one must end env_error, and the registry must agree with the
// source the truth records.
func TestInjectedFaultsAreEnvErrors(t *testing.T) {
	for _, kind := range InjectKinds() {
		f := Injection{Kind: kind, Status: 503}
		truth := TruthOf(f)
		c, ok := Lookup(truth.Code)
		if !ok {
			t.Errorf("%s: truth code %q is not in the registry", kind, truth.Code)
			continue
		}
		if !c.EnvError {
			t.Errorf("%s: %s is not env_error", kind, truth.Code)
		}
		if c.Source != truth.Source {
			t.Errorf("%s: registry source %s, truth source %s", kind, c.Source, truth.Source)
		}
	}
}

func TestCodesReturnsACopy(t *testing.T) {
	cs := Codes()
	cs[0].Code = "changed.by_caller"
	if registry[0].Code == "changed.by_caller" {
		t.Fatal("Codes exposes the registry")
	}
}

const docPath = "../docs/faults.md"

func TestFaultsDoc(t *testing.T) {
	got := renderDoc()
	if *update {
		if err := os.WriteFile(docPath, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatalf("%v (create it: go test ./faults -run TestFaultsDoc -update)", err)
	}
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := 0; i < max(len(gl), len(wl)); i++ {
			var g, w string
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Fatalf("docs/faults.md is stale at line %d:\n have: %s\n want: %s\nrun: go test ./faults -run TestFaultsDoc -update", i+1, w, g)
			}
		}
	}
}

const docIntro = `# Fault codes

<!-- Generated from faults/registry.go by ` + "`go test ./faults -run TestFaultsDoc -update`" + `. Do not edit by hand. -->

Every failure in Orchard is attributed with three fields. The **category**
says what happened (` + "`not_found`, `unavailable`, `timeout`" + `, ...) and sets
the HTTP status. The **source** says who is responsible: the policy, the
site, the network, the browser or desktop, the sandbox, the platform, the
task, or the API client. The **code** is a stable identifier for the
specific failure (` + "`site.http_503`, `browser.crashed`" + `); codes are API and
are added, never renamed. The code that first sees a failure classifies it;
the class survives wrapping and crosses process boundaries in the ` + "`error`" + `
object of every error body. A code's first segment names its source where
the source is fixed; the table gives the source a code usually carries, and
a producer that knows better may name another, which then wins.

Episodes end ` + "`success`, `failure` or `env_error`" + `. A fault marked
env_error is the environment's: the episode is re-queued and never learned
from. Every other fault that ends an episode is the policy's own failure (a
missing element, an invalid URL, a 404) and is kept as training signal.
Client errors are bugs in the caller, not episode outcomes. Retryable says
whether the same request may succeed if sent again.

| code | category | source | retryable | env_error | meaning |
|---|---|---|---|---|---|
`

func renderDoc() []byte {
	var b bytes.Buffer
	b.WriteString(docIntro)
	row := func(code string, c CodeInfo, doc string) {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n",
			code, c.Category, c.Source, yesNo(c.Retryable), yesNo(c.EnvError), strings.ReplaceAll(doc, "|", `\|`))
	}
	cs := Codes()
	slices.SortFunc(cs, func(a, b CodeInfo) int { return strings.Compare(a.Code, b.Code) })
	for _, c := range cs {
		if c.Code != CodeSiteHTTPPrefix {
			row("`"+c.Code+"`", c, c.Doc)
			continue
		}
		s, _ := Lookup(CodeSiteHTTPPrefix + "503")
		row("`site.http_<status>` (5xx, 429)", s, "The main document answered with a server error or 429: a transient fault of the site.")
		s, _ = Lookup(CodeSiteHTTPPrefix + "404")
		row("`site.http_<status>` (other 4xx)", s, "The main document answered with another client error: the site's answer to what the policy asked.")
	}
	return b.Bytes()
}

func yesNo(v bool) string {
	if v {
		return "yes"
	}
	return "no"
}
