package desktop

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The package runs inside sandboxes, in the agent: it must build without
// cgo and must not pull in the control plane's libraries.
func TestDependencies(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,CgoFiles", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list with CGO_ENABLED=0: %v", err)
	}
	forbidden := []string{"github.com/gin-gonic/", "k8s.io/client-go", "github.com/redis/go-redis", "github.com/opencontainers/runc"}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p struct {
			ImportPath string
			CgoFiles   []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		for _, f := range forbidden {
			if strings.HasPrefix(p.ImportPath, f) {
				t.Errorf("desktop depends on %s", p.ImportPath)
			}
		}
		if len(p.CgoFiles) > 0 {
			t.Errorf("%s needs cgo", p.ImportPath)
		}
	}
}
