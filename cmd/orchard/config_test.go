package main

import (
	"slices"
	"testing"
)

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
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"ORCHARD_HOST_EXPOSE": tc.env}
			getenv := func(k string) string { return env[k] }
			cfg := defaultConfig(getenv)
			cfg.HostExpose = tc.flags
			if err := loadEnv(&cfg, getenv, func(name string) bool { return tc.flagSet && name == "host-expose" }); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(cfg.HostExpose, tc.want) {
				t.Errorf("HostExpose = %q; want %q", cfg.HostExpose, tc.want)
			}
		})
	}
}
