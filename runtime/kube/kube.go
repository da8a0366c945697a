// Package kube is the Kubernetes runtime: a sandbox is one pod,
// sandbox-<id>, in the sandbox namespace. An init container copies the
// static agent from the agent image into an emptyDir; the user's image then
// runs it as PID 1, so any image works. The server reaches the agent over
// the pod network with a per-sandbox bearer token (see token.go).
//
// The hot path never reads the API server: an informer on the namespace
// keeps every sandbox pod in memory, and Create waits, and Inspect and List
// answer, from it. A sandbox's lifecycle costs two API writes (create and
// delete); a sandbox with full egress adds its NetworkPolicy's two.
package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/retry"
	"github.com/orchard/orchard/runtime"
)

// Labels and annotations of sandbox pods.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "orchard"
	LabelSandbox   = "orchard.dev/sandbox"
	LabelKind      = "orchard.dev/kind"
	// AnnotationSpec holds the sandbox's runtime.Spec as JSON, so that a
	// restarted server can rebuild its record.
	AnnotationSpec = "orchard.dev/spec"
)

// Defaults of Config.
const (
	DefaultNamespace = "sandbox-pods"
	DefaultAgentPort = 7070
	// agentDir is where the init container puts the agent, read-only in
	// the sandbox's container.
	agentDir  = "/.orchard/bin"
	agentPath = agentDir + "/orchard-agent"
)

// Config is the runtime's settings.
type Config struct {
	// Namespace holds the sandbox pods. Default DefaultNamespace. It must
	// exist: the runtime does not create namespaces.
	Namespace string
	// AgentImage holds the static agent at /orchard-agent (required).
	AgentImage string
	// Images are the default images per sandbox kind (api.KindShell, ...),
	// used when a create names none.
	Images map[string]string
	// NodeSelector, Tolerations and ImagePullSecrets place sandbox pods on
	// a sandbox node pool and let them pull private images.
	NodeSelector     map[string]string
	Tolerations      []corev1.Toleration
	ImagePullSecrets []string
	// PullPolicy of the sandbox and agent images; "" lets Kubernetes
	// choose (IfNotPresent for tagged images).
	PullPolicy corev1.PullPolicy
	// AgentPort is the port agents listen on. Default DefaultAgentPort.
	AgentPort int
	// ServerPods selects the pods (in any namespace) that may reach the
	// agents' port. Default app.kubernetes.io/name=orchard-server.
	ServerPods map[string]string
	// WorkingDir is the sandbox container's working directory, created by
	// the container runtime. Default /workspace.
	WorkingDir string
	// DeleteGrace is the grace period of a deleted pod. Default 2 s: the
	// agent stops its commands at once on SIGTERM.
	DeleteGrace time.Duration
	// TTLGrace is added to a sandbox's ttl_seconds to make the pod's
	// activeDeadlineSeconds, a backstop for the server's own cleanup.
	// Default 5 minutes.
	TTLGrace time.Duration
	// DefaultTTL stands for ttl_seconds when a create names none (the
	// server's SANDBOX_TTL_HOURS), so that no pod outlives every server
	// that could delete it. 0: such pods get no deadline.
	DefaultTTL time.Duration
	// API retries the API server's transient refusals (429, 5xx,
	// timeouts). Default: 6 attempts within 30 s.
	API retry.Policy
	// MaxInflightWrites bounds the pod creates and deletes in flight to
	// the API server. Default 64: a thousand creates at once would
	// otherwise meet the API server's own limit as a storm of 429s, each
	// a wasted write.
	MaxInflightWrites int
	// HarnessImage holds a harness store generation at its root (built by
	// `go run ./deploy/images --store DIR orchard-harnesses`): sandboxes
	// that ask for harnesses get it as a read-only image volume at
	// harness.MountPath. Empty: no harnesses.
	HarnessImage string
	// Harnesses names the harnesses HarnessImage holds.
	Harnesses []string
	// Log receives the runtime's logs. Default: discarded.
	Log *slog.Logger
}

