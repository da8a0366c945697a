package deploy_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/runtime/kube"
)

// moduleRoot is the repository's root directory.
func moduleRoot(t testing.TB) string {
	t.Helper()
	dir, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatalf("module root: %v", err)
	}
	return dir
}

// helmBuild runs deploy/helm.sh at most once per test process: it builds
// helm from the Go module proxy on first use (minutes) and prints its path.
var helmBuild struct {
	once sync.Once
	path string
	err  error
}

// helmBin returns the helm binary, or skips (fails when ORCHARD_TEST_REQUIRE
// names "helm") when it cannot be built.
func helmBin(t testing.TB) string {
	t.Helper()
	root := moduleRoot(t)
	helmBuild.once.Do(func() {
		var stderr bytes.Buffer
		cmd := exec.Command(filepath.Join(root, "deploy", "helm.sh"))
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			helmBuild.err = fmt.Errorf("deploy/helm.sh: %w: %s", err, stderr.String())
			return
		}
		helmBuild.path = strings.TrimSpace(string(out))
	})
	why := ""
	if helmBuild.err != nil {
		why = "helm could not be built: " + helmBuild.err.Error()
	}
	testenv.Require(t, "helm", helmBuild.err == nil, why)
	return helmBuild.path
}

const (
	release   = "orchard"
	releaseNS = "orchard"
)

