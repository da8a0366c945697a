package runner

import (
	"context"
	"testing"

	"github.com/orchard/orchard/client"
	"github.com/orchard/orchard/sites"
	"github.com/orchard/orchard/tasks"
)

// bundled loads the bundled suite on the server, as orchard run does, and
// returns its tasks.
func bundled(t testing.TB, c *client.Client) []tasks.Task {
	t.Helper()
	if _, err := c.LoadTasks(context.Background(), sites.SuiteName, "suite.jsonl", sites.SuiteJSONL()); err != nil {
		t.Fatal(err)
	}
	ts, err := sites.Suite()
	if err != nil {
		t.Fatal(err)
	}
	for i := range ts {
		ts[i].Suite = sites.SuiteName
	}
	return ts
}
