package deploy_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/orchard/orchard/internal/testing/kubetest"
	"github.com/orchard/orchard/runtime/kube"
)

// cluster applies rendered objects through the dynamic client.
type cluster struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func newCluster(t *testing.T, cfg *rest.Config) *cluster {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}
}

func (c *cluster) resource(u *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := u.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", gvk, u.GetName(), err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return c.dyn.Resource(m.Resource).Namespace(u.GetNamespace()), nil
	}
	return c.dyn.Resource(m.Resource), nil
}

// create sends u to the API server with strict field validation; dryRun
// makes the server check and admit it without storing it.
func (c *cluster) create(ctx context.Context, u *unstructured.Unstructured, dryRun bool) (*unstructured.Unstructured, error) {
	ri, err := c.resource(u)
	if err != nil {
		return nil, err
	}
	opts := metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	out, err := ri.Create(ctx, u, opts)
	if err != nil {
		return nil, fmt.Errorf("create %s/%s in %q (dry run %v): %w", u.GetKind(), u.GetName(), u.GetNamespace(), dryRun, err)
	}
	return out, nil
}

func (c *cluster) delete(ctx context.Context, u *unstructured.Unstructured) {
	if ri, err := c.resource(u); err == nil {
		_ = ri.Delete(ctx, u.GetName(), metav1.DeleteOptions{})
	}
}

