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
