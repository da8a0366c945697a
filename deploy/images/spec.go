package main

import (
	"fmt"
	"sort"
)

// Spec is one image: what goes in and how it runs. The builder reads it to
// assemble the root filesystem and the config; the test that keeps
// Dockerfile.<Name> equivalent reads the same table.
type Spec struct {
	Name string
	// Title is org.opencontainers.image.title's text.
	Title string
	// Essential adds Debian's Essential: yes set (and mawk for awk) to
	// Packages: the userland of debian:bookworm-slim, which the Dockerfile
	// starts from, except apt, which no sandbox needs to run.
	Essential bool
	// Packages are installed with their Depends and Pre-Depends closure
	// (no Recommends), as `apt-get install --no-install-recommends` does.
	Packages []string
	// DataPackages contribute their files alone, without dependencies:
	// ca-certificates and tzdata are data whose dependencies (openssl,
	// debconf) serve only their maintainer scripts.
	DataPackages []string
	// Binaries are built from this module and put at their Path.
	Binaries []Binary
	// User is the config's user ("" = root).
	User       string
	Entrypoint []string
	Cmd        []string
	// Env is added to the config after PATH.
	Env []string
	// Ports are exposed ("8080/tcp").
	Ports []string
	// Dirs are created empty, owned by User, so a non-root process has a
	// place to write its state.
	Dirs []string
}

// Binary is a Go program of this module built into the image.
type Binary struct {
	Path    string // in the image
	Package string // ./cmd/...
	// CGO builds with cgo (the server: libcontainer's nsenter needs it);
	// otherwise CGO_ENABLED=0 gives a static binary.
	CGO bool
	// LDFlagsVersion passes -X main.version=<git describe>.
	LDFlagsVersion bool
}

// essential is bookworm's Essential: yes set plus mawk (Priority:
// required, the awk that scripts expect): `dpkg-query -W -f '${Package}
// ${Essential}\n'` on a bookworm system lists the same names.
var essential = []string{
	"base-files", "base-passwd", "bash", "bsdutils", "coreutils", "dash",
	"debianutils", "diffutils", "dpkg", "findutils", "grep", "gzip",
	"hostname", "init-system-helpers", "libc-bin", "login", "mawk",
	"ncurses-base", "ncurses-bin", "perl-base", "sed", "sysvinit-utils",
	"tar", "util-linux",
}

// nonroot is the uid and gid of the server image's user, as distroless's
// "nonroot": a fixed number so that Kubernetes' runAsNonRoot can check it
// without a passwd lookup.
const nonroot = 65532

// fonts are the browser's and the desktop's: Latin metrics-compatible
// faces (pages laid out for Arial or Times), a wide-coverage fallback, and
// colour emoji.
var fonts = []string{"fonts-dejavu-core", "fonts-liberation", "fonts-noto-color-emoji"}

// specs are the images the builder knows, by name.
var specs = []Spec{
	{
		Name:  "orchard-server",
		Title: "Orchard server",
		// The server links libcontainer, which needs cgo: glibc is its one
		// shared library.
		Packages:     []string{"libc6"},
		DataPackages: []string{"ca-certificates", "tzdata"},
		Binaries:     []Binary{{Path: "/usr/local/bin/orchard", Package: "./cmd/orchard", CGO: true, LDFlagsVersion: true}},
		User:         "65532:65532",
		Entrypoint:   []string{"/usr/local/bin/orchard", "serve"},
		Env:          []string{"ORCHARD_RUNTIME=kube", "ORCHARD_ADDR=0.0.0.0:8080", "ORCHARD_STATE_DIR=/var/lib/orchard"},
		Ports:        []string{"8080/tcp"},
		Dirs:         []string{"/var/lib/orchard"},
	},
	{
		// An init container runs `/orchard-agent install /shared/orchard-agent`
		// (runtime/kube/pod.go): the agent copies itself, so the image
		// holds nothing else.
		Name:       "orchard-agent",
		Title:      "Orchard agent",
		Binaries:   []Binary{{Path: "/orchard-agent", Package: "./cmd/orchard-agent"}},
		Entrypoint: []string{"/orchard-agent"},
	},
	{
		Name:      "orchard-shell",
		Title:     "Orchard shell sandbox",
		Essential: true,
		Packages:  []string{"bash", "ca-certificates", "coreutils", "git", "python3"},
		Cmd:       []string{"/bin/bash"},
	},
	{
		Name:      "orchard-browser",
		Title:     "Orchard browser sandbox",
		Essential: true,
		Packages:  append([]string{"ca-certificates", "chromium"}, fonts...),
		Cmd:       []string{"/bin/bash"},
	},
	{
		// openbox is the window manager desktop/session.go starts when it
		// finds one.
		Name:      "orchard-desktop",
		Title:     "Orchard desktop sandbox",
		Essential: true,
		Packages:  append([]string{"ca-certificates", "chromium", "openbox", "x11vnc", "xterm", "xvfb"}, fonts...),
		Cmd:       []string{"/bin/bash"},
	},
}

// lookup returns the spec named name.
func lookup(name string) (Spec, error) {
	for _, s := range specs {
		if s.Name == name {
			return s, nil
		}
	}
	names := make([]string, 0, len(specs))
	for _, s := range specs {
		names = append(names, s.Name)
	}
	sort.Strings(names)
	return Spec{}, fmt.Errorf("unknown image %q (known: %v)", name, names)
}

// seeds are the packages whose closure the image installs.
func (s Spec) seeds() []string {
	var out []string
	if s.Essential {
		out = append(out, essential...)
	}
	return append(out, s.Packages...)
}

// defaultPath is the config's PATH: Debian's default for root.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
