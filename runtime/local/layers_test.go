package local

import (
	"slices"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/runtime"
)

// TestSaveLayer: a saved layer holds the sandbox's changes as the sandbox
// saw them (new files, changed and deleted host files, the workspace),
// sandboxes started from it see them and diverge without seeing each
// other's writes, layers stack (a snapshot of a branch), and the source
// goes on unharmed.
func TestSaveLayer(t *testing.T) {
	l := newLocal(t)
	ctx := ctxTimeout(t, 2*time.Minute)
	create(t, l, runtime.Spec{ID: "src"})
	mustExec(t, l, "src", `echo one > /workspace/f && mkdir -p /opt/snap/d && echo deep > /opt/snap/d/g &&
		head -c 3000000 /dev/urandom > /workspace/big && ln /workspace/f /workspace/hard &&
		rm /etc/debian_version && echo changed > /etc/hostname.orchard && chmod 0600 /workspace/f &&
		touch /tmp/.X99-lock /tmp/kept /run/daemon.sock.tabs && mkdir /run/daemon.sock.profile && touch /run/daemon.sock.profile/x`)
	sum := mustExec(t, l, "src", "md5sum /workspace/big")

	ly, err := l.SaveLayer(ctx, "src", "l1", runtime.LayerOptions{Meta: []byte(`{"k":1}`), Exclude: []string{"/tmp/.X*-lock", "/run/daemon.sock*"}})
	if err != nil {
		t.Fatalf("SaveLayer: %v", err)
	}
	if ly.Name != "l1" || ly.Source != "src" || len(ly.Parents) != 0 || string(ly.Meta) != `{"k":1}` || ly.Bytes < 3000000 {
		t.Errorf("layer = %+v", ly)
	}
	// The source runs on (it was thawed) and writes on its own.
	mustExec(t, l, "src", "echo after > /workspace/later && echo src-two > /workspace/f")

	create(t, l, runtime.Spec{ID: "b1", Layers: []string{"l1"}})
	create(t, l, runtime.Spec{ID: "b2", Layers: []string{"l1"}})
	for _, id := range []string{"b1", "b2"} {
		got := mustExec(t, l, id, `cat /workspace/f /opt/snap/d/g; stat -c %a /workspace/f; test -e /etc/debian_version && echo has-debian;
			test -e /workspace/later && echo has-later; stat -c %h /workspace/hard; ls -A /tmp; ls /run | grep -c daemon; md5sum /workspace/big`)
		want := "one\ndeep\n600\n2\nkept\n0\n" + sum
		if got != want {
			t.Errorf("%s sees:\n%s\nwant:\n%s", id, got, want)
		}
	}
	mustExec(t, l, "b1", "echo b1 > /workspace/f && echo x > /workspace/only-b1")
	if got := mustExec(t, l, "b2", "cat /workspace/f; test -e /workspace/only-b1 && echo leaked; true"); got != "one\n" {
		t.Errorf("b2 sees b1's writes: %q", got)
	}
	if got := mustExec(t, l, "src", "cat /workspace/f"); got != "src-two\n" {
		t.Errorf("src sees %q", got)
	}

	// A layer of a branch holds only the branch's own changes and names
	// the layer below it.
	ly2, err := l.SaveLayer(ctx, "b1", "l2", runtime.LayerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ly2.Parents, []string{"l1"}) || ly2.Bytes >= 3000000 {
		t.Errorf("layer of a branch = %+v; want parents [l1] and less than the big file", ly2)
	}
	create(t, l, runtime.Spec{ID: "c", Layers: []string{"l2", "l1"}})
	if got := mustExec(t, l, "c", "cat /workspace/f /workspace/only-b1 /opt/snap/d/g"); got != "b1\nx\ndeep\n" {
		t.Errorf("c sees %q", got)
	}
}

