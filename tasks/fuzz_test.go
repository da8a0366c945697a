package tasks

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/orchard/orchard/faults"
)

// FuzzParse: any file is a list of valid tasks with distinct ids, or a
// task.invalid fault; nothing panics, whatever the format guessed.
func FuzzParse(f *testing.F) {
	names := []string{"suite.jsonl", "suite.yaml", "suite.json"}
	files, _ := filepath.Glob("testdata/*")
	for _, p := range files {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		for i := range names {
			f.Add(data, uint8(i))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte, kind uint8) {
		name := names[int(kind)%len(names)]
		ts, err := Parse(bytes.NewReader(data), name)
		if err != nil {
			if fe, ok := errors.AsType[*faults.Error](err); !ok || fe.Code != faults.CodeTaskInvalid {
				t.Fatalf("%s %q: %v (%T), want a task.invalid fault", name, data, err, err)
			}
			return
		}
		seen := map[string]bool{}
		for _, tk := range ts {
			if err := tk.Validate(); err != nil {
				t.Fatalf("%s %q: parsed a task that does not validate: %v", name, data, err)
			}
			if seen[tk.ID] {
				t.Fatalf("%s %q: id %q twice", name, data, tk.ID)
			}
			seen[tk.ID] = true
		}
	})
}