func (c *Config) defaults() error {
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.AgentImage == "" {
		return errors.New("kube runtime: no agent image (--kube-agent-image)")
	}
	if c.AgentPort == 0 {
		c.AgentPort = DefaultAgentPort
	}
	if c.ServerPods == nil {
		c.ServerPods = map[string]string{"app.kubernetes.io/name": "orchard-server"}
	}
	if c.WorkingDir == "" {
		c.WorkingDir = "/workspace"
	}
	if c.DeleteGrace == 0 {
		c.DeleteGrace = 2 * time.Second
	}
	if c.TTLGrace == 0 {
		c.TTLGrace = 5 * time.Minute
	}
	if c.API.Attempts == 0 {
		c.API = retry.Policy{Attempts: 6, Budget: 30 * time.Second, Initial: 100 * time.Millisecond, Max: 5 * time.Second}
	}
	c.API.Retryable = transient
	if c.MaxInflightWrites == 0 {
		c.MaxInflightWrites = 64
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Runtime runs sandboxes as pods. It implements runtime.Runtime and
// runtime.Closer.
type Runtime struct {
	cs   kubernetes.Interface
	cfg  Config
	key  []byte // derives agent tokens (token.go)
	pods corelisters.PodNamespaceLister
	stop chan struct{}
	// writes holds a slot per API write in flight (MaxInflightWrites).
	writes chan struct{}

	// probe asks agents for /health while their pods start (probeAgent).
	probe *http.Client

	mu      sync.Mutex
	waiters map[string]chan struct{} // pod name → closed on its next event
}

// New checks what the runtime needs of the cluster (the namespace, the
// permissions), makes the namespace's network policies and the agent key,
// and starts the informer; it returns once the informer has synced.
func New(ctx context.Context, cs kubernetes.Interface, cfg Config) (*Runtime, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if err := checkNamespace(ctx, cs, cfg.Namespace); err != nil {
		return nil, err
	}
	if err := checkAccess(ctx, cs, cfg.Namespace); err != nil {
		return nil, err
	}
	if err := ensurePolicies(ctx, cs, cfg); err != nil {
		return nil, err
	}
	key, err := agentKey(ctx, cs, cfg.Namespace)
	if err != nil {
		return nil, err
	}
	r := &Runtime{cs: cs, cfg: cfg, key: key, stop: make(chan struct{}), writes: make(chan struct{}, cfg.MaxInflightWrites),
		waiters: map[string]chan struct{}{},
		// No proxy from the environment (pod IPs are direct) and no kept
		// connections: each probe is to a pod that has just started.
		probe: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}}
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelManagedBy + "=" + ManagedBy }))
	inf := f.Core().V1().Pods()
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    r.notifyObj,
		UpdateFunc: func(_, o any) { r.notifyObj(o) },
		DeleteFunc: r.notifyObj,
	}); err != nil {
		return nil, fmt.Errorf("kube runtime: informer: %w", err)
	}
	r.pods = inf.Lister().Pods(cfg.Namespace)
	f.Start(r.stop)
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			close(r.stop)
			return nil, fmt.Errorf("kube runtime: %v informer did not sync: %w", typ, context.Cause(ctx))
		}
	}
	return r, nil
}

// Close stops the informer; the pods stay (a restarted server adopts them).
func (r *Runtime) Close() error {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	return nil
}

func podName(id string) string { return "sandbox-" + id }

// notifyObj wakes whoever waits on the pod of an informer event.
func (r *Runtime) notifyObj(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	pod, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	r.mu.Lock()
	if ch, ok := r.waiters[pod.Name]; ok {
		close(ch)
		delete(r.waiters, pod.Name)
	}
	r.mu.Unlock()
}

// changed returns a channel closed at the pod's next informer event.
func (r *Runtime) changed(name string) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch, ok := r.waiters[name]
	if !ok {
		ch = make(chan struct{})
		r.waiters[name] = ch
	}
	return ch
}

