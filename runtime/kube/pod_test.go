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

// A sandbox with harnesses mounts the harness image read-only at the
// store's path and carries their bin folders for the agent's PATH; one
// without has neither.
func TestHarnessPod(t *testing.T) {
	cfg := Config{AgentImage: "agent:1", Images: map[string]string{"shell": "shell:1"}, HarnessImage: "orchard-harnesses:1", Harnesses: []string{"claude", "codex"}}
	if err := cfg.defaults(); err != nil {
		t.Fatal(err)
	}
	r := &Runtime{cfg: cfg, key: []byte("k")}
	pod, err := r.podFor(runtime.Spec{ID: "h1", Kind: "shell", Harnesses: []string{"claude", "codex"}})
	if err != nil {
		t.Fatal(err)
	}
	var image string
	for _, v := range pod.Spec.Volumes {
		if v.Image != nil {
			image = v.Image.Reference
		}
	}
	c := pod.Spec.Containers[0]
	var mounted, path bool
	for _, m := range c.VolumeMounts {
		mounted = mounted || (m.MountPath == "/.orchard/harnesses" && m.ReadOnly)
	}
	for _, e := range c.Env {
		path = path || (e.Name == "ORCHARD_HARNESS_PATH" && e.Value == "/.orchard/harnesses/claude/bin:/.orchard/harnesses/codex/bin")
	}
	if image != "orchard-harnesses:1" || !mounted || !path {
		t.Errorf("pod with harnesses: image volume %q, read-only mount %v, ORCHARD_HARNESS_PATH %v", image, mounted, path)
	}
	plain, err := r.podFor(runtime.Spec{ID: "h2", Kind: "shell"})
	if err != nil {
		t.Fatal(err)
	}
	if len(plain.Spec.Volumes) != 1 || len(plain.Spec.Containers[0].VolumeMounts) != 1 {
		t.Errorf("pod without harnesses has volumes %+v", plain.Spec.Volumes)
	}
	if names, _ := r.Harnesses(); len(names) != 2 {
		t.Errorf("Harnesses() = %v, want the image's two", names)
	}
}