// render runs helm template on the chart with args (values files, --set).
func render(t testing.TB, namespace string, args ...string) ([]byte, error) {
	t.Helper()
	helm := helmBin(t)
	chart := filepath.Join(moduleRoot(t), "deploy", "helm", "orchard")
	cmd := exec.Command(helm, append([]string{"template", release, chart, "--namespace", namespace}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm template %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

// doc is one rendered object: typed when the API is Kubernetes' own, and
// always as unstructured, which is what the dynamic client sends.
type doc struct {
	typed runtime.Object
	u     *unstructured.Unstructured
}

func (d doc) key() string { return d.u.GetKind() + "/" + d.u.GetName() }

// strict decodes with unknown and duplicate fields refused.
var strict = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

// crds are the kinds the chart renders that client-go's scheme does not
// know: decoded as unstructured.
var crds = map[string]string{"ServiceMonitor": "monitoring.coreos.com/v1"}

// decodeAll splits a multi-document YAML stream and decodes each document
// strictly into its Kubernetes type.
func decodeAll(data []byte) ([]doc, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []doc
	for {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("split documents: %w", err)
		}
		js, err := utilyaml.ToJSON(raw)
		if err != nil {
			return nil, fmt.Errorf("document %q: %w", raw, err)
		}
		if string(bytes.TrimSpace(js)) == "null" {
			continue // only comments
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			return nil, fmt.Errorf("document %s: %w", raw, err)
		}
		d := doc{u: u}
		if api, ok := crds[u.GetKind()]; ok {
			if u.GetAPIVersion() != api {
				return nil, fmt.Errorf("%s: apiVersion %s, want %s", d.key(), u.GetAPIVersion(), api)
			}
			out = append(out, d)
			continue
		}
		d.typed, _, err = strict.Decode(raw, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: strict decoding: %w", d.key(), err)
		}
		out = append(out, d)
	}
}

func find[T runtime.Object](t testing.TB, docs []doc, kind, name string) T {
	t.Helper()
	for _, d := range docs {
		if d.u.GetKind() == kind && d.u.GetName() == name {
			v, ok := d.typed.(T)
			if !ok {
				t.Fatalf("%s/%s decodes to %T", kind, name, d.typed)
			}
			return v
		}
	}
	var zero T
	t.Fatalf("no %s/%s rendered; have %v", kind, name, keys(docs))
	return zero
}

func keys(docs []doc) []string {
	var out []string
	for _, d := range docs {
		out = append(out, d.key())
	}
	return out
}

// wantEnv checks the plain values of e against want.
func wantEnv(t *testing.T, e map[string]corev1.EnvVar, want map[string]string) {
	t.Helper()
	for name, v := range want {
		if got := e[name].Value; got != v {
			t.Errorf("env %s = %q, want %q", name, got, v)
		}
	}
}

func env(c corev1.Container) map[string]corev1.EnvVar {
	out := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		out[e.Name] = e
	}
	return out
}

// customValues exercises what production turns on: an external Redis over
// TLS with its password and CA in Secrets, a sandbox node pool, three
// replicas, a ServiceMonitor.
const customValues = `
replicaCount: 3
image:
  registry: myacr.azurecr.io/orchard
  tag: v1.2.3
  browser: ""
redis:
  external:
    url: rediss://cache.redis.cache.windows.net:6380/0
    existingSecret: redis-auth
    caSecret: redis-ca
sandbox:
  nodeSelector: {workload: sandbox, kubernetes.azure.com/mode: user}
  tolerations:
    - {key: workload, value: sandbox, effect: NoSchedule}
    - {key: gpu, effect: NoExecute}
  pullSecrets: [acr-pull]
metrics:
  serviceMonitor:
    enabled: true
    labels: {release: prometheus}
config:
  DEFAULT_TIMEOUT_SECONDS: 600
  EGRESS_HOSTS: ""
`

func TestChartRenders(t *testing.T) {
	t.Parallel()
	custom := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(custom, []byte(customValues), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, docs []doc)
	}{
		{"defaults", nil, func(t *testing.T, docs []doc) {
			d := find[*appsv1.Deployment](t, docs, "Deployment", "orchard")
			if *d.Spec.Replicas != 2 {
				t.Errorf("replicas %d, want 2 with the in-chart Redis", *d.Spec.Replicas)
			}
			if spec := d.Spec.Template.Spec; spec.HostNetwork || spec.DNSPolicy != "" {
				t.Errorf("hostNetwork %v, dnsPolicy %q by default", spec.HostNetwork, spec.DNSPolicy)
			}
			c := d.Spec.Template.Spec.Containers[0]
			e := env(c)
			wantEnv(t, e, map[string]string{
				"ORCHARD_ADDR":               "0.0.0.0:8000",
				"ORCHARD_RUNTIME":            "kube",
				"ORCHARD_STORE":              "redis",
				"REDIS_URL":                  "redis://orchard-redis.orchard.svc:6379/0",
				"SANDBOX_NAMESPACE":          "sandbox-pods",
				"ORCHARD_KUBE_AGENT_IMAGE":   "registry.example.com/orchard/orchard-agent:0.1.0",
				"ORCHARD_KUBE_SHELL_IMAGE":   "registry.example.com/orchard/orchard-shell:0.1.0",
				"ORCHARD_KUBE_BROWSER_IMAGE": "registry.example.com/orchard/orchard-browser:0.1.0",
				"ORCHARD_KUBE_DESKTOP_IMAGE": "registry.example.com/orchard/orchard-desktop:0.1.0",
				"REQUIRE_API_KEY":            "true",
			})
			if ref := e["API_KEYS"].ValueFrom; ref == nil || ref.SecretKeyRef.Name != "orchard-api-keys" || ref.SecretKeyRef.Key != "API_KEYS" {
				t.Errorf("API_KEYS from %+v, want Secret orchard-api-keys key API_KEYS", ref)
			}
			for _, name := range []string{"ORCHARD_KUBE_NODE_SELECTOR", "ORCHARD_KUBE_TOLERATIONS", "REDIS_PASSWORD", "SERVICE_NAME", "ORCHARD_KUBE_HARNESS_IMAGE", "DEFAULT_HARNESSES"} {
				if _, ok := e[name]; ok {
					t.Errorf("env %s set by default", name)
				}
			}
			if c.Image != "registry.example.com/orchard/orchard-server:0.1.0" {
				t.Errorf("server image %s", c.Image)
			}
			checkServerPod(t, d)
			s := find[*corev1.Secret](t, docs, "Secret", "orchard-api-keys")
			if len(s.Data["API_KEYS"]) != 40 {
				t.Errorf("generated API key of %d characters, want 40", len(s.Data["API_KEYS"]))
			}
			find[*appsv1.Deployment](t, docs, "Deployment", "orchard-redis")
			find[*corev1.Namespace](t, docs, "Namespace", "sandbox-pods")
			find[*policyv1.PodDisruptionBudget](t, docs, "PodDisruptionBudget", "orchard")
			svc := find[*corev1.Service](t, docs, "Service", "orchard")
			if p := svc.Spec.Ports[0]; p.Port != 8080 || p.TargetPort.String() != "http" {
				t.Errorf("service port %d → %s, want 8080 → http", p.Port, p.TargetPort.String())
			}
			checkPolicies(t, docs, "sandbox-pods")
			checkRole(t, docs, "sandbox-pods")
			cr := find[*rbacv1.ClusterRole](t, docs, "ClusterRole", "orchard-nodes")
			if r := cr.Rules; len(r) != 1 || !slices.Equal(r[0].Resources, []string{"nodes"}) || !slices.Equal(r[0].Verbs, []string{"list"}) {
				t.Errorf("nodes ClusterRole rules %+v, want list nodes only", r)
			}
		}},
		{"harnesses", []string{"--set", "harnesses.enabled=true", "--set", "harnesses.default={codex,claude}"}, func(t *testing.T, docs []doc) {
			e := env(find[*appsv1.Deployment](t, docs, "Deployment", "orchard").Spec.Template.Spec.Containers[0])
			wantEnv(t, e, map[string]string{
				"ORCHARD_KUBE_HARNESS_IMAGE": "registry.example.com/orchard/orchard-harnesses:0.1.0",
				"ORCHARD_KUBE_HARNESSES":     "claude,codex,opencode,pi",
				"DEFAULT_HARNESSES":          "codex,claude",
			})
		}},
		{"production values", []string{"--values", custom}, func(t *testing.T, docs []doc) {
			d := find[*appsv1.Deployment](t, docs, "Deployment", "orchard")
			if *d.Spec.Replicas != 3 {
				t.Errorf("replicas %d, want 3", *d.Spec.Replicas)
			}
			e := env(d.Spec.Template.Spec.Containers[0])
			wantEnv(t, e, map[string]string{
				"REDIS_URL":                  "rediss://cache.redis.cache.windows.net:6380/0",
				"REDIS_CA_CERT":              "/etc/orchard/redis-ca/ca.crt",
				"ORCHARD_KUBE_NODE_SELECTOR": "kubernetes.azure.com/mode=user,workload=sandbox",
				"ORCHARD_KUBE_TOLERATIONS":   "workload=sandbox:NoSchedule,gpu:NoExecute",
				"ORCHARD_KUBE_PULL_SECRETS":  "acr-pull",
				"ORCHARD_KUBE_AGENT_IMAGE":   "myacr.azurecr.io/orchard/orchard-agent:v1.2.3",
				"DEFAULT_TIMEOUT_SECONDS":    "600",
			})
			if ref := e["REDIS_PASSWORD"].ValueFrom; ref == nil || ref.SecretKeyRef.Name != "redis-auth" || ref.SecretKeyRef.Key != "redis-password" {
				t.Errorf("REDIS_PASSWORD from %+v, want Secret redis-auth", ref)
			}
			for _, name := range []string{"ORCHARD_KUBE_BROWSER_IMAGE", "EGRESS_HOSTS"} {
				if _, ok := e[name]; ok {
					t.Errorf("env %s set though empty", name)
				}
			}
			vols := map[string]corev1.Volume{}
			for _, v := range d.Spec.Template.Spec.Volumes {
				vols[v.Name] = v
			}
			if v := vols["redis-ca"]; v.Secret == nil || v.Secret.SecretName != "redis-ca" {
				t.Errorf("redis-ca volume %+v, want Secret redis-ca", v)
			}
			for _, k := range keys(docs) {
				if strings.Contains(k, "redis") {
					t.Errorf("%s rendered with an external Redis", k)
				}
			}
			found := false
			for _, doc := range docs {
				if doc.u.GetKind() == "ServiceMonitor" {
					found = true
					ep, _, _ := unstructured.NestedSlice(doc.u.Object, "spec", "endpoints")
					if len(ep) != 1 || ep[0].(map[string]any)["path"] != "/metrics" {
						t.Errorf("ServiceMonitor endpoints %v", ep)
					}
				}
			}
			if !found {
				t.Errorf("no ServiceMonitor; have %v", keys(docs))
			}
			checkServerPod(t, d)
			checkPolicies(t, docs, "sandbox-pods")
			checkRole(t, docs, "sandbox-pods")
		}},
		{"host network", []string{"--set", "server.hostNetwork=true,server.port=18555,server.extraEnv[0].name=KUBERNETES_SERVICE_HOST,server.extraEnv[0].value=127.0.0.1"},
			func(t *testing.T, docs []doc) {
				d := find[*appsv1.Deployment](t, docs, "Deployment", "orchard")
				spec := d.Spec.Template.Spec
				if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
					t.Errorf("hostNetwork %v, dnsPolicy %q; want true, ClusterFirstWithHostNet", spec.HostNetwork, spec.DNSPolicy)
				}
				c := spec.Containers[0]
				if e := env(c); e["ORCHARD_ADDR"].Value != "0.0.0.0:18555" || e["KUBERNETES_SERVICE_HOST"].Value != "127.0.0.1" {
					t.Errorf("ORCHARD_ADDR %q, KUBERNETES_SERVICE_HOST %q", e["ORCHARD_ADDR"].Value, e["KUBERNETES_SERVICE_HOST"].Value)
				}
				// The kubelet sets KUBERNETES_SERVICE_HOST too: the
				// container's own entry, last, is the one that holds.
				if last := c.Env[len(c.Env)-1]; last.Name != "KUBERNETES_SERVICE_HOST" {
					t.Errorf("last env %s, want extraEnv's", last.Name)
				}
			}},
		{"memory store, no extras", []string{"--set", "redis.enabled=false,rbac.nodes=false,networkPolicy.enabled=false,sandboxNamespace.create=false,auth.required=false,tests.enabled=false"},
			func(t *testing.T, docs []doc) {
				d := find[*appsv1.Deployment](t, docs, "Deployment", "orchard")
				if *d.Spec.Replicas != 1 {
					t.Errorf("replicas %d, want 1 with the memory store", *d.Spec.Replicas)
				}
				e := env(d.Spec.Template.Spec.Containers[0])
				if e["ORCHARD_STORE"].Value != "memory" || e["REQUIRE_API_KEY"].Value != "false" {
					t.Errorf("store %q, REQUIRE_API_KEY %q", e["ORCHARD_STORE"].Value, e["REQUIRE_API_KEY"].Value)
				}
				for _, k := range keys(docs) {
					switch strings.Split(k, "/")[0] {
					case "ClusterRole", "ClusterRoleBinding", "NetworkPolicy", "Namespace", "Secret", "PodDisruptionBudget", "Pod":
						t.Errorf("%s rendered", k)
					}
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, err := render(t, releaseNS, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			docs, err := decodeAll(out)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, docs)
		})
	}
}

