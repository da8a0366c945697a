// Package harness keeps the coding-agent harnesses (codex, claude,
// opencode, pi, hermes) that sandboxes can have on PATH: a store on the
// host, built from each harness's published package together with the
// runtime it needs (Node.js or Python, with the shared libraries and the
// dynamic loader they link against), so that a harness runs in any image,
// one without Node.js, Python or glibc included. The store is versioned:
// every install or removal writes a new generation, read-only, and moves
// the `current` link to it; runtimes bind-mount a generation read-only at
// MountPath, shared by every sandbox.
package harness

import (
	"fmt"
	"slices"
	"strings"
)

// MountPath is where a sandbox sees the store: each harness's launcher is
// MountPath/<name>/bin/<command>. The launchers name it, so it is the same
// for every runtime (the Kubernetes image holds a generation at this path).
const MountPath = "/.orchard/harnesses"

// PathEnv is the environment variable that carries the sandbox's harness
// bin directories (colon-separated), so that login shells, whose profile
// resets PATH, can add them again.
const PathEnv = "ORCHARD_HARNESS_PATH"

// All, in a create request, asks for every installed harness.
const All = "all"

// Manager names of Spec.Manager.
const (
	NPM = "npm"
	Pip = "pip"
)

// Spec is a harness Orchard knows how to install.
type Spec struct {
	Name    string // what requests and the CLI call it
	Package string // the published package
	Command string // the program it puts on PATH
	Manager string // NPM or Pip
}

// known is the closed set of harnesses: names are checked against it, so
// a name never becomes a path it was not meant to be.
var known = []Spec{
	{Name: "codex", Package: "@openai/codex", Command: "codex", Manager: NPM},
	{Name: "claude", Package: "@anthropic-ai/claude-code", Command: "claude", Manager: NPM},
	{Name: "opencode", Package: "opencode-ai", Command: "opencode", Manager: NPM},
	{Name: "pi", Package: "@mariozechner/pi-coding-agent", Command: "pi", Manager: NPM},
	{Name: "hermes", Package: "hermes-agent", Command: "hermes", Manager: Pip},
}

// Known returns the harness called name.
func Known(name string) (Spec, bool) {
	i := slices.IndexFunc(known, func(s Spec) bool { return s.Name == name })
	if i < 0 {
		return Spec{}, false
	}
	return known[i], true
}

// Names lists every known harness.
func Names() []string {
	out := make([]string, len(known))
	for i, s := range known {
		out[i] = s.Name
	}
	return out
}

// BinDir is the folder holding the harness's launcher, inside a sandbox.
func BinDir(name string) string { return MountPath + "/" + name + "/bin" }

// SearchPath is the PATH entries of the given harnesses, in order.
func SearchPath(names []string) string {
	dirs := make([]string, len(names))
	for i, n := range names {
		dirs[i] = BinDir(n)
	}
	return strings.Join(dirs, ":")
}

// Resolve expands a requested list against the installed harnesses:
// "all" is every installed one; any other name must be installed. The
// result is sorted and without duplicates. An error names the first name
// that is unknown or not installed.
func Resolve(asked, installed []string) ([]string, error) {
	var out []string
	for _, n := range asked {
		switch {
		case n == All:
			out = append(out, installed...)
		case !slices.Contains(Names(), n):
			return nil, fmt.Errorf("unknown harness %q (known: %s, or %q)", n, strings.Join(Names(), ", "), All)
		case !slices.Contains(installed, n):
			return nil, fmt.Errorf("harness %q is not installed on this server (installed: %s)", n, strings.Join(installed, ", "))
		default:
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
