package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/kubetest"
	"github.com/orchard/orchard/runtime"
)

// These tests run against a real API server with kwok's simulated node
// (scripts/kube.sh up): kwok makes a scheduled pod Running, with an IP
// and Ready, as a kubelet would, without containers. Where a test needs a
// kubelet's failures, it writes the pod's status itself.

// kwokRuntime is a runtime on a fresh namespace whose pods go to kwok.
func kwokRuntime(t *testing.T, cs kubernetes.Interface, ns string, edit func(*Config)) *Runtime {
	t.Helper()
	cfg := Config{Namespace: ns, AgentImage: "orchard.local/agent:dev", Images: map[string]string{"shell": "orchard.local/shell:dev"},
		NodeSelector: kubetest.KwokSelector, Tolerations: []corev1.Toleration{kubetest.KwokToleration}}
	if edit != nil {
		edit(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := New(ctx, cs, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func create(t *testing.T, r *Runtime, spec runtime.Spec) runtime.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	inst, err := r.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create %s: %v", spec.ID, err)
	}
	t.Cleanup(func() { _ = r.Delete(context.Background(), spec.ID) })
	return inst
}

func TestLifecycleOnAPIServer(t *testing.T) {
	cs := kubetest.Client(t)
	ns := kubetest.Namespace(t, cs)
	r := kwokRuntime(t, cs, ns, nil)
	spec := runtime.Spec{ID: "life1", Kind: "shell", CPU: 0.5, MemoryBytes: 256 << 20, TTLSeconds: 60,
		Env: map[string]string{"FOO": "bar"}, Labels: map[string]string{"team": "rl", "not a label": "kept in the spec"}}
	inst := create(t, r, spec)
	if !inst.Alive || inst.ID != "life1" || !strings.Contains(inst.AgentAddr, ":7070") {
		t.Fatalf("Create = %+v", inst)
	}

	pod, err := cs.CoreV1().Pods(ns).Get(t.Context(), "sandbox-life1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Labels[LabelSandbox] != "life1" || pod.Labels[LabelKind] != "shell" || pod.Labels["team"] != "rl" || pod.Labels[LabelManagedBy] != ManagedBy {
		t.Errorf("labels %v", pod.Labels)
	}
	if sp, ok := specOf(pod); !ok || sp.Labels["not a label"] != "kept in the spec" || sp.TTLSeconds != 60 {
		t.Errorf("spec annotation %q", pod.Annotations[AnnotationSpec])
	}
	if got := inst.AgentAddr; !strings.HasSuffix(got, "@"+pod.Status.PodIP+":7070") {
		t.Errorf("agent address %q, pod IP %s", got, pod.Status.PodIP)
	}
	init := pod.Spec.InitContainers
	if len(init) != 1 || init[0].Image != "orchard.local/agent:dev" || !slices.Equal(init[0].Command, []string{"/orchard-agent", "install", "/.orchard/bin/orchard-agent"}) {
		t.Errorf("init containers %+v", init)
	}
	c := pod.Spec.Containers[0]
	if c.Image != "orchard.local/shell:dev" || c.Command[0] != "/.orchard/bin/orchard-agent" || !c.VolumeMounts[0].ReadOnly {
		t.Errorf("sandbox container %+v", c)
	}
	// The pod holds the token's hash, never the token.
	tok := r.token("life1")
	raw, _ := json.Marshal(pod)
	if strings.Contains(string(raw), tok) {
		t.Error("the pod spec holds the agent's token")
	}
	if i := slices.Index(c.Command, "--token-sha256"); i < 0 || c.Command[i+1] != tokenHash(tok) {
		t.Errorf("command %v lacks the token's hash", c.Command)
	}
	if !strings.Contains(inst.AgentAddr, ":"+tok+"@") {
		t.Error("the agent address does not carry the token")
	}
	wantRes := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi")}
	for _, l := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
		for k, v := range wantRes {
			if q := l[k]; q.Cmp(v) != 0 {
				t.Errorf("%s = %s, want %s", k, q.String(), v.String())
			}
		}
	}
	if d := pod.Spec.ActiveDeadlineSeconds; d == nil || *d != 60+300 {
		t.Errorf("activeDeadlineSeconds %v, want 360", d)
	}
	if a := pod.Spec.AutomountServiceAccountToken; a == nil || *a {
		t.Error("the sandbox gets a service-account token")
	}
	if !slices.Contains(c.Env, corev1.EnvVar{Name: "FOO", Value: "bar"}) {
		t.Errorf("env %v", c.Env)
	}

	got, err := r.Inspect(t.Context(), "life1")
	if err != nil || !got.Alive || got.AgentAddr != inst.AgentAddr {
		t.Fatalf("Inspect = %+v, %v", got, err)
	}
	list, _ := r.List(t.Context())
	if !slices.ContainsFunc(list, func(i runtime.Instance) bool { return i.ID == "life1" }) {
		t.Fatalf("List = %v", list)
	}
	if err := r.Delete(t.Context(), "life1"); err != nil {
		t.Fatal(err)
	}
	// Read-your-writes: Inspect and List read the informer, and a Delete
	// that has returned must already show there.
	if _, err := r.Inspect(t.Context(), "life1"); !faults.Is(err, faults.CodeSandboxNotFound) {
		t.Fatalf("Inspect right after Delete = %v; want %s", err, faults.CodeSandboxNotFound)
	}
	if list, _ := r.List(t.Context()); slices.ContainsFunc(list, func(i runtime.Instance) bool { return i.ID == "life1" }) {
		t.Fatalf("List right after Delete = %v", list)
	}
	if err := r.Delete(t.Context(), "life1"); err != nil {
		t.Errorf("second Delete = %v", err)
	}
	if _, err := r.Inspect(t.Context(), "nobody"); !faults.Is(err, faults.CodeSandboxNotFound) {
		t.Errorf("Inspect(unknown) = %v", err)
	}
}

func TestNetworkPolicies(t *testing.T) {
	cs := kubetest.Client(t)
	ns := kubetest.Namespace(t, cs)
	r := kwokRuntime(t, cs, ns, nil)
	deny, err := cs.NetworkingV1().NetworkPolicies(ns).Get(t.Context(), PolicyDenyAll, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(deny.Spec.PodSelector.MatchLabels) != 0 || len(deny.Spec.PolicyTypes) != 2 || len(deny.Spec.Ingress)+len(deny.Spec.Egress) != 0 {
		t.Errorf("deny-all policy %+v", deny.Spec)
	}
	access, err := cs.NetworkingV1().NetworkPolicies(ns).Get(t.Context(), PolicyAgentAccess, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	in := access.Spec.Ingress
	if len(in) != 1 || in[0].Ports[0].Port.IntValue() != 7070 || in[0].From[0].PodSelector.MatchLabels["app.kubernetes.io/name"] != "orchard-server" {
		t.Errorf("agent access policy %+v", access.Spec)
	}
	// A second start finds them as they are.
	kwokRuntime(t, cs, ns, nil)

	create(t, r, runtime.Spec{ID: "full1", NetworkMode: runtime.NetworkFull})
	p, err := cs.NetworkingV1().NetworkPolicies(ns).Get(t.Context(), "sandbox-full1-egress", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("full egress sandbox has no policy: %v", err)
	}
	eg := p.Spec.Egress[0].To[0].IPBlock
	if p.Spec.PodSelector.MatchLabels[LabelSandbox] != "full1" || eg.CIDR != "0.0.0.0/0" || !slices.Contains(eg.Except, "169.254.0.0/16") || !slices.Contains(eg.Except, "10.0.0.0/8") {
		t.Errorf("egress policy %+v", p.Spec)
	}
	if err := r.Delete(t.Context(), "full1"); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.NetworkingV1().NetworkPolicies(ns).Get(t.Context(), "sandbox-full1-egress", metav1.GetOptions{}); err == nil {
		t.Error("the egress policy outlived its sandbox")
	}
	// A proxied sandbox needs no policy of its own.
	create(t, r, runtime.Spec{ID: "proxy1"})
	if _, err := cs.NetworkingV1().NetworkPolicies(ns).Get(t.Context(), "sandbox-proxy1-egress", metav1.GetOptions{}); err == nil {
		t.Error("a proxied sandbox got an egress policy")
	}
}

// manualNode is a node nobody runs: the scheduler places pods on it, and
// the test writes their status as its kubelet would. Its taint keeps off
// the pods of other tests sharing the cluster, which nothing would run.
func manualNode(t *testing.T, cs kubernetes.Interface) map[string]string {
	t.Helper()
	name := fmt.Sprintf("manual-%d", time.Now().UnixNano()%1e9)
	sel := map[string]string{"orchard-test/node": name}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: sel},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "orchard-test/manual", Effect: corev1.TaintEffectNoSchedule}}}}
	if _, err := cs.CoreV1().Nodes().Create(t.Context(), node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A node controller (with up --node) may write the node meanwhile.
	for i := 0; ; i++ {
		n, err := cs.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Allocatable = corev1.ResourceList{corev1.ResourcePods: resource.MustParse("100"),
			corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("16Gi")}
		n.Status.Capacity = n.Status.Allocatable
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
		if _, err = cs.CoreV1().Nodes().UpdateStatus(t.Context(), n, metav1.UpdateOptions{}); err == nil {
			break
		} else if i == 5 {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = cs.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	return sel
}

// playKubelet waits for sandbox id's pod to be scheduled and writes status
// onto it.
func playKubelet(t *testing.T, cs kubernetes.Interface, ns, id string, status func(*corev1.PodStatus)) {
	go func() {
		for range 1000 {
			pod, err := cs.CoreV1().Pods(ns).Get(context.Background(), podName(id), metav1.GetOptions{})
			if err == nil && pod.Spec.NodeName != "" {
				status(&pod.Status)
				if _, err := cs.CoreV1().Pods(ns).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{}); err == nil {
					return
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
}

func waiting(name, reason, msg string) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, Image: "img", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}}
}

func terminatedWith(name, reason string, code int32) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: reason, ExitCode: code}}}
}

