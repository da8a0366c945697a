package recordings

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"unicode/utf8"
)

// Every line of the jsonl export is UTF-8 JSON (RFC 8259 §8.1), even when
// the policy's action carried invalid UTF-8 bytes inside a string.
func TestJSONLInvalidUTF8(t *testing.T) {
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Create(Manifest{ID: "utf8", Question: "q"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Append(Step{N: 1, Action: json.RawMessage("{\"type\":\"type\",\"text\":\"caf\xe9\"}"), Title: "ok"}, nil, ""); err != nil {
		t.Fatal(err)
	}
	w.Close()
	// A line written before the fix, with the bytes as they came.
	f, err := os.OpenFile(filepath.Join(s.Root(), "utf8", stepsFile), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("{\"n\":2,\"time\":\"2026-01-01T00:00:00Z\",\"result\":{\"v\":\"\xff\"}}\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	r, err := s.Open("utf8")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := r.Export(context.Background(), FormatJSONL, &buf); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(&buf)
	n := 1
	for ; sc.Scan(); n++ {
		if !utf8.Valid(sc.Bytes()) || !json.Valid(sc.Bytes()) {
			t.Errorf("jsonl line %d is not UTF-8 JSON: %q", n, sc.Bytes())
		}
	}
	if n != 4 {
		t.Errorf("%d jsonl lines, want 3", n-1)
	}
}
