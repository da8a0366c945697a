package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/orchard/orchard/internal/testing/kubetest"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// startKubeServer runs `orchard serve --runtime kube` on a fresh namespace
// of the test cluster, its sandboxes on kwok's simulated node.
func startKubeServer(t testing.TB, extra ...string) (*testserver.Process, kubernetes.Interface, string) {
	t.Helper()
	cs := kubetest.Client(t) // skips without a cluster
	ns := kubetest.Namespace(t, cs)
	return startKubeServerIn(t, ns, extra...), cs, ns
}

// startKubeServerIn runs `orchard serve --runtime kube` on namespace ns
// (several servers may share one), with extra environment.
func startKubeServerIn(t testing.TB, ns string, extra ...string) *testserver.Process {
	t.Helper()
	env := append([]string{
		"ORCHARD_RUNTIME=kube",
		"KUBECONFIG=" + kubeconfigPath(),
		"SANDBOX_NAMESPACE=" + ns,
		"ORCHARD_KUBE_AGENT_IMAGE=orchard.local/agent:dev",
		"ORCHARD_KUBE_SHELL_IMAGE=orchard.local/shell:dev",
		"ORCHARD_KUBE_NODE_SELECTOR=type=kwok",
		"ORCHARD_KUBE_TOLERATIONS=kwok.x-k8s.io/node:NoSchedule",
	}, extra...)
	return testserver.StartProcess(t, testserver.ProcessOptions{Env: env})
}

func kubeconfigPath() string { return os.Getenv(kubetest.EnvKubeconfig) }

// call makes one API request and decodes a JSON answer into out (if
// non-nil); it returns the status.
func call(ctx context.Context, p *testserver.Process, method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.URL+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-API-Key", testserver.APIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: %v: %s", method, path, err, raw)
		}
	}
	if resp.StatusCode >= 300 {
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, nil
}

