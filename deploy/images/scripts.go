package main

import (
	"archive/tar"
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// installed is one package unpacked into a rootfs.
type installed struct {
	deb
	ctrl map[string][]byte // control, postinst, conffiles, md5sums ...
	list []string
}

// The builder runs no maintainer script: they need the image's own shell
// and tools running as root inside it. The functions below do, from the
// files the packages ship, what the scripts of the packages in these
// images do that matters to a program in the image. Each names the script
// it stands in for.

// dpkgDatabase writes /var/lib/dpkg/status and info/ as dpkg would after
// installing the packages, so `dpkg -l`, `dpkg -L` and a later `apt-get
// install` in the image see them.
func dpkgDatabase(r *rootfs, pkgs []installed) error {
	var status bytes.Buffer
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].Name < pkgs[j].Name })
	for _, p := range pkgs {
		if p.Data {
			// Only part of its job is done (no dependencies): dpkg must
			// not believe it installed.
			continue
		}
		ctrl := strings.TrimRight(string(p.ctrl["control"]), "\n")
		lines := strings.Split(ctrl, "\n")
		var b strings.Builder
		for i, l := range lines {
			b.WriteString(l + "\n")
			if i == 0 {
				b.WriteString("Status: install ok installed\n")
			}
		}
		if cf := strings.Fields(string(p.ctrl["conffiles"])); len(cf) > 0 {
			b.WriteString("Conffiles:\n")
			for _, f := range cf {
				if !strings.HasPrefix(f, "/") {
					continue // "remove-on-upgrade" and other flags
				}
				data, err := r.read(f)
				if err != nil {
					return fmt.Errorf("dpkg status: %s conffile: %w", p.Name, err)
				}
				sum := md5.Sum(data)
				fmt.Fprintf(&b, " %s %s\n", f, hex.EncodeToString(sum[:]))
			}
		}
		status.WriteString(b.String() + "\n")

		info := p.Name
		if field(p.ctrl["control"], "Multi-Arch") == "same" {
			info += ":" + field(p.ctrl["control"], "Architecture")
		}
		r.file("/var/lib/dpkg/info/"+info+".list", 0o644, 0, []byte(strings.Join(p.list, "\n")+"\n"))
		for _, f := range []string{"md5sums", "conffiles", "triggers", "shlibs", "symbols", "templates", "preinst", "postinst", "prerm", "postrm", "config"} {
			if d, ok := p.ctrl[f]; ok {
				// Kept for dpkg to run at a later upgrade or removal.
				mode := int64(0o644)
				if strings.HasSuffix(f, "inst") || strings.HasSuffix(f, "rm") || f == "config" {
					mode = 0o755
				}
				r.file("/var/lib/dpkg/info/"+info+"."+f, mode, 0, d)
			}
		}
	}
	r.file("/var/lib/dpkg/status", 0o644, 0, status.Bytes())
	// The database's layout version: 1 names a Multi-Arch: same package's
	// files name:arch.list, as written above.
	r.file("/var/lib/dpkg/info/format", 0o644, 0, []byte("1\n"))
	r.file("/var/lib/dpkg/available", 0o644, 0, nil)
	for _, d := range []string{"/var/lib/dpkg/updates", "/var/lib/dpkg/triggers", "/var/lib/dpkg/alternatives", "/var/lib/dpkg/parts"} {
		r.dir(d, 0o755, 0)
	}
	return nil
}

