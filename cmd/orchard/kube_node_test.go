package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/internal/testing/kubetest"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// startNodeServer runs `orchard serve --runtime kube` on a fresh
// namespace of the real node (scripts/kube.sh up --node); it skips
// without one. It returns the server and the node's shell image.
func startNodeServer(t testing.TB) (*testserver.Process, string, kubernetes.Interface, string) {
	t.Helper()
	shell, agentImage := kubetest.Node(t)
	cs := kubetest.Client(t)
	ns := kubetest.Namespace(t, cs)
	p := testserver.StartProcess(t, testserver.ProcessOptions{Env: []string{
		"ORCHARD_RUNTIME=kube",
		"KUBECONFIG=" + kubeconfigPath(),
		"SANDBOX_NAMESPACE=" + ns,
		"ORCHARD_KUBE_AGENT_IMAGE=" + agentImage,
		"ORCHARD_KUBE_SHELL_IMAGE=" + shell,
	}})
	return p, shell, cs, ns
}

// On a real node (scripts/kube.sh up --node), a sandbox is a real pod
// started from the locally built shell image, its agent copied in by the
// init container: exec, files and the PTY work through the server over
// the pod network, with the agent's token.
func TestServeOnKubeNode(t *testing.T) {
	p, shell, _, _ := startNodeServer(t)
	ctx := t.Context()
	var sb struct {
		ID string `json:"sandbox_id"`
	}
	if _, err := call(ctx, p, "POST", "/sandboxes", map[string]any{"image": shell, "block_network": true, "cpu": "500m", "memory": "256Mi"}, &sb); err != nil {
		t.Fatal(err)
	}
	if _, err := call(ctx, p, "GET", "/sandboxes/"+sb.ID+"/wait?timeout=120", nil, nil); err != nil {
		t.Fatal(err)
	}

	// exec, with wait.
	var job struct {
		ExitCode *int   `json:"exit_code"`
		Stdout   string `json:"stdout"`
		Status   string `json:"status"`
		Stderr   string `json:"stderr"`
		Error    any    `json:"error"`
	}
	if _, err := call(ctx, p, "POST", "/sandboxes/"+sb.ID+"/exec",
		map[string]any{"command": "echo hello from $(hostname); pwd", "wait": true}, &job); err != nil {
		t.Fatal(err)
	}
	if job.ExitCode == nil || *job.ExitCode != 0 || !strings.Contains(job.Stdout, "hello from sandbox-"+sb.ID) || !strings.Contains(job.Stdout, "/workspace") {
		raw, _ := json.Marshal(job)
		t.Fatalf("exec = %s (exit %v)", raw, job.ExitCode)
	}

	// files: upload, download, list.
	content := base64.StdEncoding.EncodeToString([]byte("kube file\n"))
	if _, err := call(ctx, p, "POST", "/sandboxes/"+sb.ID+"/files", map[string]any{"path": "/workspace/a.txt", "content": content}, nil); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Content string `json:"content"`
	}
	if _, err := call(ctx, p, "GET", "/sandboxes/"+sb.ID+"/files?path=/workspace/a.txt", nil, &got); err != nil {
		t.Fatal(err)
	}
	if got.Content != content {
		t.Fatalf("download = %q, want %q", got.Content, content)
	}
	var list struct {
		Files []struct {
			Name string `json:"name"`
		} `json:"files"`
	}
	if _, err := call(ctx, p, "GET", "/sandboxes/"+sb.ID+"/files/list?path=/workspace", nil, &list); err != nil || len(list.Files) != 1 || list.Files[0].Name != "a.txt" {
		t.Fatalf("list = %+v, %v", list, err)
	}

	// PTY.
	ws := "ws" + strings.TrimPrefix(p.URL, "http") + "/sandboxes/" + sb.ID + "/exec/pty"
	conn, _, err := websocket.DefaultDialer.DialContext(ctx, ws, http.Header{"X-API-Key": {testserver.APIKey}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	if err := conn.WriteJSON(api.PTYInitFrame{Type: api.PTYInit, Cmd: []string{"sh", "-c", "echo pty-$((6*7))"}, Env: map[string]string{}, Rows: 24, Cols: 80}); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for {
		_, msg, err := conn.ReadMessage()
		if err != nil {
			t.Fatalf("pty: %v (output %q)", err, out.String())
		}
		var f struct {
			Type string `json:"type"`
			Data []byte `json:"data"`
			Code *int   `json:"exit_code"`
		}
		_ = json.Unmarshal(msg, &f)
		if f.Type == api.PTYStdout {
			out.Write(f.Data)
		}
		if f.Type == api.PTYExit || f.Type == api.PTYError {
			break
		}
	}
	if !strings.Contains(out.String(), "pty-42") {
		t.Errorf("pty output %q", out.String())
	}

	if _, err := call(ctx, p, "DELETE", "/sandboxes/"+sb.ID, nil, nil); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkKubeNodeVsLocal measures, in one run, create-to-ready (POST
// /sandboxes, then /wait) and the exec round trip (`true`, wait=true)
// through `orchard serve` on the real node (scripts/kube.sh up --node)
// and on the local runtime, each the median of sequential calls, and
// their ratios. Run with
//
//	ORCHARD_TEST_KUBECONFIG=... ORCHARD_TEST_KUBE_SHELL_IMAGE=... ORCHARD_TEST_KUBE_AGENT_IMAGE=... \
//	  go test -run '^$' -bench KubeNodeVsLocal -benchtime 1x ./cmd/orchard
func BenchmarkKubeNodeVsLocal(b *testing.B) {
	const creates, execs = 10, 100
	kube, shell, cs, ns := startNodeServer(b)
	// The local runtime runs the very image the node runs, from the
	// archive kube.sh imported into containerd.
	archive := filepath.Join(filepath.Dir(kubeconfigPath()), "images.tar")
	if _, err := os.Stat(archive); err != nil {
		b.Skipf("no image archive beside the kubeconfig: %v", err)
	}
	local := testserver.StartProcess(b, testserver.ProcessOptions{Env: []string{"ORCHARD_IMAGE_DIRS=" + filepath.Dir(archive)}})
	ctx := b.Context()
	measure := func(p *testserver.Process, body map[string]any) (ready, exec time.Duration) {
		var readies, rts []time.Duration
		var keep string
		for i := range creates {
			start := time.Now()
			var sb struct {
				ID string `json:"sandbox_id"`
			}
			if _, err := call(ctx, p, "POST", "/sandboxes", body, &sb); err != nil {
				b.Fatal(err)
			}
			if _, err := call(ctx, p, "GET", "/sandboxes/"+sb.ID+"/wait?timeout=120", nil, nil); err != nil {
				b.Fatal(err)
			}
			readies = append(readies, time.Since(start))
			if i == 0 {
				keep = sb.ID
				continue
			}
			if _, err := call(ctx, p, "DELETE", "/sandboxes/"+sb.ID, nil, nil); err != nil {
				b.Fatal(err)
			}
			if p == kube {
				podGone(b, cs, ns, "sandbox-"+sb.ID)
			}
		}
		for range execs {
			var job struct {
				ExitCode *int `json:"exit_code"`
			}
			start := time.Now()
			if _, err := call(ctx, p, "POST", "/sandboxes/"+keep+"/exec", map[string]any{"command": "true", "wait": true}, &job); err != nil {
				b.Fatal(err)
			}
			if job.ExitCode == nil || *job.ExitCode != 0 {
				b.Fatalf("exec true: exit %v", job.ExitCode)
			}
			rts = append(rts, time.Since(start))
		}
		_, _ = call(ctx, p, "DELETE", "/sandboxes/"+keep, nil, nil)
		return median(readies), median(rts)
	}
	// The floor: a bare pod of the same image (no init container, no
	// agent) created with client-go until the kubelet reports it Ready.
	// Every pod is gone before the next is created, as a deleted pod holds
	// its cpu request on the two-core node until then.
	bare := func() time.Duration {
		var ds []time.Duration
		for i := range creates {
			name := fmt.Sprintf("bare-%d", i)
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: shell, Command: []string{"sleep", "3600"},
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}}}},
					TerminationGracePeriodSeconds: new(int64)}}
			w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			for ev := range w.ResultChan() {
				if p, ok := ev.Object.(*corev1.Pod); ok && podReady(p) {
					break
				}
			}
			ds = append(ds, time.Since(start))
			w.Stop()
			if err := cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
				b.Fatal(err)
			}
			podGone(b, cs, ns, name)
		}
		return median(ds)
	}
	for range b.N {
		floor := bare()
		b.ReportMetric(float64(floor.Milliseconds()), "bare-pod-ready-p50-ms")
		kr, ke := measure(kube, map[string]any{"image": shell, "block_network": true, "cpu": "500m", "memory": "256Mi"})
		lr, le := measure(local, map[string]any{"image": "docker-archive:" + archive + ":" + shell, "block_network": true, "cpu": "500m", "memory": "256Mi"})
		b.ReportMetric(float64(kr.Milliseconds()), "kube-ready-p50-ms")
		b.ReportMetric(float64(lr.Milliseconds()), "local-ready-p50-ms")
		b.ReportMetric(float64(ke.Microseconds())/1000, "kube-exec-p50-ms")
		b.ReportMetric(float64(le.Microseconds())/1000, "local-exec-p50-ms")
		b.ReportMetric(float64(kr)/float64(lr), "ready-kube/local")
		b.ReportMetric(float64(kr)/float64(floor), "ready-kube/bare-pod")
		b.ReportMetric(float64(ke)/float64(le), "exec-kube/local")
	}
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// podGone waits until pod name no longer exists.
func podGone(b *testing.B, cs kubernetes.Interface, ns, name string) {
	b.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := cs.CoreV1().Pods(ns).Get(b.Context(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("pod %s still there a minute after its delete (%v)", name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