// checkServerPod checks what every server pod needs whatever the values.
func checkServerPod(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	spec := d.Spec.Template.Spec
	// The runtime's orchard-agent-access policy admits exactly these pods.
	if got := d.Spec.Template.Labels["app.kubernetes.io/name"]; got != "orchard-server" {
		t.Errorf("server pods labelled app.kubernetes.io/name=%q, want orchard-server", got)
	}
	if sc := spec.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 65532 || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("pod security context %+v, want non-root 65532", sc)
	}
	c := spec.Containers[0]
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/health" {
			t.Errorf("%s probe %+v, want GET /health", name, p)
		}
	}
	if a := d.Spec.Template.Annotations; a["prometheus.io/scrape"] != "true" || a["prometheus.io/path"] != "/metrics" || a["prometheus.io/port"] != "8000" {
		t.Errorf("scrape annotations %v", a)
	}
	if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
		t.Error("service links on: the server would read <SERVICE>_PORT variables")
	}
	if _, ok := env(c)["KUBECONFIG"]; ok {
		t.Error("KUBECONFIG set: the server must use its pod's service account")
	}
	// Whatever the image's entrypoint (deploy/images': `orchard serve`).
	if !slices.Equal(c.Command, []string{"orchard"}) || !slices.Equal(c.Args, []string{"serve"}) {
		t.Errorf("server command %q args %q, want [orchard] [serve]", c.Command, c.Args)
	}
}

