package kube

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/retry"
	"github.com/orchard/orchard/runtime"
)

// The fake clientset stands in for the API server only where a real one
// cannot be made to fail on cue: rate limiting, server errors, conflicts
// and refused permissions. Everything else runs against a real API server
// (kube_test.go).

var podsGR = schema.GroupResource{Resource: "pods"}

// fakeCluster is a clientset with the namespace and a permission review
// that allows everything but deny ("verb resource").
func fakeCluster(deny ...string) *fake.Clientset {
	cs := fake.NewClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: DefaultNamespace}})
	cs.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, kruntime.Object, error) {
		rev := a.(k8stesting.CreateAction).GetObject().(*authzv1.SelfSubjectAccessReview)
		ra := rev.Spec.ResourceAttributes
		rev.Status.Allowed = true
		for _, d := range deny {
			if d == ra.Verb+" "+ra.Resource {
				rev.Status.Allowed = false
			}
		}
		return true, rev, nil
	})
	return cs
}

func fastAPI() retry.Policy {
	return retry.Policy{Attempts: 4, Initial: time.Millisecond, Max: 2 * time.Millisecond}
}

func newFake(t *testing.T, cs *fake.Clientset) *Runtime {
	t.Helper()
	r, err := New(t.Context(), cs, Config{AgentImage: "orchard.local/agent:dev", Images: map[string]string{"shell": "busybox:1"}, API: fastAPI()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// kubelet plays the node's part on the fake: once the sandbox's pod
// exists, it runs and is ready.
func kubelet(t *testing.T, cs *fake.Clientset, id string) {
	go func() {
		for range 500 {
			pod, err := cs.CoreV1().Pods(DefaultNamespace).Get(context.Background(), podName(id), metav1.GetOptions{})
			if err == nil {
				pod.Status.Phase = corev1.PodRunning
				pod.Status.PodIP = "10.1.2.3"
				pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
				if _, err := cs.CoreV1().Pods(DefaultNamespace).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{}); err == nil {
					return
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
}

func TestStartupErrors(t *testing.T) {
	tests := []struct {
		name string
		cs   *fake.Clientset
		want []string
	}{
		{"missing permissions", fakeCluster("watch pods", "create networkpolicies", "get secrets"),
			[]string{"RBAC", "watch pods", "create networkpolicies.networking.k8s.io", "get secrets", DefaultNamespace}},
		{"no namespace", fake.NewClientset(), []string{`namespace "sandbox-pods" does not exist`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(t.Context(), tt.cs, Config{AgentImage: "a:1"})
			if err == nil {
				t.Fatal("New succeeded")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	if _, err := New(t.Context(), fakeCluster(), Config{}); err == nil || !strings.Contains(err.Error(), "agent image") {
		t.Errorf("New without an agent image = %v", err)
	}
}

func TestCreateAPIErrors(t *testing.T) {
	tests := []struct {
		name     string
		fail     func(n int) error // the n-th create's error (1-based); nil passes
		wantCode string            // "" = success
		wantN    int32             // creates sent
	}{
		{"rate limited, then accepted", func(n int) error {
			if n <= 2 {
				return apierrors.NewTooManyRequests("slow down", 0)
			}
			return nil
		}, "", 3},
		{"server errors until the retries end", func(int) error {
			return apierrors.NewInternalError(context.DeadlineExceeded)
		}, faults.CodeKubeAPI, 4},
		{"timeouts until the retries end", func(int) error {
			return apierrors.NewServerTimeout(podsGR, "create", 1)
		}, faults.CodeKubeAPI, 4},
		{"conflict: the pod of an earlier attempt", func(n int) error {
			if n == 1 {
				return apierrors.NewAlreadyExists(podsGR, "sandbox-x")
			}
			return nil
		}, "", 1},
		{"forbidden is not retried", func(int) error {
			return apierrors.NewForbidden(podsGR, "sandbox-x", nil)
		}, faults.CodeMisconfigured, 1},
		{"invalid is the client's", func(int) error {
			return apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "sandbox-x", nil)
		}, faults.CodeCreateFailed, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := fakeCluster()
			var n atomic.Int32
			cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, kruntime.Object, error) {
				if err := tt.fail(int(n.Add(1))); err != nil {
					if apierrors.IsAlreadyExists(err) {
						// The first attempt did create the pod.
						obj := a.(k8stesting.CreateAction).GetObject()
						_ = cs.Tracker().Create(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, obj, DefaultNamespace)
					}
					return true, nil, err
				}
				return false, nil, nil
			})
			r := newFake(t, cs)
			id := "x"
			kubelet(t, cs, id)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			inst, err := r.Create(ctx, runtime.Spec{ID: id, Kind: "shell"})
			if got := n.Load(); got != tt.wantN {
				t.Errorf("%d creates sent, want %d", got, tt.wantN)
			}
			if tt.wantCode == "" {
				if err != nil {
					t.Fatalf("Create: %v", err)
				}
				if !strings.HasPrefix(inst.AgentAddr, "http://orchard:") || !strings.HasSuffix(inst.AgentAddr, "@10.1.2.3:7070") {
					t.Errorf("agent address %q", inst.AgentAddr)
				}
				return
			}
			if f := faults.Of(err); err == nil || f.Code != tt.wantCode {
				t.Fatalf("Create = %v (%s), want %s", err, f.Code, tt.wantCode)
			}
		})
	}
}

// Deleting retries like creating, and a pod already gone is no error.
func TestDeleteAPIErrors(t *testing.T) {
	cs := fakeCluster()
	var n atomic.Int32
	cs.PrependReactor("delete", "pods", func(k8stesting.Action) (bool, kruntime.Object, error) {
		if n.Add(1) == 1 {
			return true, nil, apierrors.NewServiceUnavailable("restarting")
		}
		return true, nil, apierrors.NewNotFound(podsGR, "sandbox-y")
	})
	r := newFake(t, cs)
	if err := r.Delete(t.Context(), "y"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if n.Load() != 2 {
		t.Errorf("%d deletes sent, want 2", n.Load())
	}
}
