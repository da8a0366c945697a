package deploy_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/client"
	"github.com/orchard/orchard/internal/testing/kubetest"
	"github.com/orchard/orchard/internal/testing/testenv"
)

// EnvDeployBrowser adds orchard-browser to TestDeployOnKubeNode: its build
// (Chromium and fonts) and push cost about as much as the rest of the test.
const EnvDeployBrowser = "ORCHARD_TEST_DEPLOY_BROWSER"

// TestDeployOnKubeNode deploys Orchard the way docs/deploy.md tells a user
// to, on the real node of scripts/kube.sh up --node: build-and-push.sh
// builds the images and pushes them to a registry on loopback (the node's
// containerd pulls from 127.0.0.1 over plain HTTP without configuration),
// deploy-orchard.sh installs the chart from it, test-deployment.sh passes
// through the deployed server, and a shell sandbox of the orchard-shell
// image runs exec, file transfers and apply_patch (git in the image). The
// uninstall must leave no pod, NetworkPolicy or Secret behind.
//
// The cluster has no kube-proxy, so the kubernetes Service routes nowhere
// and the API server listens on loopback only: the server runs with
// server.hostNetwork and KUBERNETES_SERVICE_HOST/PORT naming that
// loopback address (its serving certificate covers 127.0.0.1). The store
// is a redis-server on loopback, which the server reaches through the
// node's network too (the in-chart Redis's image would come from Docker
// Hub); one replica, since replicas on the host network share one node.
func TestDeployOnKubeNode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and pushes three images: minutes")
	}
	kubetest.Node(t) // skips without a real node
	cfg := kubetest.Config(t)
	cs := kubetest.Client(t)
	helm := helmBin(t)
	kc := kubectl()
	testenv.Require(t, "kube-node", kc != "", "no kubectl (scripts/kube.sh build --all)")
	for _, tool := range []string{"go", "curl", "git"} {
		_, err := exec.LookPath(tool)
		testenv.Require(t, "kube-node", err == nil, tool+" is not on PATH")
	}
	apiURL, err := url.Parse(cfg.Host)
	if err != nil || apiURL.Port() == "" {
		t.Fatalf("API server address %q: %v", cfg.Host, err)
	}
	root := moduleRoot(t)
	aks := filepath.Join(root, "deploy", "aks")

	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	regHost := strings.TrimPrefix(reg.URL, "http://")

	suffix := fmt.Sprintf("%06x", rand.Uint32()>>8)
	rel := "orchard-e2e-" + suffix
	ns, sandboxNS := rel, rel+"-sandboxes"
	repo, tag := regHost+"/orchard", "e2e-"+suffix
	serverPort, localPort := freePort(t), freePort(t)
	dir := t.TempDir()
	env := append(os.Environ(),
		"KUBECONFIG="+os.Getenv(kubetest.EnvKubeconfig),
		"PATH="+filepath.Dir(kc)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"HELM="+helm,
		"REGISTRY="+repo, "TAG="+tag,
		"RELEASE="+rel, "NAMESPACE="+ns, "SANDBOX_NAMESPACE="+sandboxNS,
		"TIMEOUT=5m",
	)
	// Whatever happens, nothing of the release stays: the script's own
	// uninstall is checked below, this is for a test that stops early.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_ = exec.CommandContext(ctx, helm, "uninstall", rel, "--namespace", ns, "--ignore-not-found",
			"--kubeconfig", os.Getenv(kubetest.EnvKubeconfig)).Run()
		zero := int64(0)
		for _, n := range []string{sandboxNS, ns} {
			_ = cs.CoreV1().Pods(n).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
			_ = cs.CoreV1().Namespaces().Delete(ctx, n, metav1.DeleteOptions{})
		}
	})

	// The store is an external Redis with a password, the production
	// shape: deploy-orchard.sh keeps the password in a Secret of its own,
	// which the uninstall must remove too.
	redisServer := testenv.StartRedis(t)
	redisPassword := fmt.Sprintf("pw-%08x", rand.Uint32())
	rdb := redis.NewClient(&redis.Options{Addr: redisServer.Addr()})
	if err := rdb.ConfigSet(context.Background(), "requirepass", redisPassword).Err(); err != nil {
		t.Fatalf("redis: set a password: %v", err)
	}
	rdb.Close()
	rdb = redis.NewClient(&redis.Options{Addr: redisServer.Addr(), Password: redisPassword})
	t.Cleanup(func() { rdb.Close() })
	env = append(env, "REDIS_URL="+redisServer.URL(), "REDIS_PASSWORD="+redisPassword)

	images := []string{"orchard-server", "orchard-agent", "orchard-shell"}
	browser := os.Getenv(EnvDeployBrowser) == "1"
	if browser {
		images = append(images, "orchard-browser")
	}

	// 1. Build and push.
	digestFile := filepath.Join(dir, "digests")
	start := time.Now()
	out := script(t, env, filepath.Join(aks, "build-and-push.sh"), append([]string{"DIGESTS=" + digestFile}, images...)...)
	t.Logf("build-and-push.sh: %d images in %s", len(images), time.Since(start).Round(time.Second))
	digests := map[string]string{}
	pushed, err := os.ReadFile(digestFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Fields(string(pushed)) {
		ref, digest, ok := strings.Cut(line, "@")
		if !ok || !strings.HasPrefix(digest, "sha256:") || !strings.HasPrefix(ref, repo+"/") {
			t.Fatalf("digest line %q, want %s/NAME@sha256:...", line, repo)
		}
		digests[strings.TrimPrefix(ref, repo+"/")] = digest
		t.Logf("pushed %s", line)
	}
	for _, name := range images {
		if digests[name] == "" || !strings.Contains(out, repo+"/"+name+"@"+digests[name]) {
			t.Fatalf("no digest of %s in %s; output:\n%s", name, pushed, out)
		}
	}

	// 2. Install.
	values := filepath.Join(dir, "values.yaml")
	browserValue := `""`
	if browser {
		browserValue = "orchard-browser"
	}
	writeFile(t, values, fmt.Sprintf(`replicaCount: 1
tests: {enabled: false}
image: {browser: %s, desktop: ""}
server:
  port: %d
  hostNetwork: true
  preStopSleepSeconds: 0
  resources: {requests: {cpu: 100m, memory: 128Mi}, limits: {memory: 1Gi}}
  extraEnv:
  - {name: KUBERNETES_SERVICE_HOST, value: %q}
  - {name: KUBERNETES_SERVICE_PORT, value: %q}
sandbox: {defaultCPU: 500m, defaultMemory: 1Gi, defaultEphemeralStorage: 1Gi}
`, browserValue, serverPort, apiURL.Hostname(), apiURL.Port()))
	start = time.Now()
	script(t, append(env, "VALUES="+values), filepath.Join(aks, "deploy-orchard.sh"))
	t.Logf("deploy-orchard.sh: installed in %s", time.Since(start).Round(time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	checkServerImage(ctx, t, cs, ns, repo, tag, digests["orchard-server"])

	// 3. The smoke test of a user's deployment.
	start = time.Now()
	out = script(t, append(env, "LOCAL_PORT="+strconv.Itoa(localPort), "READY_TIMEOUT=180"),
		filepath.Join(aks, "test-deployment.sh"))
	for _, want := range []string{"ok: health", "ok: exec", "ok: write file", "ok: read file", "smoke test passed"} {
		if !strings.Contains(out, want) {
			t.Errorf("test-deployment.sh: no %q in its output:\n%s", want, out)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "==> ok: ") || strings.HasPrefix(line, "==> skipped: ") {
			t.Logf("test-deployment.sh: %s", strings.TrimPrefix(line, "==> "))
		}
	}
	if browser && !strings.Contains(out, "ok: browser step") {
		t.Errorf("test-deployment.sh: no browser step in its output:\n%s", out)
	}
	t.Logf("test-deployment.sh: passed in %s", time.Since(start).Round(time.Second))
	stored, err := rdb.Keys(ctx, "orchard:*").Result()
	if err != nil || len(stored) == 0 {
		t.Errorf("redis: %d keys of the server, %v; want its records", len(stored), err)
	}
	t.Logf("redis: %d keys of the server", len(stored))

	// 4. A shell sandbox of orchard-shell through the deployed server.
	secret, err := cs.CoreV1().Secrets(ns).Get(ctx, rel+"-api-keys", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("API key secret: %v", err)
	}
	key, _, _ := strings.Cut(strings.TrimSpace(string(secret.Data["API_KEYS"])), ",")
	c := client.New(fmt.Sprintf("http://127.0.0.1:%d", serverPort), key)
	start = time.Now()
	shellSandbox(ctx, t, c, cs, sandboxNS, repo+"/orchard-shell:"+tag)
	t.Logf("shell sandbox: exec, files and apply_patch in %s", time.Since(start).Round(time.Second))

	// 5. Uninstall: nothing of Orchard is left.
	start = time.Now()
	script(t, env, filepath.Join(aks, "deploy-orchard.sh"), "--uninstall")
	checkGone(ctx, t, cs, ns, sandboxNS, rel)
	t.Logf("uninstall: nothing left after %s", time.Since(start).Round(time.Second))
}

// script runs a deploy/aks script with env and args (NAME=VALUE arguments
// are added to the environment) and returns its stdout and stderr; a
// failure fails the test with both.
func script(t *testing.T, env []string, path string, args ...string) string {
	t.Helper()
	var rest []string
	for _, a := range args {
		if strings.Contains(a, "=") && !strings.HasPrefix(a, "-") {
			env = append(env, a)
		} else {
			rest = append(rest, a)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, rest...)
	cmd.Env = env
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(path), strings.Join(rest, " "), err, buf.String())
	}
	return buf.String()
}

// checkServerImage checks that the server pod runs the pushed image: its
// image ID is the digest build-and-push.sh printed.
func checkServerImage(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, repo, tag, digest string) {
	t.Helper()
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=orchard-server"})
	if err != nil {
		t.Fatalf("list server pods: %v", err)
	}
	if len(pods.Items) != 1 {
		t.Fatalf("%d server pods, want 1", len(pods.Items))
	}
	p := pods.Items[0]
	if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != 1 || !p.Status.ContainerStatuses[0].Ready {
		t.Fatalf("server pod %s: phase %s, statuses %+v", p.Name, p.Status.Phase, p.Status.ContainerStatuses)
	}
	// The status's image name is not checked: the builder's images are
	// reproducible, and containerd reports the name it first stored a
	// digest under, which may be another run's.
	st := p.Status.ContainerStatuses[0]
	if want := repo + "/orchard-server:" + tag; p.Spec.Containers[0].Image != want {
		t.Errorf("server image %s, want %s", p.Spec.Containers[0].Image, want)
	}
	if !strings.HasSuffix(st.ImageID, "@"+digest) {
		t.Errorf("server image ID %s, want the pushed %s", st.ImageID, digest)
	}
	t.Logf("server pod %s on %s runs %s", p.Name, p.Spec.NodeName, st.ImageID)
}

const patchedScript = `print("hello from the patched script")
`

// shellSandbox creates a sandbox of the server's default shell image and
// drives it through the API: exec sees git and python3, an upload comes
// back unchanged, a patch applies with git and changes what runs, a patch
// that does not apply is a result, not an error.
func shellSandbox(ctx context.Context, t *testing.T, c *client.Client, cs kubernetes.Interface, sandboxNS, image string) {
	t.Helper()
	created, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{BlockNetwork: client.Ptr(true), TTLSeconds: client.Ptr(900)})
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	id := created.SandboxID
	defer func() {
		if err := c.DeleteSandbox(context.Background(), id); err != nil {
			t.Errorf("delete sandbox %s: %v", id, err)
		}
	}()
	sb, err := c.WaitSandbox(ctx, id, 3*time.Minute)
	if err != nil || sb.Status != "ready" {
		t.Fatalf("wait sandbox %s: %+v, %v", id, sb, err)
	}
	pod, err := cs.CoreV1().Pods(sandboxNS).Get(ctx, sb.PodName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("sandbox %s's pod %q: %v", id, sb.PodName, err)
	}
	var images []string
	for _, ctr := range pod.Spec.Containers {
		images = append(images, ctr.Image)
	}
	if !strings.Contains(strings.Join(images, " "), image) {
		t.Errorf("sandbox pod %s runs %v, want %s", pod.Name, images, image)
	}

	run := func(command string) api.Job {
		t.Helper()
		job, err := c.Exec(ctx, id, api.ExecRequest{Command: client.Command(command), Wait: true})
		if err != nil {
			t.Fatalf("exec %q: %v", command, err)
		}
		return job
	}
	job := run("git --version && python3 --version && bash -c 'echo bash $BASH_VERSION' && id -u")
	if job.ExitCode == nil || *job.ExitCode != 0 || !strings.Contains(job.Stdout, "git version 2.") ||
		!strings.Contains(job.Stdout, "Python 3.") || !strings.Contains(job.Stdout, "bash 5.") {
		t.Fatalf("exec in %s: %+v", image, job)
	}
	t.Logf("exec: %s", strings.Join(strings.Fields(job.Stdout), " "))

	original := "print(\"hello\")\n"
	if _, err := c.Upload(ctx, id, "/workspace/hello.py", []byte(original)); err != nil {
		t.Fatalf("upload: %v", err)
	}
	got, err := c.Download(ctx, id, "/workspace/hello.py")
	if err != nil || string(got) != original {
		t.Fatalf("download: %q, %v; want %q", got, err, original)
	}

	patch := "diff --git a/hello.py b/hello.py\n--- a/hello.py\n+++ b/hello.py\n@@ -1 +1 @@\n" +
		"-print(\"hello\")\n+" + strings.TrimSuffix(patchedScript, "\n") + "\n"
	res, err := c.ApplyPatch(ctx, id, patch, time.Minute)
	if err != nil || !res.Success {
		t.Fatalf("apply_patch: %+v, %v", res, err)
	}
	job = run("python3 /workspace/hello.py")
	if strings.TrimSpace(job.Stdout) != "hello from the patched script" {
		t.Fatalf("patched script: %+v", job)
	}
	got, err = c.Download(ctx, id, "/workspace/hello.py")
	if err != nil || string(got) != patchedScript {
		t.Fatalf("download after patch: %q, %v; want %q", got, err, patchedScript)
	}
	// The same patch again no longer applies: git says so, the file stays.
	res, err = c.ApplyPatch(ctx, id, patch, time.Minute)
	if err != nil || res.Success || res.ExitCode == nil || *res.ExitCode == 0 {
		t.Fatalf("apply_patch twice: %+v, %v; want a failed result", res, err)
	}
	refusal, _, _ := strings.Cut(res.Stderr, "\n")
	t.Logf("apply_patch: applied, then refused: %s", refusal)
}

