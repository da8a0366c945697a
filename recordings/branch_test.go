package recordings

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"image/color"
	"image/gif"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"

	"github.com/orchard/orchard/faults"
)

// chain writes a recording with steps from..to (each with its own
// screenshot, a colour per recording) under parent.
func chain(t *testing.T, s *Store, id string, parent *ParentRef, from, to int, c color.Color) [][]byte {
	t.Helper()
	w, err := s.Create(Manifest{ID: id, Kind: "browser", Question: "q", Parent: parent})
	if err != nil {
		t.Fatal(err)
	}
	var shots [][]byte
	for n := from; n <= to; n++ {
		img := testImage(t, 40+n, 30, c, "png")
		shots = append(shots, img)
		a := json.RawMessage(`{"type":"click","x":1,"y":2,"n":` + string(rune('0'+n)) + `}`)
		if n == 0 {
			a = nil
		}
		if err := w.Append(Step{N: n, Action: a, URL: "https://example.com/" + id}, img, "png"); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Finish(nil); err != nil {
		t.Fatal(err)
	}
	return shots
}

// A branch of a branch resolves to the root's first steps, the middle
// branch's next ones and its own; every export carries them all, each
// step's screenshot from the recording that holds it.
func TestResolveBranches(t *testing.T) {
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	root := chain(t, s, "root", nil, 0, 4, color.RGBA{255, 0, 0, 255})
	mid := chain(t, s, "mid", &ParentRef{RecordingID: "root", Steps: 2}, 2, 5, color.RGBA{0, 255, 0, 255})
	leaf := chain(t, s, "leaf", &ParentRef{RecordingID: "mid", Steps: 4}, 4, 6, color.RGBA{0, 0, 255, 255})

	// Open reads only the branch's own steps: what a reader that does
	// not know parents sees.
	own, err := s.Open("leaf")
	if err != nil || len(own.Steps()) != 3 || own.Steps()[0].N != 4 {
		t.Fatalf("own steps of leaf: %v %v", err, own)
	}
	r, err := s.OpenResolved("leaf")
	if err != nil {
		t.Fatal(err)
	}
	wantShots := [][]byte{root[0], root[1], mid[0], mid[1], leaf[0], leaf[1], leaf[2]}
	if len(r.Steps()) != 7 || r.Manifest().Steps != 7 || r.Manifest().ID != "leaf" || r.Manifest().Parent.RecordingID != "mid" {
		t.Fatalf("resolved leaf: %d steps, manifest %+v", len(r.Steps()), r.Manifest())
	}
	for n, st := range r.Steps() {
		if st.N != n {
			t.Errorf("resolved step %d numbered %d", n, st.N)
		}
		img, _, err := r.Image(n)
		if err != nil || !bytes.Equal(img, wantShots[n]) {
			t.Errorf("resolved step %d's screenshot: %v", n, err)
		}
	}

	var jl bytes.Buffer
	if _, err := r.Export(context.Background(), FormatJSONL, &jl); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(jl.String()), "\n")
	if len(lines) != 8 {
		t.Fatalf("jsonl export: %d lines", len(lines))
	}
	for i, l := range lines[1:] {
		var line JSONLLine
		if err := json.Unmarshal([]byte(l), &line); err != nil || line.Step.N != i || line.Image == "" {
			t.Errorf("jsonl line %d: %v %s", i+1, err, l[:min(len(l), 80)])
		}
	}
	var g bytes.Buffer
	if _, err := r.Export(context.Background(), FormatGIF, &g); err != nil {
		t.Fatal(err)
	}
	if anim, err := gif.DecodeAll(&g); err != nil || len(anim.Image) != 7 {
		t.Errorf("gif: %v", err)
	}
	var h bytes.Buffer
	if _, err := r.Export(context.Background(), FormatHTML, &h); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(h.String(), `src="data:image/`); n != 7 {
		t.Errorf("html: %d images, want 7", n)
	}
	var pq bytes.Buffer
	if _, err := r.Export(context.Background(), FormatParquet, &pq); err != nil {
		t.Fatal(err)
	}
	rows, err := parquet.Read[ParquetRow](bytes.NewReader(pq.Bytes()), int64(pq.Len()))
	if err != nil || len(rows) != 1 || len(rows[0].Images) != 7 || !bytes.Equal(rows[0].Images[0], root[0]) || !bytes.Equal(rows[0].Images[6], leaf[2]) {
		t.Errorf("parquet: %v", err)
	}
}

