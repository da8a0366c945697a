package recordings

import (
	"context"
	"encoding/json"
	"image/color"
	"strings"
	"testing"
)

// Every "<image>" of the parquet messages stands for one entry of images:
// text that merely contains "<image>" (a page title, typed text) must not
// add a placeholder without a screenshot.
func TestParquetImagePlaceholders(t *testing.T) {
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Create(Manifest{ID: "ph", Question: "What does the <image> tag do?"})
	if err != nil {
		t.Fatal(err)
	}
	steps := []Step{
		{N: 0, URL: "http://127.0.0.1:8100/wiki/", Title: "The <image> element"},
		{N: 1, Action: json.RawMessage(`{"type":"type","text":"<image>"}`), Title: "Search"},
	}
	for _, st := range steps {
		if err := w.Append(st, testImage(t, 8, 8, color.White, "png"), "png"); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Finish(func(m *Manifest) { m.Answer = "it shows an <image>"; m.Outcome = OutcomeSuccess }); err != nil {
		t.Fatal(err)
	}
	r, err := s.Open("ph")
	if err != nil {
		t.Fatal(err)
	}
	row, err := r.parquetRow(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var msgs []ChatMessage
	if err := json.Unmarshal([]byte(row.Messages), &msgs); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range msgs {
		n += strings.Count(m.Content, imagePlaceholder)
	}
	if n != len(row.Images) {
		t.Errorf("messages hold %d %q placeholders for %d images", n, imagePlaceholder, len(row.Images))
	}
}
