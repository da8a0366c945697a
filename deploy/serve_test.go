package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/orchard/orchard/internal/testing/kubetest"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// TestChartServeOnKube runs the real server with the environment the
// chart gives its container, against the chart's RBAC objects, as the
// chart's service account: the names and formats the chart writes
// (images, node selector, tolerations, Redis, config) are the ones the
// server parses, and a sandbox made through the API lands where the chart
// says. The server runs on this machine (the test cluster's Services route
// nowhere), with a kubeconfig that impersonates the service account in
// place of the pod's in-cluster credentials.
func TestChartServeOnKube(t *testing.T) {
	kubetest.Config(t)     // skips without a cluster
	testenv.RequireRoot(t) // testserver.StartProcess needs it
	t.Parallel()
	tests := []struct {
		name  string
		nodes bool
	}{
		// rbac.nodes: GET /resources lists the cluster's sandbox nodes.
		{"nodes listed", true},
		// Without it /resources answers 503 runtime.kube_api, and
		// everything else works.
		{"nodes forbidden", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			serveChart(t, tt.nodes)
		})
	}
}

func serveChart(t *testing.T, nodes bool) {
	cfg := kubetest.Config(t)
	redis := testenv.StartRedis(t)
	c := newCluster(t, cfg)
	cs := kubetest.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()

	suffix := fmt.Sprintf("%08x", rand.Uint32())
	ns, sandboxNS := "orchard-serve-"+suffix, "orchard-serve-"+suffix+"-sandboxes"
	name := "orchard-" + suffix
	out, err := render(t, ns, "--set", "fullnameOverride="+name+",sandboxNamespace.name="+sandboxNS+
		",image.registry=orchard.local,image.tag=dev,redis.external.url="+redis.URL()+",config.SERVICE_NAME=chart-"+suffix+
		",sandbox.nodeSelector.type=kwok,sandbox.tolerations[0].key=kwok.x-k8s.io/node,sandbox.tolerations[0].effect=NoSchedule"+
		fmt.Sprintf(",rbac.nodes=%v", nodes))
	if err != nil {
		t.Fatal(err)
	}
	docs, err := decodeAll(out)
	if err != nil {
		t.Fatal(err)
	}
	var server *appsv1.Deployment
	nsObj := &corev1.Namespace{}
	nsObj.Name = ns
	if _, err := cs.CoreV1().Namespaces().Create(ctx, nsObj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	for _, d := range docs {
		switch d.u.GetKind() {
		case "Deployment":
			if d.u.GetName() == name {
				server = d.typed.(*appsv1.Deployment)
			}
			continue
		case "Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "NetworkPolicy":
		default:
			continue
		}
		if _, err := c.create(ctx, d.u, false); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.delete(context.Background(), d.u) })
	}
	if server == nil {
		t.Fatalf("no Deployment %s rendered", name)
	}

	// The container's environment as the kubelet would set it; the API
	// keys come from a Secret, and the test server sets its own.
	var env []string
	for _, e := range server.Spec.Template.Spec.Containers[0].Env {
		if e.ValueFrom == nil {
			env = append(env, e.Name+"="+e.Value)
		}
	}
	env = append(env, "KUBECONFIG="+impersonating(t, "system:serviceaccount:"+ns+":"+name))
	// testserver gives the address and state directory as flags, which
	// win over the chart's ORCHARD_ADDR and ORCHARD_STATE_DIR.
	p := testserver.StartProcess(t, testserver.ProcessOptions{Env: env})

	var banner struct{ Service string }
	call(t, p, "GET", "/", nil, &banner)
	if banner.Service != "chart-"+suffix {
		t.Errorf("GET / service %q, want config.SERVICE_NAME chart-%s", banner.Service, suffix)
	}
	var sb struct {
		ID  string `json:"sandbox_id"`
		CPU string `json:"cpu"`
	}
	call(t, p, "POST", "/sandboxes", map[string]any{"image": ""}, &sb)
	var ready struct{ Status string }
	call(t, p, "GET", "/sandboxes/"+sb.ID+"/wait?timeout=60", nil, &ready)
	if ready.Status != "ready" || sb.CPU != "1" {
		t.Errorf("sandbox %s: status %s, cpu %s; want ready with the chart's default cpu 1", sb.ID, ready.Status, sb.CPU)
	}
	pod, err := cs.CoreV1().Pods(sandboxNS).Get(ctx, "sandbox-"+sb.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("sandbox %s has no pod in %s: %v", sb.ID, sandboxNS, err)
	}
	spec := pod.Spec
	if spec.Containers[0].Image != "orchard.local/orchard-shell:dev" || spec.InitContainers[0].Image != "orchard.local/orchard-agent:dev" {
		t.Errorf("pod images %s, agent %s; want the chart's orchard-shell and orchard-agent", spec.Containers[0].Image, spec.InitContainers[0].Image)
	}
	if spec.NodeSelector["type"] != "kwok" || !slices.ContainsFunc(spec.Tolerations, func(t corev1.Toleration) bool {
		return t.Key == "kwok.x-k8s.io/node" && t.Operator == corev1.TolerationOpExists && t.Effect == corev1.TaintEffectNoSchedule
	}) {
		t.Errorf("pod placement: node selector %v, tolerations %+v", spec.NodeSelector, spec.Tolerations)
	}
	var res struct {
		Nodes []struct{ Name string }
		Error struct{ Code string }
	}
	status := call(t, p, "GET", "/resources", nil, &res)
	switch {
	case nodes && (status != http.StatusOK || len(res.Nodes) != 1 || res.Nodes[0].Name != "kwok-node-0"):
		t.Errorf("/resources: %d, nodes %+v; want 200 with kwok-node-0 (the chart's ClusterRole lists nodes)", status, res.Nodes)
	case !nodes && (status != http.StatusServiceUnavailable || res.Error.Code != "runtime.kube_api"):
		t.Errorf("/resources without rbac.nodes: %d %+v; want 503 runtime.kube_api", status, res.Error)
	}
	call(t, p, "DELETE", "/sandboxes/"+sb.ID, nil, nil)
}

// impersonating writes a copy of the test cluster's kubeconfig that acts
// as user.
func impersonating(t *testing.T, user string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(testenvKubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range cfg.AuthInfos {
		a.Impersonate = user
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func testenvKubeconfig() string { return os.Getenv(kubetest.EnvKubeconfig) }

// call makes one API call and decodes its JSON answer into out (if
// non-nil); it returns the status. A status other than 2xx and 503 fails
// the test.
func call(t *testing.T, p *testserver.Process, method, path string, body, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, p.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", p.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 && resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, raw)
		}
	}
	return resp.StatusCode
}