// checkPolicies checks the chart's two policies are the ones the runtime
// applies at start-up (runtime/kube setup.go); TestChartOnKube checks on a
// real API server that the runtime leaves them as they are.
func checkPolicies(t *testing.T, docs []doc, ns string) {
	t.Helper()
	deny := find[*netv1.NetworkPolicy](t, docs, "NetworkPolicy", kube.PolicyDenyAll)
	access := find[*netv1.NetworkPolicy](t, docs, "NetworkPolicy", kube.PolicyAgentAccess)
	for _, p := range []*netv1.NetworkPolicy{deny, access} {
		if p.Namespace != ns {
			t.Errorf("policy %s in namespace %q, want %q", p.Name, p.Namespace, ns)
		}
	}
	if len(deny.Spec.PodSelector.MatchLabels) != 0 || len(deny.Spec.Ingress) != 0 || len(deny.Spec.Egress) != 0 ||
		!slices.Equal(deny.Spec.PolicyTypes, []netv1.PolicyType{netv1.PolicyTypeIngress, netv1.PolicyTypeEgress}) {
		t.Errorf("deny-all spec %+v", deny.Spec)
	}
	in := access.Spec.Ingress
	if access.Spec.PodSelector.MatchLabels[kube.LabelManagedBy] != kube.ManagedBy || len(in) != 1 || len(in[0].From) != 1 ||
		in[0].From[0].PodSelector.MatchLabels["app.kubernetes.io/name"] != "orchard-server" ||
		in[0].Ports[0].Port.IntValue() != kube.DefaultAgentPort {
		t.Errorf("agent-access spec %+v", access.Spec)
	}
}