// The REST API on the kube runtime: sandboxes become pods, wait returns
// once kwok reports them ready, delete removes them, and the API calls the
// runtime made show in orchard_kube_api_requests_total.
func TestServeOnKube(t *testing.T) {
	p, cs, ns := startKubeServer(t)
	ctx := t.Context()
	var ids []string
	for range 3 {
		var sb struct {
			ID string `json:"sandbox_id"`
		}
		if _, err := call(ctx, p, "POST", "/sandboxes", map[string]any{"image": "orchard.local/shell:dev", "block_network": true, "labels": map[string]string{"suite": "kube"}}, &sb); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	for _, id := range ids {
		var got struct {
			Ready  bool   `json:"ready"`
			Status string `json:"status"`
			Image  string `json:"image"`
		}
		if _, err := call(ctx, p, "GET", "/sandboxes/"+id+"/wait?timeout=60", nil, &got); err != nil {
			t.Fatal(err)
		}
		pod, err := cs.CoreV1().Pods(ns).Get(ctx, "sandbox-"+id, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("sandbox %s has no pod: %v", id, err)
		}
		if pod.Labels["suite"] != "kube" || pod.Spec.Containers[0].Image != "orchard.local/shell:dev" {
			t.Errorf("pod %s: labels %v image %s", pod.Name, pod.Labels, pod.Spec.Containers[0].Image)
		}
	}
	// /resources reports the cluster's sandbox nodes (the node selector's:
	// kwok's simulated node), less what the sandboxes request.
	var res struct {
		Nodes []struct {
			Name        string `json:"name"`
			Allocatable struct {
				CPU float64 `json:"cpu"`
			} `json:"allocatable"`
		} `json:"nodes"`
		Available struct {
			CPU float64 `json:"cpu"`
		} `json:"available"`
	}
	if _, err := call(ctx, p, "GET", "/resources", nil, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Nodes) != 1 || res.Nodes[0].Name != "kwok-node-0" || res.Nodes[0].Allocatable.CPU != 64 || res.Available.CPU != 64-3*4 {
		t.Errorf("/resources = %+v; want kwok-node-0 with 64 cpus, 52 available", res)
	}
	for _, id := range ids {
		if _, err := call(ctx, p, "DELETE", "/sandboxes/"+id, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	awaitNoPods(t, cs, ns)
	calls := kubeCalls(t, p)
	if calls["create pods"] != 3 || calls["delete pods"] != 3 || calls["get pods"] != 0 {
		t.Errorf("API calls %v: want 3 pod creates, 3 deletes, no gets", calls)
	}
}

// awaitNoPods waits until namespace ns holds no pod that is not being
// deleted.
func awaitNoPods(t testing.TB, cs kubernetes.Interface, ns string) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		live := slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil })
		if len(live) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pods left in %s after delete", len(live), ns)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var kubeLine = regexp.MustCompile(`^orchard_kube_api_requests_total\{resource="([^"]+)",status="([^"]+)",verb="([^"]+)"\} ([0-9.e+]+)$`)

// kubeCalls reads orchard_kube_api_requests_total from the server's
// /metrics, keyed "verb resource".
func kubeCalls(t testing.TB, p *testserver.Process) map[string]int {
	t.Helper()
	req, _ := http.NewRequest("GET", p.URL+"/metrics", nil)
	req.Header.Set("X-API-Key", testserver.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if m := kubeLine.FindStringSubmatch(sc.Text()); m != nil {
			n, _ := strconv.ParseFloat(m[4], 64)
			out[m[3]+" "+m[1]] += int(n)
			out[m[3]+" "+m[1]+" "+m[2]] += int(n)
		}
	}
	return out
}

// BenchmarkKubeCreate1000 creates 1,000 sandboxes at once through the
// REST API on kwok's simulated node, waits until every one is ready, then
// deletes them: the time, the success rate and the API server calls per
// sandbox. Each asks for 50m of cpu and 64Mi of memory, so that the
// simulated node (64 cores, 256Gi) holds all of them. Run with
//
//	ORCHARD_TEST_KUBECONFIG=... go test -run '^$' -bench KubeCreate1000 -benchtime 1x ./cmd/orchard
func BenchmarkKubeCreate1000(b *testing.B) {
	const n = 1000
	p, _, _ := startKubeServer(b)
	ctx := context.Background()
	for range b.N {
		before := kubeCalls(b, p)
		start := time.Now()
		ids := make([]string, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var sb struct {
					ID string `json:"sandbox_id"`
				}
				if _, errs[i] = call(ctx, p, "POST", "/sandboxes", map[string]any{"image": "orchard.local/shell:dev", "block_network": true, "cpu": "50m", "memory": "64Mi"}, &sb); errs[i] != nil {
					return
				}
				ids[i] = sb.ID
				_, errs[i] = call(ctx, p, "GET", "/sandboxes/"+sb.ID+"/wait?timeout=120", nil, nil)
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		ok := 0
		for _, err := range errs {
			if err == nil {
				ok++
			} else if ok == 0 {
				b.Log(err)
			}
		}
		for i := range n {
			if ids[i] == "" {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = call(ctx, p, "DELETE", "/sandboxes/"+ids[i], nil, nil)
			}()
		}
		wg.Wait()
		after := kubeCalls(b, p)
		diff := func(k string) float64 { return float64(after[k]-before[k]) / n }
		b.ReportMetric(elapsed.Seconds(), "s/1000-ready")
		b.ReportMetric(float64(ok)/n*100, "%ready")
		b.ReportMetric(diff("create pods")+diff("delete pods"), "writes/sandbox")
		b.ReportMetric(diff("create pods 2xx")+diff("delete pods 2xx"), "accepted-writes/sandbox")
		b.Logf("API calls for %d sandboxes: %v", n, func() map[string]int {
			d := map[string]int{}
			for k, v := range after {
				if v-before[k] != 0 {
					d[k] = v - before[k]
				}
			}
			return d
		}())
		b.ReportMetric(diff("get pods")+diff("list pods"), "reads/sandbox")
	}
}
