package main

import (
	"encoding/json"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
)

// stage is one FROM ... of a Dockerfile, as far as the builder's specs
// describe an image.
type stage struct {
	from, name       string
	apt              []string // apt-get install's packages
	goBuilds         []goBuildLine
	copies           [][2]string // --from=build source → destination
	entrypoint, cmd  []string
	user             string
	env, expose      []string
	hasEntry, hasCmd bool
}

type goBuildLine struct{ cgo, out, pkg string }

// parseDockerfile reads the instructions the specs cover; a line parser
// is enough for these files, and keeps BuildKit's out of the module.
func parseDockerfile(t *testing.T, text string) []stage {
	t.Helper()
	text = strings.ReplaceAll(text, "\\\n", " ")
	var stages []stage
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		instr, args, _ := strings.Cut(line, " ")
		instr, args = strings.ToUpper(instr), strings.TrimSpace(args)
		if instr == "FROM" {
			f := strings.Fields(args)
			s := stage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				s.name = f[2]
			}
			stages = append(stages, s)
			continue
		}
		if len(stages) == 0 {
			t.Fatalf("%s before FROM", instr)
		}
		s := &stages[len(stages)-1]
		switch instr {
		case "RUN":
			for _, cmd := range strings.Split(args, "&&") {
				f := strings.Fields(cmd)
				if i := slices.Index(f, "install"); len(f) > 0 && f[0] == "apt-get" && i > 0 {
					for _, a := range f[i+1:] {
						if !strings.HasPrefix(a, "-") {
							s.apt = append(s.apt, a)
						}
					}
				}
				if i := slices.Index(f, "go"); i >= 0 && i+1 < len(f) && f[i+1] == "build" {
					var g goBuildLine
					for j, a := range f {
						if strings.HasPrefix(a, "CGO_ENABLED=") {
							g.cgo = a
						}
						if a == "-o" && j+1 < len(f) {
							g.out = f[j+1]
						}
					}
					g.pkg = f[len(f)-1]
					s.goBuilds = append(s.goBuilds, g)
				}
			}
		case "COPY":
			f := strings.Fields(args)
			if len(f) == 3 && strings.HasPrefix(f[0], "--from=") {
				s.copies = append(s.copies, [2]string{f[1], f[2]})
			}
		case "ENTRYPOINT", "CMD":
			var v []string
			if err := json.Unmarshal([]byte(args), &v); err != nil {
				t.Fatalf("%s %s: want the exec (JSON) form: %v", instr, args, err)
			}
			if instr == "ENTRYPOINT" {
				s.entrypoint, s.hasEntry = v, true
			} else {
				s.cmd, s.hasCmd = v, true
			}
		case "USER":
			s.user = args
		case "ENV":
			if !strings.Contains(args, "=") || strings.Contains(args, " ") {
				t.Fatalf("ENV %s: want one KEY=VALUE per line", args)
			}
			s.env = append(s.env, args)
		case "EXPOSE":
			for _, p := range strings.Fields(args) {
				if !strings.Contains(p, "/") {
					p += "/tcp"
				}
				s.expose = append(s.expose, p)
			}
		}
	}
	return stages
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	sort.Strings(s)
	return s
}

// Each Dockerfile.<name> builds what the builder's spec says: the same base
// userland, apt packages, binaries, user, entry point, command,
// environment and ports. Only the final stage runs; packages count in any
// stage (the server's certificates come from one).
func TestDockerfiles(t *testing.T) {
	for _, spec := range specs {
		t.Run(spec.Name, func(t *testing.T) {
			t.Parallel()
			b, err := os.ReadFile("Dockerfile." + spec.Name)
			if err != nil {
				t.Fatal(err)
			}
			stages := parseDockerfile(t, string(b))
			final := stages[len(stages)-1]

			wantFrom := "scratch"
			if len(spec.seeds()) > 0 || len(spec.DataPackages) > 0 {
				wantFrom = "debian:bookworm-slim"
			}
			if final.from != wantFrom {
				t.Errorf("final stage FROM %s, want %s", final.from, wantFrom)
			}
			var apt []string
			byName := map[string]stage{}
			for _, s := range stages {
				apt = append(apt, s.apt...)
				byName[s.name] = s
			}
			if got, want := sorted(apt), sorted(append(slices.Clone(spec.Packages), spec.DataPackages...)); !slices.Equal(got, want) {
				t.Errorf("apt-get install %v, want %v", got, want)
			}

			// Each binary is built as the builder builds it and copied to
			// the same place.
			var built []string
			for _, c := range final.copies {
				built = append(built, c[1])
			}
			var wantBuilt []string
			for _, bin := range spec.Binaries {
				wantBuilt = append(wantBuilt, bin.Path)
				var found bool
				for _, c := range final.copies {
					if c[1] != bin.Path {
						continue
					}
					for _, s := range stages {
						for _, g := range s.goBuilds {
							wantCGO := "CGO_ENABLED=0"
							if bin.CGO {
								wantCGO = "CGO_ENABLED=1"
							}
							if g.out == c[0] && g.pkg == bin.Package && g.cgo == wantCGO {
								found = true
							}
						}
					}
				}
				if !found {
					t.Errorf("no go build of %s (%v) copied to %s", bin.Package, bin.CGO, bin.Path)
				}
			}
			if !slices.Equal(sorted(built), sorted(wantBuilt)) {
				t.Errorf("copies binaries to %v, want %v", built, wantBuilt)
			}

			if !slices.Equal(final.entrypoint, spec.Entrypoint) || final.hasEntry != (spec.Entrypoint != nil) {
				t.Errorf("ENTRYPOINT %q, want %q", final.entrypoint, spec.Entrypoint)
			}
			// Docker resets the base's CMD when ENTRYPOINT is set, as the
			// builder has none unless the spec says.
			if !slices.Equal(final.cmd, spec.Cmd) || final.hasCmd != (spec.Cmd != nil) {
				t.Errorf("CMD %q, want %q", final.cmd, spec.Cmd)
			}
			if final.user != spec.User {
				t.Errorf("USER %q, want %q", final.user, spec.User)
			}
			if !slices.Equal(final.env, spec.Env) {
				t.Errorf("ENV %q, want %q", final.env, spec.Env)
			}
			if !slices.Equal(sorted(final.expose), sorted(spec.Ports)) {
				t.Errorf("EXPOSE %q, want %q", final.expose, spec.Ports)
			}
		})
	}
}