// checkGone waits for the uninstall's effects: the sandbox namespace (the
// chart's) is gone with everything in it, the release namespace holds no
// pod, NetworkPolicy or Secret, and no cluster-wide object names the
// release. Then it removes the release namespace, which helm never does.
func checkGone(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, sandboxNS, rel string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		_, err := cs.CoreV1().Namespaces().Get(ctx, sandboxNS, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			left, _ := cs.CoreV1().Pods(sandboxNS).List(ctx, metav1.ListOptions{})
			t.Fatalf("namespace %s still there 3 min after the uninstall (%v); %d pods in it", sandboxNS, err, len(left.Items))
		}
		time.Sleep(time.Second)
	}
	for _, n := range []string{ns, sandboxNS} {
		pods, err := cs.CoreV1().Pods(n).List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) != 0 {
			t.Errorf("namespace %s: %d pods left, %v", n, len(pods.Items), err)
		}
		pols, err := cs.NetworkingV1().NetworkPolicies(n).List(ctx, metav1.ListOptions{})
		if err != nil || len(pols.Items) != 0 {
			t.Errorf("namespace %s: %d NetworkPolicies left, %v", n, len(pols.Items), err)
		}
		secrets, err := cs.CoreV1().Secrets(n).List(ctx, metav1.ListOptions{})
		if err != nil || len(secrets.Items) != 0 {
			t.Errorf("namespace %s: %d Secrets left, %v", n, len(secrets.Items), err)
		}
	}
	sel := metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + rel}
	if crs, err := cs.RbacV1().ClusterRoles().List(ctx, sel); err != nil || len(crs.Items) != 0 {
		t.Errorf("%d ClusterRoles of %s left, %v", len(crs.Items), rel, err)
	}
	if crbs, err := cs.RbacV1().ClusterRoleBindings().List(ctx, sel); err != nil || len(crbs.Items) != 0 {
		t.Errorf("%d ClusterRoleBindings of %s left, %v", len(crbs.Items), rel, err)
	}
	if err := cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Errorf("delete namespace %s: %v", ns, err)
	}
}

// freePort returns a TCP port nothing listens on now, on any address.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