// Create makes the sandbox's pod and returns once it is ready: scheduled,
// its agent copied and started, and its readiness probe (the agent's
// /health) passed. A pod that cannot become ready is deleted and its
// failure returned, classified.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Instance, error) {
	pod, err := r.podFor(spec)
	if err != nil {
		return runtime.Instance{}, err
	}
	full := spec.NetworkMode == runtime.NetworkFull && !spec.BlockNetwork
	if full {
		if err := r.createEgressPolicy(ctx, spec.ID); err != nil {
			return runtime.Instance{}, err
		}
	}
	err = r.write(ctx, func(ctx context.Context) error {
		_, err := r.cs.CoreV1().Pods(r.cfg.Namespace).Create(ctx, pod, metav1.CreateOptions{})
		return err
	})
	// A create whose answer was lost and that was sent again finds its
	// own pod: the name is the sandbox's, and ids are unique.
	if err != nil && !apierrors.IsAlreadyExists(err) {
		if full {
			r.deleteEgressPolicy(context.WithoutCancel(ctx), spec.ID)
		}
		return runtime.Instance{}, apiFault(err, "create pod "+pod.Name)
	}
	inst, err := r.awaitReady(ctx, spec.ID)
	if err != nil {
		_ = r.Delete(context.WithoutCancel(ctx), spec.ID)
		return runtime.Instance{}, err
	}
	return inst, nil
}