// Broken parent links are errors, never a partial trajectory: a missing
// parent, one that holds fewer steps than named, a loop, own steps
// before the parent's end, links deeper than the bound.
func TestResolveBrokenLinks(t *testing.T) {
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	red := color.RGBA{255, 0, 0, 255}
	chain(t, s, "root", nil, 0, 2, red)
	chain(t, s, "orphan", &ParentRef{RecordingID: "gone", Steps: 1}, 1, 2, red)
	chain(t, s, "short", &ParentRef{RecordingID: "root", Steps: 5}, 5, 6, red)
	chain(t, s, "early", &ParentRef{RecordingID: "root", Steps: 2}, 1, 3, red)
	chain(t, s, "loop-a", &ParentRef{RecordingID: "loop-b", Steps: 1}, 1, 1, red)
	chain(t, s, "loop-b", &ParentRef{RecordingID: "loop-a", Steps: 1}, 1, 1, red)
	prev, atBound := "root", ""
	for i := range maxParentDepth + 1 {
		id := "deep" + strconv.Itoa(i)
		chain(t, s, id, &ParentRef{RecordingID: prev, Steps: 1}, 1, 1, red)
		atBound, prev = prev, id
	}
	cases := []struct {
		id   string
		cat  faults.Category
		text string
	}{
		{"orphan", faults.NotFound, "gone not found"},
		{"short", faults.Internal, "holds 3 of the 5 steps"},
		{"early", faults.Internal, "own step 1 is before its parent's end"},
		{"loop-a", faults.Internal, "loop"},
		{prev, faults.Internal, "deeper than"},
	}
	for _, c := range cases {
		_, err := s.OpenResolved(c.id)
		if err == nil || faults.Of(err).Category != c.cat || !strings.Contains(err.Error(), c.text) {
			t.Errorf("resolve %s: %v (%s), want %s %q", c.id, err, faults.Of(err).Category, c.cat, c.text)
		}
	}
	if _, err := s.OpenResolved(atBound); err != nil {
		t.Errorf("a chain at the depth bound: %v", err)
	}
}

// A recording that branches continue is kept: its delete is a conflict
// naming them, until they are deleted.
func TestDeleteParentRecording(t *testing.T) {
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	red := color.RGBA{255, 0, 0, 255}
	chain(t, s, "root", nil, 0, 2, red)
	chain(t, s, "b1", &ParentRef{RecordingID: "root", Steps: 2}, 2, 3, red)
	chain(t, s, "b2", &ParentRef{RecordingID: "root", Steps: 1}, 1, 3, red)
	err = s.Delete("root")
	if f := faults.Of(err); f.Category != faults.Conflict || !strings.Contains(f.Message, "b1, b2") {
		t.Fatalf("delete of a parent: %v", err)
	}
	if _, err := s.OpenResolved("b1"); err != nil {
		t.Fatalf("branch after a refused delete: %v", err)
	}
	for _, id := range []string{"b1", "b2", "root"} {
		if err := s.Delete(id); err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
	}
	if _, err := s.Open("root"); faults.Of(err).Category != faults.NotFound {
		t.Errorf("open a deleted recording: %v", err)
	}
	if err := s.Delete("root"); faults.Of(err).Category != faults.NotFound {
		t.Errorf("delete twice: %v", err)
	}
	if left, _ := os.ReadDir(s.Root()); len(left) != 0 {
		t.Errorf("left in the store: %v", left)
	}
	if _, err := os.Stat(filepath.Join(s.Root(), "root")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("root's directory: %v", err)
	}
}
