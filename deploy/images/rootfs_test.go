package main

import (
	"archive/tar"
	"bytes"
	"context"
	"reflect"
	"testing"
	"time"
)

func TestUsrMerge(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"bin/bash", "usr/bin/bash"},
		{"bin", "usr/bin"},
		{"sbin/ldconfig", "usr/sbin/ldconfig"},
		{"lib/x86_64-linux-gnu/libc.so.6", "usr/lib/x86_64-linux-gnu/libc.so.6"},
		{"lib64/ld-linux-x86-64.so.2", "usr/lib64/ld-linux-x86-64.so.2"},
		{"usr/bin/git", "usr/bin/git"},
		{"binaries/x", "binaries/x"},
		{"etc/bin/x", "etc/bin/x"},
	} {
		if got := usrMerge(tc.in); got != tc.want {
			t.Errorf("usrMerge(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// A package's entries land at their merged-/usr places, links still
// reach what they reached, and the layer lists hard links after their
// targets.
func TestRootfsAdd(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range []struct {
		h    tar.Header
		data string
	}{
		{tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755}, ""},
		{tar.Header{Typeflag: tar.TypeDir, Name: "./bin/", Mode: 0o755}, ""},
		{tar.Header{Typeflag: tar.TypeReg, Name: "./bin/a", Mode: 0o755, Size: 1}, "a"},
		{tar.Header{Typeflag: tar.TypeLink, Name: "./bin/hard", Linkname: "./bin/a"}, ""},
		{tar.Header{Typeflag: tar.TypeSymlink, Name: "./bin/rel", Linkname: "../usr/share/x"}, ""},
		{tar.Header{Typeflag: tar.TypeSymlink, Name: "./bin/same", Linkname: "a"}, ""},
		{tar.Header{Typeflag: tar.TypeSymlink, Name: "./sbin/up", Linkname: "../bin/a"}, ""},
		{tar.Header{Typeflag: tar.TypeSymlink, Name: "./usr/bin/abs", Linkname: "/bin/a"}, ""},
	} {
		e.h.Uname, e.h.ModTime = "builder", time.Unix(1234, 0)
		if err := tw.WriteHeader(&e.h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.data)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := newRootfs(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	list, err := r.add(tar.NewReader(&buf))
	if err != nil {
		t.Fatal(err)
	}
	wantList := []string{"/.", "/bin", "/bin/a", "/bin/hard", "/bin/rel", "/bin/same", "/sbin/up", "/usr/bin/abs"}
	if !reflect.DeepEqual(list, wantList) {
		t.Errorf("dpkg list %q, want %q", list, wantList)
	}
	links := map[string]string{}
	for p, e := range r.entries {
		if e.hdr.Linkname != "" {
			links[p] = e.hdr.Linkname
		}
	}
	wantLinks := map[string]string{
		"usr/bin/hard": "usr/bin/a",
		"usr/bin/rel":  "../share/x",
		"usr/bin/same": "a",
		"usr/sbin/up":  "../bin/a",
		"usr/bin/abs":  "/bin/a",
	}
	if !reflect.DeepEqual(links, wantLinks) {
		t.Errorf("links %v, want %v", links, wantLinks)
	}
	if b, err := r.read("/usr/sbin/up"); err != nil || string(b) != "a" {
		t.Errorf("read through links: %q, %v", b, err)
	}

	var out bytes.Buffer
	epoch := time.Unix(1700000000, 0)
	if err := r.write(context.Background(), &out, epoch); err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(&out)
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if !h.ModTime.Equal(epoch) || h.Uname != "" {
			t.Errorf("%s: mtime %v, uname %q", h.Name, h.ModTime, h.Uname)
		}
		names = append(names, h.Name)
	}
	wantNames := []string{"usr/", "usr/bin/", "usr/bin/a", "usr/bin/abs", "usr/bin/rel", "usr/bin/same", "usr/sbin/", "usr/sbin/up", "usr/bin/hard"}
	if !reflect.DeepEqual(names, wantNames) {
		t.Errorf("layer %q, want %q", names, wantNames)
	}
}

func TestParseAlternatives(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, script string
		want         []alternative
	}{
		{"mawk", "if [ \"$1\" = configure ]; then\n        update-alternatives --install /usr/bin/awk awk /usr/bin/mawk 5 \\\n          --slave /usr/share/man/man1/awk.1.gz awk.1.gz /usr/share/man/man1/mawk.1.gz\nfi\n",
			[]alternative{{link: "/usr/bin/awk", name: "awk", target: "/usr/bin/mawk", priority: 5,
				slaves: [][3]string{{"/usr/share/man/man1/awk.1.gz", "awk.1.gz", "/usr/share/man/man1/mawk.1.gz"}}}}},
		{"continued", "    update-alternatives --install /usr/bin/x-www-browser \\\n        x-www-browser /usr/bin/chromium 40\n",
			[]alternative{{link: "/usr/bin/x-www-browser", name: "x-www-browser", target: "/usr/bin/chromium", priority: 40}}},
		{"variables", "update-alternatives --install /usr/bin/$name $name /usr/lib/$name 10\n", nil},
		{"none", "#!/bin/sh\nset -e\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseAlternatives([]byte(tc.script)); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