// write runs an API write with its retries, holding one of the
// MaxInflightWrites slots for each attempt.
func (r *Runtime) write(ctx context.Context, call func(ctx context.Context) error) error {
	return callAPI(ctx, r.cfg.API, func(ctx context.Context) error {
		select {
		case r.writes <- struct{}{}:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		defer func() { <-r.writes }()
		return call(ctx)
	})
}

// awaitReady waits, on the informer, until the sandbox's pod is ready or
// can no longer become so.
func (r *Runtime) awaitReady(ctx context.Context, id string) (runtime.Instance, error) {
	name := podName(id)
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var (
		up       <-chan struct{} // closed once the agent answers our probe
		probing  bool
		answered bool
	)
	for {
		ch := r.changed(name)
		pod, err := r.pods.Get(name)
		if err == nil && answered && failure(pod) == nil && pod.DeletionTimestamp == nil && pod.Status.PodIP != "" {
			return r.instance(pod), nil
		}
		if err == nil && !probing && agentStarted(pod) {
			up, probing = r.probeAgent(ctx, pod.Status.PodIP), true
		}
		if err == nil {
			if f := failure(pod); f != nil {
				return runtime.Instance{}, f
			}
			if pod.DeletionTimestamp != nil {
				return runtime.Instance{}, faults.Newf(faults.CodeSandboxDied, faults.Unavailable, faults.Sandbox,
					"sandbox %s: its pod was deleted while starting", id)
			}
			if ready(pod) {
				return r.instance(pod), nil
			}
		}
		select {
		case <-ch:
		case <-up:
			up, answered = nil, true // the next turn returns, unless the pod failed meanwhile
		case <-ctx.Done():
			cause := context.Cause(ctx)
			if errors.Is(cause, context.DeadlineExceeded) || errors.Is(cause, context.Canceled) {
				what := "not scheduled"
				if pod != nil {
					what = describe(pod)
				}
				return runtime.Instance{}, faults.Wrap(cause, faults.CodeTimeout, faults.Timeout, faults.Platform,
					fmt.Sprintf("sandbox %s did not become ready: %s", id, what))
			}
			return runtime.Instance{}, faults.Of(cause)
		}
	}
}

// Delete removes the sandbox's pod (and its egress policy). Deleting a
// sandbox that does not exist succeeds.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	name := podName(id)
	grace := int64(r.cfg.DeleteGrace / time.Second)
	full := false
	if pod, err := r.pods.Get(name); err == nil {
		if sp, ok := specOf(pod); ok {
			full = sp.NetworkMode == runtime.NetworkFull && !sp.BlockNetwork
		}
	}
	err := r.write(ctx, func(ctx context.Context) error {
		return r.cs.CoreV1().Pods(r.cfg.Namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return apiFault(err, "delete pod "+name)
	}
	if full {
		r.deleteEgressPolicy(ctx, id)
	}
	r.awaitDeleting(ctx, name)
	return nil
}

// informerLag bounds how long Delete waits for the informer to see its own
// delete; past it the delete stands, and only the cache is late.
const informerLag = 5 * time.Second

// awaitDeleting waits until the informer shows the pod gone or being
// deleted, so that Inspect and List, which read the informer, agree with a
// Delete that has returned.
func (r *Runtime) awaitDeleting(ctx context.Context, name string) {
	timer := time.NewTimer(informerLag)
	defer timer.Stop()
	for {
		ch := r.changed(name)
		pod, err := r.pods.Get(name)
		if err != nil || pod.DeletionTimestamp != nil {
			return
		}
		select {
		case <-ch:
		case <-timer.C:
			slog.WarnContext(ctx, "kube runtime: informer has not seen a delete", "pod", name, "waited", informerLag)
			return
		case <-ctx.Done():
			return
		}
	}
}

// Inspect reports the sandbox's pod as the informer last saw it. A pod
// being deleted counts as gone.
func (r *Runtime) Inspect(ctx context.Context, id string) (runtime.Instance, error) {
	pod, err := r.pods.Get(podName(id))
	if err != nil || pod.DeletionTimestamp != nil {
		return runtime.Instance{}, faults.Newf(faults.CodeSandboxNotFound, faults.NotFound, faults.Client, "Sandbox %s not found", id)
	}
	return r.instance(pod), nil
}

// List returns every sandbox pod of the namespace, from the informer.
func (r *Runtime) List(ctx context.Context) ([]runtime.Instance, error) {
	pods, err := r.pods.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	out := make([]runtime.Instance, 0, len(pods))
	for _, p := range pods {
		if p.DeletionTimestamp != nil || p.Labels[LabelSandbox] == "" {
			continue
		}
		out = append(out, r.instance(p))
	}
	return out, nil
}

// instance is pod as the runtime interface reports it.
func (r *Runtime) instance(pod *corev1.Pod) runtime.Instance {
	id := pod.Labels[LabelSandbox]
	// Pending is not dead: this replica's informer can still show a pod
	// as pending that another replica already saw running and recorded
	// ready, and a ready record whose pod reads as dead is failed.
	phase := pod.Status.Phase
	inst := runtime.Instance{ID: id, CreatedAt: pod.CreationTimestamp.Time, Alive: phase == corev1.PodRunning || phase == corev1.PodPending}
	for _, c := range pod.Spec.Containers {
		if c.Name == containerName {
			inst.Image = c.Image
		}
	}
	if pod.Status.PodIP != "" {
		inst.AgentAddr = r.agentAddr(id, pod.Status.PodIP)
	}
	if f := failure(pod); f != nil {
		inst.Alive = false
		inst.Reason = reasonOf(pod, f)
	}
	if sp, ok := specOf(pod); ok {
		inst.Spec = sp
	}
	return inst
}

// ready reports whether the pod runs and passes its readiness probe.
// agentStarted reports whether the pod's sandbox container, which runs
// the agent, has started and the pod has its IP.
func agentStarted(pod *corev1.Pod) bool {
	if pod.Status.PodIP == "" {
		return false
	}
	for _, c := range pod.Status.ContainerStatuses {
		if c.Name == containerName {
			return c.State.Running != nil
		}
	}
	return false
}

// probeAgent asks the agent at ip for /health until it answers, closing
// the returned channel then. The pod's readiness probe tells the same
// through the informer, but the kubelet probes once a second and the
// first probe usually comes before the agent listens: a create would wait
// a second more for nothing. Asking the agent directly is one call on the
// pod network, none on the API server.
func (r *Runtime) probeAgent(ctx context.Context, ip string) <-chan struct{} {
	up := make(chan struct{})
	url := "http://" + net.JoinHostPort(ip, strconv.Itoa(r.cfg.AgentPort)) + "/health"
	go func() {
		b := retry.NewBackoff(agentProbeRetry)
		for {
			err := r.healthOnce(ctx, url)
			if err == nil {
				close(up)
				return
			}
			if b.Wait(ctx, err) != nil {
				return
			}
		}
	}()
	return up
}

// agentProbeRetry spaces the direct health probes: the agent listens
// within milliseconds of its container starting.
var agentProbeRetry = retry.Policy{Initial: 10 * time.Millisecond, Max: 200 * time.Millisecond}

func (r *Runtime) healthOnce(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := r.probe.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("agent health: %s", resp.Status)
	}
	return nil
}

func ready(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
