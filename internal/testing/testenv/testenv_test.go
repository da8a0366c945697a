package testenv

import "testing"

func TestRequired(t *testing.T) {
	for _, tc := range []struct {
		env, name string
		want      bool
	}{
		{"", "root", false},
		{"all", "root", true},
		{"redis, root", "root", true},
		{"redis,chromium", "root", false},
		{"rootless", "root", false},
	} {
		t.Setenv(RequireEnv, tc.env)
		if got := Required(tc.name); got != tc.want {
			t.Errorf("Required(%q) with %s=%q = %v; want %v", tc.name, RequireEnv, tc.env, got, tc.want)
		}
	}
}

func TestModuleRoot(t *testing.T) {
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if root == "" {
		t.Fatal("empty module root")
	}
}
