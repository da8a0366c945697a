// Package kubetest gives tests a real Kubernetes API server: the cluster
// `scripts/kube.sh up` starts, named by ORCHARD_TEST_KUBECONFIG (the test
// command sets it). Without it a test skips, or fails when
// ORCHARD_TEST_REQUIRE asks for "kube". Each test gets a namespace of its
// own.
package kubetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/orchard/orchard/internal/testing/testenv"
)

// Environment the test command sets after scripts/kube.sh up.
const (
	EnvKubeconfig = "ORCHARD_TEST_KUBECONFIG"
	// EnvShellImage and EnvAgentImage are set when the cluster has a real
	// node (scripts/kube.sh up --node) with these images loaded.
	EnvShellImage = "ORCHARD_TEST_KUBE_SHELL_IMAGE"
	EnvAgentImage = "ORCHARD_TEST_KUBE_AGENT_IMAGE"
)

// KwokToleration lets a pod onto kwok's simulated node.
var KwokToleration = corev1.Toleration{Key: "kwok.x-k8s.io/node", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}

// KwokSelector places a pod on kwok's simulated node.
var KwokSelector = map[string]string{"type": "kwok"}

// Config returns the cluster's client configuration.
func Config(t testing.TB) *rest.Config {
	t.Helper()
	path := os.Getenv(EnvKubeconfig)
	testenv.Require(t, "kube", path != "", EnvKubeconfig+" is not set (scripts/kube.sh up prints the kubeconfig)")
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", path, err)
	}
	cfg.QPS, cfg.Burst = 500, 1000
	return cfg
}

// Client returns a clientset of the cluster.
func Client(t testing.TB) kubernetes.Interface {
	t.Helper()
	cfg := Config(t)
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Its connections close with the test: packages that check for
	// leaked goroutines would find their read loops.
	t.Cleanup(func() { utilnet.CloseIdleConnectionsFor(hc.Transport) })
	cs, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// Node returns the shell and agent images of the cluster's real node, or
// skips (fails when "kube-node" is required) when it has none.
func Node(t testing.TB) (shell, agent string) {
	t.Helper()
	shell, agent = os.Getenv(EnvShellImage), os.Getenv(EnvAgentImage)
	testenv.Require(t, "kube-node", shell != "" && agent != "", EnvShellImage+" and "+EnvAgentImage+" are not set (scripts/kube.sh up --node)")
	return shell, agent
}

// Namespace creates a namespace for the test, with the default service
// account pods are admitted under, and deletes it (and its pods) after.
func Namespace(t testing.TB, cs kubernetes.Interface) string {
	t.Helper()
	ctx := context.Background()
	ns := fmt.Sprintf("orchard-test-%08x", rand.Uint32())
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	_, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create service account: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		zero := int64(0)
		_ = cs.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		_ = cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	})
	return ns
}
