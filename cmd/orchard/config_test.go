package main

import (
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
