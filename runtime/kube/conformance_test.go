package kube

import (
	"context"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/kubetest"
	"github.com/orchard/orchard/runtime"
	"github.com/orchard/orchard/runtime/runtimetest"
)

// The runtime conformance suite, on the real node of scripts/kube.sh up
// --node: pods from the locally built shell image, agents reached over the
// pod network.
func TestConformanceOnNode(t *testing.T) {
	shell, agentImage := kubetest.Node(t)
	cs := kubetest.Client(t)
	ns := kubetest.Namespace(t, cs)
	runtimetest.Run(t, func(t *testing.T) runtime.Runtime {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r, err := New(ctx, cs, Config{Namespace: ns, AgentImage: agentImage, Images: map[string]string{"shell": shell}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}, runtimetest.Options{Image: shell, Concurrency: 5})
}
