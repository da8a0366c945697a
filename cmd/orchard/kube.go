package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/harness"
	"github.com/orchard/orchard/metrics"
	"github.com/orchard/orchard/runtime/kube"
)

// kubeConcurrentCreates is MAX_CONCURRENT_CREATES's default with the
// kube runtime.
const kubeConcurrentCreates = 1000

// KubeConfig is the Kubernetes runtime's settings (--runtime kube).
type KubeConfig struct {
	Kubeconfig string // --kubeconfig / KUBECONFIG; empty: in-cluster
	AgentImage string // --kube-agent-image / ORCHARD_KUBE_AGENT_IMAGE
	// HarnessImage (ORCHARD_KUBE_HARNESS_IMAGE) holds a harness store
	// generation, mounted into sandbox pods that ask for harnesses;
	// Harnesses (ORCHARD_KUBE_HARNESSES, comma-separated) names what it holds.
	HarnessImage string
	Harnesses    string
	ShellImage   string // ORCHARD_KUBE_SHELL_IMAGE: the default image of shell sandboxes
	BrowserImage string // ORCHARD_KUBE_BROWSER_IMAGE
	DesktopImage string // ORCHARD_KUBE_DESKTOP_IMAGE
	// NodeSelector (ORCHARD_KUBE_NODE_SELECTOR, "k=v,k=v") and Tolerations
	// (ORCHARD_KUBE_TOLERATIONS, "key[=value]:Effect,...") place sandboxes
	// on a sandbox node pool.
	NodeSelector string
	Tolerations  string
	// PullSecrets (ORCHARD_KUBE_PULL_SECRETS, comma-separated) are the
	// image pull secrets of sandbox pods.
	PullSecrets string
	// SandboxTTL is the server's default sandbox lifetime (SANDBOX_TTL_HOURS),
	// the pods' activeDeadlineSeconds backstop when a create names no TTL.
	SandboxTTL time.Duration
}

// loadEnv reads the environment; a flag given on the command line wins
// over its variable, and only over that one.
func (k *KubeConfig) loadEnv(str func(string, *string), flagSet func(string) bool) {
	if !flagSet("kubeconfig") {
		str("KUBECONFIG", &k.Kubeconfig)
	}
	if !flagSet("kube-agent-image") {
		str("ORCHARD_KUBE_AGENT_IMAGE", &k.AgentImage)
	}
	str("ORCHARD_KUBE_SHELL_IMAGE", &k.ShellImage)
	str("ORCHARD_KUBE_BROWSER_IMAGE", &k.BrowserImage)
	str("ORCHARD_KUBE_DESKTOP_IMAGE", &k.DesktopImage)
	str("ORCHARD_KUBE_NODE_SELECTOR", &k.NodeSelector)
	str("ORCHARD_KUBE_TOLERATIONS", &k.Tolerations)
	str("ORCHARD_KUBE_PULL_SECRETS", &k.PullSecrets)
	str("ORCHARD_KUBE_HARNESS_IMAGE", &k.HarnessImage)
	str("ORCHARD_KUBE_HARNESSES", &k.Harnesses)
}

// runtimeConfig is the kube runtime's Config for namespace ns.
func (k KubeConfig) runtimeConfig(ns string, log *slog.Logger) (kube.Config, error) {
	cfg := kube.Config{Namespace: ns, AgentImage: k.AgentImage, Log: log.With("runtime", "kube"),
		Images: map[string]string{api.KindShell: k.ShellImage, api.KindBrowser: k.BrowserImage, api.KindDesktop: k.DesktopImage}}
	if k.AgentImage == "" {
		return cfg, fmt.Errorf("kube runtime: set the agent image (--kube-agent-image or ORCHARD_KUBE_AGENT_IMAGE)")
	}
	cfg.HarnessImage, cfg.Harnesses = k.HarnessImage, split(k.Harnesses)
	for _, n := range cfg.Harnesses {
		if _, ok := harness.Known(n); !ok {
			return cfg, fmt.Errorf("ORCHARD_KUBE_HARNESSES: unknown harness %q", n)
		}
	}
	sel, err := pairs(k.NodeSelector, "=")
	if err != nil {
		return cfg, fmt.Errorf("ORCHARD_KUBE_NODE_SELECTOR: %w", err)
	}
	cfg.NodeSelector = sel
	for _, t := range split(k.Tolerations) {
		tol, err := toleration(t)
		if err != nil {
			return cfg, fmt.Errorf("ORCHARD_KUBE_TOLERATIONS: %w", err)
		}
		cfg.Tolerations = append(cfg.Tolerations, tol)
	}
	cfg.ImagePullSecrets = split(k.PullSecrets)
	cfg.DefaultTTL = k.SandboxTTL
	return cfg, nil
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func pairs(s, sep string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	m := map[string]string{}
	for _, f := range split(s) {
		k, v, ok := strings.Cut(f, sep)
		if !ok || k == "" {
			return nil, fmt.Errorf("%q: want key%svalue", f, sep)
		}
		m[k] = v
	}
	return m, nil
}

// toleration parses "key[=value]:Effect" (Exists when no value is given).
func toleration(s string) (corev1.Toleration, error) {
	kv, effect, ok := strings.Cut(s, ":")
	switch corev1.TaintEffect(effect) {
	case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
	default:
		return corev1.Toleration{}, fmt.Errorf("%q: want key[=value]:NoSchedule|PreferNoSchedule|NoExecute", s)
	}
	if !ok || kv == "" {
		return corev1.Toleration{}, fmt.Errorf("%q: no key", s)
	}
	t := corev1.Toleration{Effect: corev1.TaintEffect(effect), Operator: corev1.TolerationOpExists}
	if k, v, ok := strings.Cut(kv, "="); ok {
		t.Key, t.Value, t.Operator = k, v, corev1.TolerationOpEqual
	} else {
		t.Key = kv
	}
	return t, nil
}

// newKubeRuntime connects to the cluster (the kubeconfig, or the pod's
// service account in a cluster) and starts the runtime.
func newKubeRuntime(ctx context.Context, k KubeConfig, ns string, m *metrics.Metrics, log *slog.Logger) (*kube.Runtime, error) {
	cfg, err := k.runtimeConfig(ns, log)
	if err != nil {
		return nil, err
	}
	var rc *rest.Config
	if k.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", k.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kube runtime: cluster configuration (set KUBECONFIG outside a cluster): %w", err)
	}
	// Creates come in bursts (a trainer starts hundreds of sandboxes at
	// once): client-go's default of 5 per second would queue them.
	rc.QPS, rc.Burst = 200, 400
	rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return kube.CountRequests(rt, func(verb, resource string, code int) {
			m.ObserveKubeAPI(verb, resource, kube.StatusClass(code))
		})
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube runtime: %w", err)
	}
	return kube.New(ctx, cs, cfg)
}