// checkRole checks the Role grants exactly what runtime/kube checks for at
// start-up: the list is read from setup.go's needed, so a permission the
// runtime adds or drops fails here until the chart follows.
func checkRole(t *testing.T, docs []doc, ns string) {
	t.Helper()
	role := find[*rbacv1.Role](t, docs, "Role", "orchard")
	if role.Namespace != ns {
		t.Errorf("Role in namespace %q, want %q", role.Namespace, ns)
	}
	var granted []string
	for _, r := range role.Rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					granted = append(granted, g+"/"+res+"/"+v)
				}
			}
		}
	}
	slices.Sort(granted)
	needed := runtimeNeeds(t)
	if !slices.Equal(granted, needed) {
		t.Errorf("Role grants\n  %v\nruntime/kube needs\n  %v", granted, needed)
	}
}

// runtimeNeeds reads the permissions runtime/kube checks at start-up from
// its source (the needed table of setup.go), as group/resource/verb.
func runtimeNeeds(t *testing.T) []string {
	t.Helper()
	path := filepath.Join(moduleRoot(t), "runtime", "kube", "setup.go")
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "needed" || len(vs.Values) != 1 {
			return true
		}
		lit, ok := vs.Values[0].(*ast.CompositeLit)
		if !ok {
			t.Fatalf("%s: needed is not a composite literal", path)
		}
		for _, e := range lit.Elts {
			var fields []string
			for _, f := range e.(*ast.CompositeLit).Elts {
				s, err := strconv.Unquote(f.(*ast.BasicLit).Value)
				if err != nil {
					t.Fatalf("%s: needed: %v", path, err)
				}
				fields = append(fields, s)
			}
			out = append(out, strings.Join(fields, "/"))
		}
		return false
	})
	if len(out) == 0 {
		t.Fatalf("%s: no needed table found", path)
	}
	slices.Sort(out)
	return out
}

func TestChartRefuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		namespace string
		set       string
		want      string
	}{
		{"replicas on the memory store", releaseNS, "redis.enabled=false,replicaCount=2", "needs a Redis store"},
		{"sandboxes in the server's namespace", "sandbox-pods", "", "must differ from the release namespace"},
		{"a chart-managed setting in config", releaseNS, "config.API_KEYS=abc", "config.API_KEYS is set by the chart"},
		{"a toleration without effect", releaseNS, "sandbox.tolerations[0].key=gpu", "each needs a key and an effect"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var args []string
			if tt.set != "" {
				args = []string{"--set", tt.set}
			}
			_, err := render(t, tt.namespace, args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("render: %v, want an error with %q", err, tt.want)
			}
		})
	}
}

// TestChartKeepsAPIKey: the generated key is read back on upgrade. helm
// template cannot look up a live Secret, so this checks the template asks
// for it; TestChartUpgradeOnKube upgrades a release on an API server.
func TestChartKeepsAPIKey(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(moduleRoot(t), "deploy", "helm", "orchard", "templates", "secrets.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`lookup "v1" "Secret" .Release.Namespace $name`, "randAlphaNum 40"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("secrets.yaml does not contain %q", want)
		}
	}
	a, err := render(t, releaseNS)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := render(t, releaseNS, "--set", "auth.apiKeys={k1,k2}")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b2, []byte("API_KEYS: azEsazI=")) { // base64("k1,k2")
		t.Errorf("given keys not rendered:\n%s", b2)
	}
	if bytes.Equal(a, b2) {
		t.Error("given keys changed nothing")
	}
}

// TestValuesDocumented checks values.yaml in helm-docs style: every value
// has a "# --" comment above it or above a map that holds it.
func TestValuesDocumented(t *testing.T) {
	t.Parallel()
	path := filepath.Join(moduleRoot(t), "deploy", "helm", "orchard", "values.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	type key struct {
		indent     int
		documented bool
	}
	var stack []key
	documented := false // the comment block just above has "# --"
	for i, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "":
			documented = false
			continue
		case strings.HasPrefix(trimmed, "#"):
			documented = documented || strings.HasPrefix(trimmed, "# --")
			continue
		case strings.HasPrefix(trimmed, "- "):
			continue
		}
		name, value, ok := strings.Cut(trimmed, ":")
		if !ok {
			continue
		}
		indent := len(line) - len(strings.TrimLeft(line, " "))
		for len(stack) > 0 && stack[len(stack)-1].indent >= indent {
			stack = stack[:len(stack)-1]
		}
		inherited := false
		for _, k := range stack {
			inherited = inherited || k.documented
		}
		if strings.TrimSpace(value) != "" && !documented && !inherited {
			t.Errorf("values.yaml:%d: %s has no \"# --\" comment", i+1, name)
		}
		stack = append(stack, key{indent, documented})
		documented = false
	}
}

func TestChartLint(t *testing.T) {
	t.Parallel()
	chart := filepath.Join(moduleRoot(t), "deploy", "helm", "orchard")
	out, err := exec.Command(helmBin(t), "lint", "--strict", chart, "--namespace", releaseNS).CombinedOutput()
	if err != nil {
		t.Errorf("helm lint --strict: %v\n%s", err, out)
	}
}
