package main

import (
	"slices"
	"strings"
	"testing"
)

// ORCHARD_MAX_CPU and ORCHARD_MAX_MEMORY are quantities as create requests
// give them; one that does not parse stops the server from starting.
func TestLoadEnvLimits(t *testing.T) {
	tests := []struct {
		env     map[string]string
		cpu     float64
		memory  int64
		wantErr string
	}{
		{env: map[string]string{}},
		{env: map[string]string{"ORCHARD_MAX_CPU": "1500m", "ORCHARD_MAX_MEMORY": "8Gi"}, cpu: 1.5, memory: 8 << 30},
		{env: map[string]string{"ORCHARD_MAX_CPU": "6", "ORCHARD_MAX_MEMORY": "1000000000"}, cpu: 6, memory: 1e9},
		{env: map[string]string{"ORCHARD_MAX_CPU": "0"}, wantErr: "ORCHARD_MAX_CPU"},
		{env: map[string]string{"ORCHARD_MAX_MEMORY": "lots"}, wantErr: "ORCHARD_MAX_MEMORY"},
	}
	for _, tt := range tests {
		getenv := func(k string) string { return tt.env[k] }
		cfg := defaultConfig(getenv)
		err := loadEnv(&cfg, getenv, func(string) bool { return false })
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%v: error %v, want one naming %s", tt.env, err, tt.wantErr)
			}
			continue
		}
		if err != nil || cfg.Manager.MaxCPU != tt.cpu || cfg.Manager.MaxMemory != tt.memory {
			t.Errorf("%v: MaxCPU %v, MaxMemory %v, err %v; want %v, %v", tt.env, cfg.Manager.MaxCPU, cfg.Manager.MaxMemory, err, tt.cpu, tt.memory)
		}
	}
}

func TestLoadEnvPathLists(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     string
		flagSet bool
		flags   []string
		want    []string
	}{
		{"unset", "", false, nil, nil},
		{"env", "/var/log/app:/home/data::", false, nil, []string{"/var/log/app", "/home/data"}},
		{"flag wins", "/var/log/app", true, []string{"/srv/x"}, []string{"/srv/x"}},
	} {
		for _, s := range []struct {
			env, flag string
			field     func(*Config) *[]string
		}{
			{"ORCHARD_HOST_EXPOSE", "host-expose", func(c *Config) *[]string { return &c.HostExpose }},
			{"ORCHARD_IMAGE_DIRS", "image-dir", func(c *Config) *[]string { return &c.ImageDirs }},
		} {
			t.Run(s.env+"/"+tc.name, func(t *testing.T) {
				env := map[string]string{s.env: tc.env}
				getenv := func(k string) string { return env[k] }
				cfg := defaultConfig(getenv)
				*s.field(&cfg) = tc.flags
				if err := loadEnv(&cfg, getenv, func(name string) bool { return tc.flagSet && name == s.flag }); err != nil {
					t.Fatal(err)
				}
				if got := *s.field(&cfg); !slices.Equal(got, tc.want) {
					t.Errorf("%s = %q; want %q", s.env, got, tc.want)
				}
			})
		}
	}
}

// A kube flag wins over its own variable only: the other ORCHARD_KUBE_*
// variables still apply.
func TestLoadEnvKubeFlags(t *testing.T) {
	env := map[string]string{
		"KUBECONFIG": "/env/kubeconfig", "ORCHARD_KUBE_AGENT_IMAGE": "env/agent:1",
		"ORCHARD_KUBE_SHELL_IMAGE": "env/shell:1", "ORCHARD_KUBE_NODE_SELECTOR": "pool=sandboxes",
	}
	for _, tc := range []struct {
		name                string
		flags               map[string]string
		kubeconfig, agent   string
		shell, nodeSelector string
	}{
		{"env only", nil, "/env/kubeconfig", "env/agent:1", "env/shell:1", "pool=sandboxes"},
		{"kubeconfig flag", map[string]string{"kubeconfig": "/flag/kc"}, "/flag/kc", "env/agent:1", "env/shell:1", "pool=sandboxes"},
		{"agent image flag", map[string]string{"kube-agent-image": "flag/agent:2"}, "/env/kubeconfig", "flag/agent:2", "env/shell:1", "pool=sandboxes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			getenv := func(k string) string { return env[k] }
			cfg := defaultConfig(getenv)
			cfg.Kube.Kubeconfig, cfg.Kube.AgentImage = tc.flags["kubeconfig"], tc.flags["kube-agent-image"]
			if err := loadEnv(&cfg, getenv, func(name string) bool { _, ok := tc.flags[name]; return ok }); err != nil {
				t.Fatal(err)
			}
			k := cfg.Kube
			if k.Kubeconfig != tc.kubeconfig || k.AgentImage != tc.agent || k.ShellImage != tc.shell || k.NodeSelector != tc.nodeSelector {
				t.Errorf("kube config %+v; want kubeconfig %s, agent %s, shell %s, node selector %s", k, tc.kubeconfig, tc.agent, tc.shell, tc.nodeSelector)
			}
		})
	}
}

// TASK_REPO_ROOTS lists the host directories tasks may copy repositories
// from, separated as PATH is; unset, none.
func TestLoadEnvRepoRoots(t *testing.T) {
	for env, want := range map[string][]string{"": nil, "/srv/repos::/data/swe": {"/srv/repos", "/data/swe"}} {
		getenv := func(k string) string { return map[string]string{"TASK_REPO_ROOTS": env}[k] }
		cfg := defaultConfig(getenv)
		if err := loadEnv(&cfg, getenv, func(string) bool { return false }); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cfg.Server.RepoRoots, want) {
			t.Errorf("TASK_REPO_ROOTS=%q: %q, want %q", env, cfg.Server.RepoRoots, want)
		}
	}
}