// field returns a control field's value.
func field(ctrl []byte, name string) string {
	for _, l := range strings.Split(string(ctrl), "\n") {
		if v, ok := strings.CutPrefix(l, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// caCertificates stands in for ca-certificates' postinst
// (update-ca-certificates): every certificate it ships enabled in
// /etc/ca-certificates.conf, a link per certificate in /etc/ssl/certs and
// their concatenation, /etc/ssl/certs/ca-certificates.crt, the bundle
// OpenSSL, GnuTLS and Go read. The OpenSSL hash links (c_rehash) are not
// made: programs that need a CApath are rare, and the bundle serves them
// as CAfile.
func caCertificates(r *rootfs) error {
	var certs []string
	for p, e := range r.entries {
		if strings.HasPrefix(p, "usr/share/ca-certificates/") && strings.HasSuffix(p, ".crt") && e.hdr.Typeflag == tar.TypeReg {
			certs = append(certs, strings.TrimPrefix(p, "usr/share/ca-certificates/"))
		}
	}
	if len(certs) == 0 {
		return nil
	}
	sort.Strings(certs)
	var bundle, conf bytes.Buffer
	conf.WriteString("# Generated at image build, as update-ca-certificates would.\n")
	for _, c := range certs {
		b, err := r.read("/usr/share/ca-certificates/" + c)
		if err != nil {
			return fmt.Errorf("ca-certificates: %w", err)
		}
		bundle.Write(b)
		if len(b) > 0 && b[len(b)-1] != '\n' {
			bundle.WriteByte('\n')
		}
		conf.WriteString(c + "\n")
		r.symlink("/etc/ssl/certs/"+strings.TrimSuffix(path.Base(c), ".crt")+".pem", "/usr/share/ca-certificates/"+c)
	}
	r.file("/etc/ssl/certs/ca-certificates.crt", 0o644, 0, bundle.Bytes())
	r.file("/etc/ca-certificates.conf", 0o644, 0, conf.Bytes())
	return nil
}

// alternative is one `update-alternatives --install` of a postinst.
type alternative struct {
	link, name, target string
	priority           int
	slaves             [][3]string // link, name, target
}

var continuation = regexp.MustCompile(`\\\n\s*`)

// parseAlternatives finds the update-alternatives --install calls of a
// postinst whose arguments are literal (a call built from shell variables
// is skipped).
func parseAlternatives(script []byte) []alternative {
	text := continuation.ReplaceAllString(string(script), " ")
	var out []alternative
	for _, line := range strings.Split(text, "\n") {
		i := strings.Index(line, "update-alternatives --install ")
		if i < 0 {
			continue
		}
		f := strings.Fields(line[i+len("update-alternatives --install "):])
		if len(f) < 4 {
			continue
		}
		prio, err := strconv.Atoi(f[3])
		if err != nil || strings.ContainsAny(f[0]+f[1]+f[2], "$`") {
			continue
		}
		a := alternative{link: f[0], name: f[1], target: f[2], priority: prio}
		for rest := f[4:]; len(rest) >= 4 && rest[0] == "--slave"; rest = rest[4:] {
			if !strings.ContainsAny(rest[1]+rest[2]+rest[3], "$`") {
				a.slaves = append(a.slaves, [3]string{rest[1], rest[2], rest[3]})
			}
		}
		out = append(out, a)
	}
	return out
}

// alternatives stands in for the update-alternatives calls of the
// postinsts (awk → mawk, which → which.debianutils, x-www-browser →
// chromium, x-terminal-emulator → xterm, ...): per name, the highest
// priority whose target the image holds wins, linked through
// /etc/alternatives as update-alternatives links it.
func alternatives(r *rootfs, pkgs []installed) {
	best := map[string]alternative{}
	var names []string
	for _, p := range pkgs {
		for _, a := range parseAlternatives(p.ctrl["postinst"]) {
			if !r.exists(a.target) {
				continue
			}
			old, ok := best[a.name]
			if !ok {
				names = append(names, a.name)
			}
			if !ok || a.priority > old.priority {
				best[a.name] = a
			}
		}
	}
	sort.Strings(names)
	for _, n := range names {
		a := best[n]
		if r.exists(a.link) {
			continue // a package ships the real file
		}
		r.symlink("/etc/alternatives/"+a.name, a.target)
		r.symlink(usrMerge(clean(a.link)), "/etc/alternatives/"+a.name)
		for _, s := range a.slaves {
			if r.exists(s[2]) && !r.exists(s[0]) {
				r.symlink("/etc/alternatives/"+s[1], s[2])
				r.symlink(usrMerge(clean(s[0])), "/etc/alternatives/"+s[1])
			}
		}
	}
}

// baseFiles stands in for base-files' postinst, which copies its
// defaults from /usr/share/base-files into /etc and /root.
func baseFiles(r *rootfs) {
	for src, dst := range map[string]string{
		"profile":       "/etc/profile",
		"nsswitch.conf": "/etc/nsswitch.conf",
		"host.conf":     "/etc/host.conf",
		"motd":          "/etc/motd",
		"dot.profile":   "/root/.profile",
		"dot.bashrc":    "/root/.bashrc",
	} {
		if b, err := r.read("/usr/share/base-files/" + src); err == nil && !r.exists(dst) {
			r.file(dst, 0o644, 0, b)
		}
	}
}

// tzdata stands in for tzdata's postinst: the zone is UTC.
func tzdata(r *rootfs) {
	if r.exists("/usr/share/zoneinfo/Etc/UTC") {
		r.symlink("/etc/localtime", "/usr/share/zoneinfo/Etc/UTC")
		r.file("/etc/timezone", 0o644, 0, []byte("Etc/UTC\n"))
	}
}

// accounts stands in for base-passwd's postinst (which copies its master
// files to /etc) and adds the nonroot user. Without base-passwd, root,
// nobody and nonroot are all the image needs.
func accounts(r *rootfs) {
	passwd, err := r.read("/usr/share/base-passwd/passwd.master")
	if err != nil {
		passwd = []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
	}
	group, err := r.read("/usr/share/base-passwd/group.master")
	if err != nil {
		group = []byte("root:x:0:\nnogroup:x:65534:\n")
	}
	passwd = append(bytes.Clone(passwd), fmt.Sprintf("nonroot:x:%d:%d:nonroot:/home/nonroot:/usr/sbin/nologin\n", nonroot, nonroot)...)
	group = append(bytes.Clone(group), fmt.Sprintf("nonroot:x:%d:\n", nonroot)...)
	r.file("/etc/passwd", 0o644, 0, passwd)
	r.file("/etc/group", 0o644, 0, group)
	r.dir("/home/nonroot", 0o700, nonroot)
}

// shells stands in for update-shells (debianutils' and bash's, dash's
// postinsts): /etc/shells lists the shells of /usr/share/debianutils and
// its shells.d, each also under /usr, as on a merged-/usr system.
func shells(r *rootfs) error {
	base, err := r.read("/usr/share/debianutils/shells")
	if err != nil {
		return nil // no debianutils: no shells to list
	}
	var d []string
	for p := range r.entries {
		if strings.HasPrefix(p, "usr/share/debianutils/shells.d/") {
			d = append(d, p)
		}
	}
	sort.Strings(d)
	lines := strings.Split(string(base), "\n")
	for _, p := range d {
		b, err := r.read(p)
		if err != nil {
			return fmt.Errorf("shells: %w", err)
		}
		lines = append(lines, strings.Split(string(b), "\n")...)
	}
	out := []string{"# /etc/shells: valid login shells"}
	seen := map[string]bool{}
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		for _, s := range []string{l, "/usr" + l} {
			if s == l || strings.HasPrefix(l, "/bin/") || strings.HasPrefix(l, "/sbin/") {
				if !seen[s] {
					seen[s] = true
					out = append(out, s)
				}
			}
		}
	}
	r.file("/etc/shells", 0o644, 0, []byte(strings.Join(out, "\n")+"\n"))
	return nil
}
