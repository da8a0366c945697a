package main

import (
	"strings"
	"testing"
)

// The default ephemeral storage: 10Gi, DEFAULT_EPHEMERAL_STORAGE, the flag
// over both, and a quantity that makes no sense stops the server at start.
func TestDefaultEphemeralStorageConfig(t *testing.T) {
	if serveCmd(func(string) string { return "" }).Flags().Lookup("default-ephemeral-storage") == nil {
		t.Error("orchard serve has no --default-ephemeral-storage")
	}
	for _, tc := range []struct {
		env, flag, want, wantErr string
	}{
		{want: "10Gi"},
		{env: "20Gi", want: "20Gi"},
		{env: "20Gi", flag: "5Gi", want: "5Gi"},
		{env: "lots", wantErr: "DEFAULT_EPHEMERAL_STORAGE"},
		{env: "1Mi", wantErr: "minimum"},
	} {
		getenv := func(k string) string {
			if k == "DEFAULT_EPHEMERAL_STORAGE" {
				return tc.env
			}
			return ""
		}
		cfg := defaultConfig(getenv)
		if tc.flag != "" {
			cfg.Manager.DefaultEphemeralStorage = tc.flag // as --default-ephemeral-storage sets it
		}
		flagSet := func(name string) bool { return tc.flag != "" && name == "default-ephemeral-storage" }
		if err := loadEnv(&cfg, getenv, flagSet); err != nil {
			t.Fatal(err)
		}
		err := cfg.validate()
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("env %q flag %q: validate = %v; want an error naming %s", tc.env, tc.flag, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("env %q flag %q: validate = %v", tc.env, tc.flag, err)
		case cfg.Manager.DefaultEphemeralStorage != tc.want:
			t.Errorf("env %q flag %q: default ephemeral storage %q; want %q", tc.env, tc.flag, cfg.Manager.DefaultEphemeralStorage, tc.want)
		}
	}
}