// Failures are classified where Kubernetes reports them, and the pod of a
// sandbox that failed to start is deleted.
func TestCreateFailuresClassified(t *testing.T) {
	cs := kubetest.Client(t)
	ns := kubetest.Namespace(t, cs)
	sel := manualNode(t, cs)
	// The API server taints a new node not-ready, and a node controller
	// (when one runs) unreachable, since no kubelet posts its status: the
	// sandboxes tolerate everything.
	any := corev1.Toleration{Operator: corev1.TolerationOpExists}
	r := kwokRuntime(t, cs, ns, func(c *Config) { c.NodeSelector = sel; c.Tolerations = []corev1.Toleration{any} })
	tests := []struct {
		name   string
		status func(*corev1.PodStatus)
		code   string
	}{
		{"image not found", func(s *corev1.PodStatus) {
			s.Phase = corev1.PodPending
			s.ContainerStatuses = []corev1.ContainerStatus{waiting(containerName, "ErrImagePull", "rpc error: docker.io/library/nope:1: not found")}
		}, faults.CodeImageNotFound},
		{"image pull failing", func(s *corev1.PodStatus) {
			s.Phase = corev1.PodPending
			s.ContainerStatuses = []corev1.ContainerStatus{waiting(containerName, "ImagePullBackOff", "dial tcp: i/o timeout")}
		}, faults.CodeImagePull},
		{"agent image pull failing", func(s *corev1.PodStatus) {
			s.Phase = corev1.PodPending
			s.InitContainerStatuses = []corev1.ContainerStatus{waiting(initName, "ErrImagePull", "connection refused")}
		}, faults.CodeImagePull},
		{"invalid image name", func(s *corev1.PodStatus) {
			s.Phase = corev1.PodPending
			s.ContainerStatuses = []corev1.ContainerStatus{waiting(containerName, "InvalidImageName", "bad")}
		}, faults.CodeImageRef},
		{"out of memory", func(s *corev1.PodStatus) {
			s.Phase = corev1.PodFailed
			s.ContainerStatuses = []corev1.ContainerStatus{terminatedWith(containerName, "OOMKilled", 137)}
		}, faults.CodeOOM},
		{"evicted", func(s *corev1.PodStatus) {
			s.Phase, s.Reason, s.Message = corev1.PodFailed, "Evicted", "The node was low on resource: memory."
		}, faults.CodeSandboxEvicted},
		{"agent exited", func(s *corev1.PodStatus) {
			s.Phase = corev1.PodFailed
			s.ContainerStatuses = []corev1.ContainerStatus{terminatedWith(containerName, "Error", 2)}
		}, faults.CodeSandboxDied},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := fmt.Sprintf("fail%d", i)
			playKubelet(t, cs, ns, id, tt.status)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			_, err := r.Create(ctx, runtime.Spec{ID: id})
			if f := faults.Of(err); err == nil || f.Code != tt.code {
				t.Fatalf("Create = %v (%s), want %s", err, f.Code, tt.code)
			}
			pod, err := cs.CoreV1().Pods(ns).Get(t.Context(), podName(id), metav1.GetOptions{})
			if err == nil && pod.DeletionTimestamp == nil {
				t.Errorf("the failed sandbox's pod is still there")
			}
		})
	}
	t.Run("unschedulable", func(t *testing.T) {
		r := kwokRuntime(t, cs, ns, func(c *Config) { c.NodeSelector = map[string]string{"orchard-test/node": "none"} })
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		_, err := r.Create(ctx, runtime.Spec{ID: "nowhere"})
		if f := faults.Of(err); err == nil || f.Code != faults.CodeCapacity || !f.Retryable {
			t.Fatalf("Create = %v (%+v), want a retryable %s", err, f, faults.CodeCapacity)
		}
	})
	t.Run("died after start", func(t *testing.T) {
		playKubelet(t, cs, ns, "later", func(s *corev1.PodStatus) {
			s.Phase, s.PodIP = corev1.PodRunning, "10.9.9.9"
			s.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		})
		create(t, r, runtime.Spec{ID: "later"})
		playKubelet(t, cs, ns, "later", func(s *corev1.PodStatus) {
			s.Phase, s.Reason, s.Message = corev1.PodFailed, "Evicted", "disk pressure"
		})
		deadline := time.Now().Add(10 * time.Second)
		for {
			inst, err := r.Inspect(t.Context(), "later")
			if err == nil && !inst.Alive {
				if !strings.HasPrefix(inst.Reason, "evicted") {
					t.Errorf("reason %q", inst.Reason)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Inspect = %+v, %v; want dead", inst, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	t.Run("bad image refused before a pod", func(t *testing.T) {
		for _, img := range []string{"host", "Not A Valid::Reference", "oci-layout:/x"} {
			_, err := r.Create(t.Context(), runtime.Spec{ID: "badimg", Image: img})
			if f := faults.Of(err); f.Code != faults.CodeImageRef {
				t.Errorf("image %q: %v", img, err)
			}
		}
		if _, err := cs.CoreV1().Pods(ns).Get(t.Context(), "sandbox-badimg", metav1.GetOptions{}); err == nil {
			t.Error("a pod was made for a bad image")
		}
	})
}

// A restarted server (a new runtime) finds every sandbox from the informer,
// with the same agent address and its spec.
func TestRestartRebuilds(t *testing.T) {
	cs := kubetest.Client(t)
	ns := kubetest.Namespace(t, cs)
	r1 := kwokRuntime(t, cs, ns, nil)
	inst := create(t, r1, runtime.Spec{ID: "keep1", Labels: map[string]string{"a": "b"}, TTLSeconds: 30})
	r1.Close()
	r2 := kwokRuntime(t, cs, ns, nil)
	got, err := r2.Inspect(t.Context(), "keep1")
	if err != nil || got.AgentAddr != inst.AgentAddr || got.Spec.Labels["a"] != "b" || got.Spec.TTLSeconds != 30 {
		t.Fatalf("after restart: %+v, %v (was %+v)", got, err, inst)
	}
}

// countingTransport counts the API calls the runtime makes, by method.
type countingTransport struct {
	rt     http.RoundTripper
	mu     sync.Mutex
	counts map[string]int
	on     atomic.Bool
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.on.Load() {
		m := r.Method
		if r.URL.Query().Get("watch") == "true" {
			m = "WATCH"
		}
		c.mu.Lock()
		c.counts[m]++
		c.mu.Unlock()
	}
	return c.rt.RoundTrip(r)
}

// A sandbox's lifecycle is two writes to the API server, and no reads:
// waiting and inspecting read the informer.
func TestAPICallsPerLifecycle(t *testing.T) {
	cfg := kubetest.Config(t)
	ct := &countingTransport{counts: map[string]int{}}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { ct.rt = rt; return ct }
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ns := kubetest.Namespace(t, kubetest.Client(t))
	r := kwokRuntime(t, cs, ns, nil)
	ct.on.Store(true)
	const n = 5
	for i := range n {
		id := fmt.Sprintf("count%d", i)
		create(t, r, runtime.Spec{ID: id})
		if _, err := r.Inspect(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		if _, err := r.List(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := r.Delete(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	ct.on.Store(false)
	ct.mu.Lock()
	defer ct.mu.Unlock()
	if ct.counts["POST"] != n || ct.counts["DELETE"] != n || ct.counts["GET"] != 0 || ct.counts["PUT"]+ct.counts["PATCH"] != 0 {
		t.Errorf("API calls for %d lifecycles: %v; want %d POST, %d DELETE, nothing else", n, ct.counts, n, n)
	}
}
