package kube

import (
	"testing"
	"time"

	"github.com/orchard/orchard/runtime"
)

// activeDeadlineSeconds is the sandbox's TTL, or the server's default TTL
// when the create names none, plus the grace; no pod is left without a
// deadline while the server has a default.
func TestPodDeadline(t *testing.T) {
	for _, tc := range []struct {
		name       string
		ttl        int
		defaultTTL time.Duration
		want       int64 // 0: no deadline
	}{
		{"the sandbox's ttl", 60, 2 * time.Hour, 60 + 300},
		{"the server's default", 0, 2 * time.Hour, 7200 + 300},
		{"neither", 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{AgentImage: "agent:1", Images: map[string]string{"shell": "shell:1"}, DefaultTTL: tc.defaultTTL}
			if err := cfg.defaults(); err != nil {
				t.Fatal(err)
			}
			r := &Runtime{cfg: cfg, key: []byte("k")}
			pod, err := r.podFor(runtime.Spec{ID: "ttl1", Kind: "shell", TTLSeconds: tc.ttl})
			if err != nil {
				t.Fatal(err)
			}
			switch d := pod.Spec.ActiveDeadlineSeconds; {
			case tc.want == 0 && d != nil:
				t.Errorf("activeDeadlineSeconds %d, want none", *d)
			case tc.want != 0 && (d == nil || *d != tc.want):
				t.Errorf("activeDeadlineSeconds %v, want %d", d, tc.want)
			}
		})
	}
}