// TestChartOnKube applies everything the chart renders, default and
// production values, to a real API server with a server-side dry run:
// admission, validation and strict field checks as a real install meets
// them. Then it installs the RBAC objects and policies for real and starts
// the kube runtime as the chart's service account: its start-up checks
// (every permission it needs, by SelfSubjectAccessReview) pass, it leaves
// the chart's policies as they are, and it may list nodes.
func TestChartOnKube(t *testing.T) {
	cfg := kubetest.Config(t)
	t.Parallel()
	c := newCluster(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	suffix := fmt.Sprintf("%08x", rand.Uint32())
	ns, sandboxNS := "orchard-chart-"+suffix, "orchard-chart-"+suffix+"-sandboxes"
	custom := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(custom, []byte(customValues), 0o644); err != nil {
		t.Fatal(err)
	}
	// Cluster-scoped names (the nodes ClusterRole) carry the release's
	// name: a release of its own keeps runs apart.
	set := "fullnameOverride=orchard-" + suffix + ",sandboxNamespace.name=" + sandboxNS
	rendered := map[string][]doc{}
	for name, args := range map[string][]string{"defaults": {"--set", set}, "production values": {"--set", set, "--values", custom}} {
		out, err := render(t, ns, args...)
		if err != nil {
			t.Fatal(err)
		}
		if rendered[name], err = decodeAll(out); err != nil {
			t.Fatal(err)
		}
	}
	defaults := rendered["defaults"]

	// The sandbox namespace first, while it does not exist yet; then both
	// namespaces for real, which everything else needs, dry run or not.
	for name, docs := range rendered {
		for _, d := range docs {
			if d.u.GetKind() != "Namespace" {
				continue
			}
			if _, err := c.create(ctx, d.u, true); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
	cs := kubetest.Client(t)
	for _, n := range []string{ns, sandboxNS} {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("v1")
		u.SetKind("Namespace")
		u.SetName(n)
		if _, err := c.create(ctx, u, false); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), n, metav1.DeleteOptions{}) })
	}
	for name, docs := range rendered {
		for _, d := range docs {
			switch d.u.GetKind() {
			case "Namespace":
				continue
			case "ServiceMonitor":
				// A CRD this cluster does not have; decodeAll checked
				// its apiVersion and kind.
				continue
			}
			if _, err := c.create(ctx, d.u, true); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
	if t.Failed() {
		return
	}

	// For real: what the runtime's start-up needs of the chart.
	policies := map[string]string{}
	for _, d := range defaults {
		switch d.u.GetKind() {
		case "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "NetworkPolicy":
		default:
			continue
		}
		if d.u.GetNamespace() != "" && d.u.GetNamespace() != ns && d.u.GetNamespace() != sandboxNS {
			t.Fatalf("%s in namespace %s", d.key(), d.u.GetNamespace())
		}
		got, err := c.create(ctx, d.u, false)
		if err != nil {
			t.Fatal(err)
		}
		if d.u.GetNamespace() == "" {
			t.Cleanup(func() { c.delete(context.Background(), d.u) })
		}
		if d.u.GetKind() == "NetworkPolicy" && d.u.GetNamespace() == sandboxNS {
			policies[got.GetName()] = got.GetResourceVersion()
		}
	}
	if len(policies) != 2 {
		t.Fatalf("policies in %s: %v, want %s and %s", sandboxNS, policies, kube.PolicyDenyAll, kube.PolicyAgentAccess)
	}

	as := rest.CopyConfig(cfg)
	as.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":orchard-" + suffix}
	sa, err := kubernetes.NewForConfig(as)
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRuntimeWhenBound(ctx, sa, kube.Config{Namespace: sandboxNS, AgentImage: "registry.example.com/orchard/orchard-agent:0.1.0"})
	if err != nil {
		t.Fatalf("kube runtime as the chart's service account: %v", err)
	}
	defer r.Close()
	for name, rv := range policies {
		p, err := cs.NetworkingV1().NetworkPolicies(sandboxNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.ResourceVersion != rv {
			t.Errorf("the runtime rewrote the chart's policy %s (resourceVersion %s → %s): their specs differ", name, rv, p.ResourceVersion)
		}
	}
	if _, err := cs.CoreV1().Secrets(sandboxNS).Get(ctx, kube.KeySecret, metav1.GetOptions{}); err != nil {
		t.Errorf("agent key: %v", err)
	}
	if _, err := r.Nodes(ctx); err != nil {
		t.Errorf("list nodes with rbac.nodes: %v", err)
	}
}

// newRuntimeWhenBound starts the runtime, retrying while RBAC refuses: the
// API server's authorizer learns of a new RoleBinding from a watch, a
// moment after it was created.
func newRuntimeWhenBound(ctx context.Context, cs kubernetes.Interface, cfg kube.Config) (*kube.Runtime, error) {
	// Long enough for the authorizer's watch, short enough that a Role
	// that lacks a permission fails the test quickly.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		r, err := kube.New(ctx, cs, cfg)
		if err == nil || (!strings.Contains(err.Error(), "RBAC forbids") && !apierrors.IsForbidden(errors.Unwrap(err))) {
			return r, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// TestChartUpgradeOnKube installs the chart with helm and upgrades it: the
// API key generated at install is read back (lookup) and kept, so clients
// keep working across upgrades. Nothing runs: the test cluster has no
// controllers, so the Deployment makes no pods.
func TestChartUpgradeOnKube(t *testing.T) {
	kubetest.Config(t) // skips without a cluster
	t.Parallel()
	kubeconfig := os.Getenv(kubetest.EnvKubeconfig)
	helm := helmBin(t)
	cs := kubetest.Client(t)
	suffix := fmt.Sprintf("%08x", rand.Uint32())
	ns, sandboxNS := "orchard-helm-"+suffix, "orchard-helm-"+suffix+"-sandboxes"
	rel := "orchard-" + suffix
	chart := filepath.Join(moduleRoot(t), "deploy", "helm", "orchard")
	helmRun := func(args ...string) {
		t.Helper()
		cmd := exec.Command(helm, append(args, "--kubeconfig", kubeconfig)...)
		// Helm's own state (repositories, cache) stays out of the user's.
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() {
		cmd := exec.Command(helm, "uninstall", rel, "--namespace", ns, "--kubeconfig", kubeconfig)
		_ = cmd.Run()
		_ = cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	install := []string{"upgrade", "--install", rel, chart, "--namespace", ns, "--create-namespace",
		"--set", "sandboxNamespace.name=" + sandboxNS + ",tests.enabled=false"}
	key := func() string {
		t.Helper()
		s, err := cs.CoreV1().Secrets(ns).Get(context.Background(), rel+"-api-keys", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return string(s.Data["API_KEYS"])
	}
	helmRun(install...)
	first := key()
	if len(first) != 40 {
		t.Fatalf("generated key %q", first)
	}
	helmRun(append(install, "--set", "replicaCount=3")...)
	if again := key(); again != first {
		t.Errorf("upgrade changed the generated API key: %q → %q", first, again)
	}
	d, err := cs.AppsV1().Deployments(ns).Get(context.Background(), rel, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *d.Spec.Replicas != 3 {
		t.Errorf("replicas after upgrade %d, want 3", *d.Spec.Replicas)
	}
}