// TestLayerLifecycle: a layer is kept while released only as long as a
// sandbox stacks it or another layer lies on it, survives a new Local on
// the same state directory, and bad input leaves nothing.
func TestLayerLifecycle(t *testing.T) {
	l := newLocal(t)
	ctx := ctxTimeout(t, 2*time.Minute)
	create(t, l, runtime.Spec{ID: "src"})
	mustExec(t, l, "src", "head -c 2000000 /dev/zero > /workspace/z && echo v > /workspace/v")

	if _, err := l.SaveLayer(ctx, "src", "small", runtime.LayerOptions{MaxBytes: 1 << 20}); !faults.Is(err, faults.CodeSnapshotTooLarge) {
		t.Errorf("SaveLayer over the cap = %v; want %s", err, faults.CodeSnapshotTooLarge)
	}
	if _, err := l.SaveLayer(ctx, "nope", "x", runtime.LayerOptions{}); !faults.Is(err, faults.CodeSandboxNotFound) {
		t.Errorf("SaveLayer of an unknown sandbox = %v; want %s", err, faults.CodeSandboxNotFound)
	}
	if _, err := l.SaveLayer(ctx, "src", "../x", runtime.LayerOptions{}); !faults.Is(err, faults.CodeValidation) {
		t.Errorf("SaveLayer with a bad name = %v; want %s", err, faults.CodeValidation)
	}
	// A paused sandbox stays paused.
	if err := l.Pause(ctx, "src"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.SaveLayer(ctx, "src", "base", runtime.LayerOptions{}); err != nil {
		t.Fatal(err)
	}
	if st, _ := l.sandboxes["src"].container.Status(); st.String() != "paused" {
		t.Errorf("after SaveLayer of a paused sandbox: %s", st)
	}
	if err := l.Resume(ctx, "src"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.SaveLayer(ctx, "src", "base", runtime.LayerOptions{}); err == nil {
		t.Error("SaveLayer over an existing layer succeeded")
	}
	names := func(l *Local) []string {
		all, err := l.Layers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, ly := range all {
			out = append(out, ly.Name)
		}
		slices.Sort(out)
		return out
	}
	if got := names(l); !slices.Equal(got, []string{"base"}) {
		t.Fatalf("Layers = %v; want [base] (nothing left by the failed saves)", got)
	}
	if _, err := l.Create(ctx, runtime.Spec{ID: "bad", Layers: []string{"missing"}}); !faults.Is(err, faults.CodeSnapshotNotFound) {
		t.Errorf("Create from a missing layer = %v; want %s", err, faults.CodeSnapshotNotFound)
	}

	create(t, l, runtime.Spec{ID: "br", Layers: []string{"base"}})
	mustExec(t, l, "br", "echo w > /workspace/w")
	if _, err := l.SaveLayer(ctx, "br", "top", runtime.LayerOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := l.ReleaseLayer(ctx, "base"); err != nil {
		t.Fatal(err)
	}
	if removed, err := l.PruneLayers(ctx); err != nil || len(removed) != 0 {
		t.Errorf("Prune while br stacks base = %v, %v; want nothing removed", removed, err)
	}
	if err := l.Delete(ctx, "br"); err != nil {
		t.Fatal(err)
	}
	if removed, err := l.PruneLayers(ctx); err != nil || len(removed) != 0 {
		t.Errorf("Prune while top lies on base = %v, %v; want nothing removed", removed, err)
	}

	// A new Local on the state directory finds the layers and starts from them.
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2, err := New(l.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l2.Close() })
	if got := names(l2); !slices.Equal(got, []string{"base", "top"}) {
		t.Errorf("Layers after restart = %v; want [base top]", got)
	}
	create(t, l2, runtime.Spec{ID: "again", Layers: []string{"top", "base"}})
	if got := mustExec(t, l2, "again", "cat /workspace/v /workspace/w"); got != "v\nw\n" {
		t.Errorf("after restart the layers give %q", got)
	}
	if err := l2.Delete(ctx, "again"); err != nil {
		t.Fatal(err)
	}
	if err := l2.ReleaseLayer(ctx, "top"); err != nil {
		t.Fatal(err)
	}
	removed, err := l2.PruneLayers(ctx)
	slices.Sort(removed)
	if err != nil || !slices.Equal(removed, []string{"base", "top"}) {
		t.Errorf("Prune once unused = %v, %v; want [base top]", removed, err)
	}
	if got := names(l2); len(got) != 0 {
		t.Errorf("Layers after prune = %v", got)
	}
	if err := l2.Delete(ctx, "src"); err != nil {
		t.Fatal(err)
	}
	if err := l2.Close(); err != nil {
		t.Fatal(err)
	}
	if mounted(l2.layers.dir) {
		t.Error("layers filesystem still mounted after the last Local closed with no sandbox")
	}
}

func mustExec(t *testing.T, l *Local, id, script string) string {
	t.Helper()
	out, code := l.execForTest(t, id, "sh", "-c", script)
	if code != 0 {
		t.Fatalf("%s: exit %d: %s", id, code, out)
	}
	return out
}
