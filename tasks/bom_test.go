package tasks

import (
	"strings"
	"testing"
)

// Files saved with a UTF-8 byte order mark (Windows editors, pandas'
// utf-8-sig) load like any other.
func TestParseBOM(t *testing.T) {
	t.Parallel()
	line := `{"web_name": "Allrecipes", "id": "Allrecipes--0", "ques": "Q", "web": "https://www.allrecipes.com/"}`
	for name, body := range map[string]string{
		"x.jsonl": "\ufeff" + line + "\n",
		"x.json":  "\ufeff[" + line + "]",
		"x.yaml":  "\ufeff- id: a\n  question: q\n  start_url: https://a.com\n",
	} {
		ts, err := Parse(strings.NewReader(body), name)
		if err != nil || len(ts) != 1 {
			t.Errorf("%s with BOM: %d tasks, %v", name, len(ts), err)
		}
	}
}
