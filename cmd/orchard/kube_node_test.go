package main

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/internal/testing/kubetest"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// On a real node (scripts/kube.sh up --node), a sandbox is a real pod
// started from the locally built shell image, its agent copied in by the
// init container: exec, files and the PTY work through the server over
// the pod network, with the agent's token.
func TestServeOnKubeNode(t *testing.T) {
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
