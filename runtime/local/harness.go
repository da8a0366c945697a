package local

import (
	"fmt"
	"strings"

	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/harness"
	"github.com/orchard/orchard/runtime"
)

var _ runtime.HarnessLister = (*Local)(nil)

// Harnesses lists the harnesses of the store's current generation.
func (l *Local) Harnesses() ([]string, error) {
	if l.cfg.HarnessDir == "" {
		return nil, nil
	}
	hs, err := (&harness.Store{Dir: l.cfg.HarnessDir}).List()
	if err != nil {
		return nil, err
	}
	names := make([]string, len(hs))
	for i, h := range hs {
		names[i] = h.Name
	}
	return names, nil
}

// harnessMount is the store's current generation bound read-only at
// harness.MountPath: one copy on the host for every sandbox, nothing
// copied per sandbox. A sandbox keeps the generation it started with.
func (l *Local) harnessMount(spec runtime.Spec) (*configs.Mount, error) {
	if len(spec.Harnesses) == 0 {
		return nil, nil
	}
	if l.cfg.HarnessDir == "" {
		return nil, fmt.Errorf("harnesses %s: this server has no harness store", strings.Join(spec.Harnesses, ", "))
	}
	gen, err := (&harness.Store{Dir: l.cfg.HarnessDir}).Current()
	if err != nil {
		return nil, err
	}
	if gen == "" {
		return nil, fmt.Errorf("harnesses %s: the harness store is empty", strings.Join(spec.Harnesses, ", "))
	}
	return &configs.Mount{Source: gen, Destination: harness.MountPath, Device: "bind",
		Flags: unix.MS_BIND | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV}, nil
}

// withHarnessPath adds the harnesses' bin folders to env's PATH and sets
// harness.PathEnv, which login shells use to add them again after their
// profile has set PATH.
func withHarnessPath(env []string, names []string) []string {
	if len(names) == 0 {
		return env
	}
	dirs := harness.SearchPath(names)
	for i, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			env[i] = "PATH=" + v + ":" + dirs
		}
	}
	return append(env, harness.PathEnv+"="+dirs)
}
