package deploy_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// TestKustomizeBaseUpToDate renders the base again from the chart and
// compares it with the committed one, so the two never drift.
func TestKustomizeBaseUpToDate(t *testing.T) {
	t.Parallel()
	helmBin(t) // skips when helm cannot be built
	root := moduleRoot(t)
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "deploy", "gen.sh"), out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("deploy/gen.sh: %v\n%s", err, b)
	}
	base := filepath.Join(root, "deploy", "kustomize", "base")
	want, _ := filepath.Glob(filepath.Join(out, "*"))
	have, _ := filepath.Glob(filepath.Join(base, "*"))
	if len(want) != len(have) {
		t.Errorf("deploy/kustomize/base has %d files, deploy/gen.sh makes %d: run deploy/gen.sh", len(have), len(want))
	}
	for _, w := range want {
		name := filepath.Base(w)
		fresh, err := os.ReadFile(w)
		if err != nil {
			t.Fatal(err)
		}
		committed, err := os.ReadFile(filepath.Join(base, name))
		if err != nil || !bytes.Equal(fresh, committed) {
			t.Errorf("deploy/kustomize/base/%s is out of date with the chart: run deploy/gen.sh and commit the result", name)
		}
	}
}

func TestKustomizeBaseDecodes(t *testing.T) {
	t.Parallel()
	base := filepath.Join(moduleRoot(t), "deploy", "kustomize", "base")
	var k struct{ Resources []string }
	readYAML(t, filepath.Join(base, "kustomization.yaml"), &k)
	var docs []doc
	for _, r := range k.Resources {
		b, err := os.ReadFile(filepath.Join(base, r))
		if err != nil {
			t.Fatalf("base resource %s: %v", r, err)
		}
		d, err := decodeAll(b)
		if err != nil {
			t.Fatalf("%s: %v", r, err)
		}
		docs = append(docs, d...)
	}
	find[*corev1.Namespace](t, docs, "Namespace", "orchard")
	find[*corev1.Namespace](t, docs, "Namespace", "sandbox-pods")
	d := find[*appsv1.Deployment](t, docs, "Deployment", "orchard")
	checkServerPod(t, d)
	if ref := env(d.Spec.Template.Spec.Containers[0])["API_KEYS"].ValueFrom; ref == nil || ref.SecretKeyRef.Name != "orchard-api-keys" {
		t.Errorf("API_KEYS from %+v, want the Secret orchard-api-keys an overlay makes", ref)
	}
	for _, x := range docs {
		if x.u.GetKind() == "Secret" {
			t.Errorf("the base holds Secret %s: a committed file must not hold keys", x.u.GetName())
		}
		if x.u.GetLabels()["app.kubernetes.io/managed-by"] == "Helm" {
			t.Errorf("%s says Helm manages it", x.key())
		}
	}
	checkPolicies(t, docs, "sandbox-pods")
	checkRole(t, docs, "sandbox-pods")
}

// kubectl returns a kubectl with kustomize built in: the one scripts/kube.sh
// builds, else one on PATH, else "".
func kubectl() string {
	cache := os.Getenv("ORCHARD_KUBE_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "orchard", "kube", "v1.37.2")
	}
	if p := filepath.Join(cache, "bin", "kubectl"); fileExists(p) {
		return p
	}
	p, _ := exec.LookPath("kubectl")
	return p
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := utilyaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestKustomizeOverlay builds the example overlay with kubectl kustomize
// when a kubectl is at hand; without one it checks that what the overlay
// names exists.
func TestKustomizeOverlay(t *testing.T) {
	t.Parallel()
	src := filepath.Join(moduleRoot(t), "deploy", "kustomize")
	overlay := filepath.Join(src, "overlays", "example")
	var k struct {
		Resources []string
		Patches   []struct{ Path string }
		Images    []struct{ Name string }
		// SecretGenerator names an env file the user makes from its
		// .example (it holds their keys, so it is not committed).
		SecretGenerator []struct{ Envs []string }
	}
	readYAML(t, filepath.Join(overlay, "kustomization.yaml"), &k)
	for _, r := range k.Resources {
		if !fileExists(filepath.Join(overlay, r, "kustomization.yaml")) && !fileExists(filepath.Join(overlay, r)) {
			t.Errorf("overlay resource %s does not exist", r)
		}
	}
	for _, p := range k.Patches {
		if !fileExists(filepath.Join(overlay, p.Path)) {
			t.Errorf("overlay patch %s does not exist", p.Path)
		}
	}
	var envs []string
	for _, g := range k.SecretGenerator {
		for _, e := range g.Envs {
			envs = append(envs, e)
			if !fileExists(filepath.Join(overlay, e+".example")) {
				t.Errorf("overlay env file %s has no %s.example", e, e)
			}
		}
	}
	base, err := os.ReadFile(filepath.Join(src, "base", "orchard.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range k.Images {
		if !bytes.Contains(base, []byte("image: \""+img.Name+":")) {
			t.Errorf("overlay rewrites image %s, which the base does not use", img.Name)
		}
	}

	kc := kubectl()
	if kc == "" {
		t.Skip("no kubectl to build the overlay with (scripts/kube.sh build makes one); its references exist")
	}
	dir := t.TempDir()
	if out, err := exec.Command("cp", "-r", src, dir).CombinedOutput(); err != nil {
		t.Fatalf("copy: %v\n%s", err, out)
	}
	copied := filepath.Join(dir, "kustomize", "overlays", "example")
	for _, e := range envs {
		b, err := os.ReadFile(filepath.Join(copied, e+".example"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(copied, e), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(kc, "kustomize", copied).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("kubectl kustomize: %v\n%s", err, stderr)
	}
	docs, err := decodeAll(out)
	if err != nil {
		t.Fatal(err)
	}
	d := find[*appsv1.Deployment](t, docs, "Deployment", "orchard")
	if *d.Spec.Replicas != 3 {
		t.Errorf("overlay replicas %d, want 3", *d.Spec.Replicas)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if !strings.HasPrefix(c.Image, "myregistry.azurecr.io/orchard/orchard-server:") {
		t.Errorf("server image %s", c.Image)
	}
	if got := env(c)["ORCHARD_KUBE_AGENT_IMAGE"].Value; !strings.HasPrefix(got, "myregistry.azurecr.io/") {
		t.Errorf("agent image %s, want the overlay's", got)
	}
	if _, ok := env(c)["ORCHARD_ADDR"]; !ok {
		t.Error("the overlay's env patch replaced the base's environment instead of merging")
	}
	find[*corev1.Secret](t, docs, "Secret", "orchard-api-keys")
	checkServerPod(t, d)
}
