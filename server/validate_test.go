package server_test

import (
	"fmt"
	"reflect"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/server/manager"
)

// wantInvalid checks a 422 in FastAPI's shape whose detail names loc, with
// the error object's code.
func wantInvalid(t *testing.T, r resp, loc []any, code, typ string) {
	t.Helper()
	want(t, r, 422)
	items, ok := r.body["detail"].([]any)
	if !ok {
		t.Fatalf("detail is not FastAPI's list: %s", r.raw)
	}
	found := false
	for _, it := range items {
		m, _ := it.(map[string]any)
		if reflect.DeepEqual(m["loc"], loc) {
			found = true
			if typ != "" && m["type"] != typ {
				t.Errorf("type %v, want %s: %s", m["type"], typ, r.raw)
			}
			if _, ok := m["msg"].(string); !ok {
				t.Errorf("item without msg: %s", r.raw)
			}
			if _, ok := m["input"]; !ok {
				t.Errorf("item without input: %s", r.raw)
			}
		}
	}
	if !found {
		t.Fatalf("no detail item at %v: %s", loc, r.raw)
	}
	e, _ := r.body["error"].(map[string]any)
	if e["code"] != code || e["category"] != "invalid_request" || e["source"] != "client" || e["retryable"] != false {
		t.Fatalf("error object %v, want code %s, invalid_request, client: %s", e, code, r.raw)
	}
}

// Every field that takes a number, a quantity or a string passed to
// execve refuses what it cannot mean with a 422 naming it, on every route
// that takes it, instead of putting a default in its place; the values at
// the edges of what is allowed still go through.
func TestRequestValidation(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	id := createReady(t, srv, map[string]any{"memory": "256Mi"})
	job := execWait(t, srv, id, map[string]any{"command": "true"}).JobID
	cpus := goruntime.NumCPU()
	host := manager.HostMemory()
	if host <= 0 {
		t.Fatal("no MemTotal in /proc/meminfo")
	}
	create := func(fields map[string]any) map[string]any {
		body := map[string]any{"image": "host", "block_network": true}
		for k, v := range fields {
			body[k] = v
		}
		return body
	}
	task := map[string]any{"id": "validate", "start_url": "about:blank", "question": "q"}
	const ge = "greater_than_equal"
	const limit, invalid = faults.CodeLimitExceeded, faults.CodeValidation

	bad := []struct {
		name, method, path string
		body               any
		loc                []any
		code, typ          string
	}{
		{"memory far above the host", "POST", "/sandboxes", create(map[string]any{"memory": "99999Ti"}), []any{"body", "memory"}, limit, "value_error"},
		{"memory a byte above the host", "POST", "/sandboxes", create(map[string]any{"memory": strconv.FormatInt(host+1, 10)}), []any{"body", "memory"}, limit, ""},
		{"memory not a quantity", "POST", "/sandboxes", create(map[string]any{"memory": "lots"}), []any{"body", "memory"}, invalid, "value_error"},
		{"memory zero", "POST", "/sandboxes", create(map[string]any{"memory": "0"}), []any{"body", "memory"}, invalid, ""},
		{"memory negative", "POST", "/sandboxes", create(map[string]any{"memory": "-1Gi"}), []any{"body", "memory"}, invalid, ""},
		{"cpu above the host", "POST", "/sandboxes", create(map[string]any{"cpu": strconv.Itoa(cpus + 1)}), []any{"body", "cpu"}, limit, ""},
		{"cpu in millicores above the host", "POST", "/sandboxes", create(map[string]any{"cpu": strconv.Itoa(cpus*1000+1) + "m"}), []any{"body", "cpu"}, limit, ""},
		{"cpu zero", "POST", "/sandboxes", create(map[string]any{"cpu": "0"}), []any{"body", "cpu"}, invalid, ""},
		{"cpu not a quantity", "POST", "/sandboxes", create(map[string]any{"cpu": "many"}), []any{"body", "cpu"}, invalid, ""},
		{"create timeout negative", "POST", "/sandboxes", create(map[string]any{"timeout": -5}), []any{"body", "timeout"}, invalid, ge},
		{"ttl_seconds negative", "POST", "/sandboxes", create(map[string]any{"ttl_seconds": -1}), []any{"body", "ttl_seconds"}, invalid, ge},
		{"create env name with =", "POST", "/sandboxes", create(map[string]any{"env": map[string]string{"A=B": "x"}}), []any{"body", "env", "A=B"}, invalid, ""},
		{"create env value with NUL", "POST", "/sandboxes", create(map[string]any{"env": map[string]string{"A": "x\x00y"}}), []any{"body", "env", "A"}, invalid, ""},
		{"browser settle timeout negative", "POST", "/sandboxes", create(map[string]any{"kind": "browser", "browser": map[string]any{"settle_timeout_ms": -1}}),
			[]any{"body", "browser", "settle_timeout_ms"}, invalid, ge},
		{"browser retry budget negative", "POST", "/sandboxes", create(map[string]any{"kind": "browser", "browser": map[string]any{"navigation_retry": map[string]any{"budget_ms": -1}}}),
			[]any{"body", "browser", "navigation_retry", "budget_ms"}, invalid, ge},

		{"exec timeout_seconds negative", "POST", "/sandboxes/" + id + "/exec", map[string]any{"command": "true", "timeout_seconds": -5, "wait": true}, []any{"body", "timeout_seconds"}, invalid, ge},
		{"exec command with NUL", "POST", "/sandboxes/" + id + "/exec", map[string]any{"command": "echo a\x00b", "wait": true}, []any{"body", "command"}, invalid, "value_error"},
		{"exec list command with NUL", "POST", "/sandboxes/" + id + "/exec", map[string]any{"command": []string{"echo", "a\x00b"}, "wait": true}, []any{"body", "command"}, invalid, ""},
		{"exec cwd with NUL", "POST", "/sandboxes/" + id + "/exec", map[string]any{"command": "pwd", "cwd": "/tmp\x00x", "wait": true}, []any{"body", "cwd"}, invalid, ""},
		{"exec env name with =", "POST", "/sandboxes/" + id + "/exec", map[string]any{"command": "true", "env": map[string]string{"A=B": "x"}, "wait": true}, []any{"body", "env", "A=B"}, invalid, ""},
		{"exec on an unknown sandbox still validates first", "POST", "/sandboxes/zz/exec", map[string]any{"command": "true", "timeout_seconds": -1}, []any{"body", "timeout_seconds"}, invalid, ge},
		{"apply_patch timeout negative", "POST", "/sandboxes/" + id + "/apply_patch", map[string]any{"patch": "", "timeout_seconds": -1}, []any{"body", "timeout_seconds"}, invalid, ge},

		{"sandbox wait timeout negative", "GET", "/sandboxes/" + id + "/wait?timeout=-1", nil, []any{"query", "timeout"}, invalid, ge},
		{"job wait timeout negative", "GET", "/jobs/" + job + "/wait?timeout=-1", nil, []any{"query", "timeout"}, invalid, ge},

		{"episode step_timeout_ms negative", "POST", "/episodes", map[string]any{"task": task, "step_timeout_ms": -1}, []any{"body", "step_timeout_ms"}, invalid, ge},
		{"episode episode_timeout_ms negative", "POST", "/episodes", map[string]any{"task": task, "episode_timeout_ms": -1}, []any{"body", "episode_timeout_ms"}, invalid, ge},
		{"episode max_steps negative", "POST", "/episodes", map[string]any{"task": task, "max_steps": -1}, []any{"body", "max_steps"}, invalid, ge},
		{"episode sandbox memory above the host", "POST", "/episodes", map[string]any{"task": task, "sandbox": map[string]any{"memory": "99999Ti"}}, []any{"body", "sandbox", "memory"}, limit, ""},
		{"episode sandbox timeout negative", "POST", "/episodes", map[string]any{"task": task, "sandbox": map[string]any{"timeout": -5}}, []any{"body", "sandbox", "timeout"}, invalid, ge},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			wantInvalid(t, call(t, srv, tc.method, tc.path, tc.body), tc.loc, tc.code, tc.typ)
		})
	}

	t.Run("every bad field at once", func(t *testing.T) {
		r := call(t, srv, "POST", "/sandboxes", create(map[string]any{"timeout": -5, "ttl_seconds": -1, "memory": "99999Ti"}))
		wantInvalid(t, r, []any{"body", "timeout"}, limit, ge)
		wantInvalid(t, r, []any{"body", "ttl_seconds"}, limit, ge)
		wantInvalid(t, r, []any{"body", "memory"}, limit, "")
		// pydantic's constraint item, exactly.
		items := r.body["detail"].([]any)
		want := map[string]any{"type": ge, "loc": []any{"body", "timeout"}, "msg": "Input should be greater than or equal to 0",
			"input": float64(-5), "ctx": map[string]any{"ge": float64(0)}}
		if !reflect.DeepEqual(items[1], want) {
			t.Errorf("timeout item %v, want %v", items[1], want)
		}
	})
	t.Run("query item echoes the string", func(t *testing.T) {
		r := call(t, srv, "GET", "/jobs/"+job+"/wait?timeout=-1", nil)
		wantInvalid(t, r, []any{"query", "timeout"}, faults.CodeValidation, "greater_than_equal")
		if it := r.body["detail"].([]any)[0].(map[string]any); it["input"] != "-1" {
			t.Errorf("input %v, want the string \"-1\"", it["input"])
		}
	})

	// The edges: zero means the default where the contract says so, and
	// a limit equal to the host's is the host's.
	t.Run("create at the edges", func(t *testing.T) {
		r := call(t, srv, "POST", "/sandboxes", create(map[string]any{"cpu": strconv.Itoa(cpus), "memory": strconv.FormatInt(host, 10), "timeout": 0, "ttl_seconds": 0}))
		want(t, r, 200)
		if r.body["timeout"] != float64(3600) || r.body["cpu"] != strconv.Itoa(cpus) {
			t.Errorf("create: %s", r.raw)
		}
		sb := r.body["sandbox_id"].(string)
		g := call(t, srv, "GET", "/sandboxes/"+sb, nil)
		if exp, _ := g.body["expires_at"].(float64); exp-g.body["created_at"].(float64) < 3600 {
			t.Errorf("ttl_seconds 0 is not the server's TTL: %s", g.raw)
		}
		want(t, call(t, srv, "DELETE", "/sandboxes/"+sb, nil), 200)
		r = call(t, srv, "POST", "/sandboxes", create(map[string]any{"cpu": "500m", "memory": "", "ttl_seconds": 1 << 40, "timeout": 1 << 40}))
		want(t, r, 200)
		want(t, call(t, srv, "DELETE", "/sandboxes/"+r.body["sandbox_id"].(string), nil), 200)
	})
	t.Run("exec timeout_seconds zero is the default", func(t *testing.T) {
		j := execWait(t, srv, id, map[string]any{"command": "echo ok", "timeout_seconds": 0, "env": map[string]string{"EMPTY": ""}})
		if j.Status != "succeeded" || j.Stdout != "ok\n" || j.TimeoutSeconds != 300 {
			t.Errorf("job %+v", j)
		}
	})
	t.Run("apply_patch timeout zero is the default", func(t *testing.T) {
		r := call(t, srv, "POST", "/sandboxes/"+id+"/apply_patch", map[string]any{"patch": "", "timeout_seconds": 0})
		want(t, r, 200)
	})
	t.Run("waits with timeout zero answer at once", func(t *testing.T) {
		start := time.Now()
		w := call(t, srv, "GET", "/sandboxes/"+id+"/wait?timeout=0", nil)
		want(t, w, 200)
		if w.body["status"] != "ready" {
			t.Errorf("wait: %s", w.raw)
		}
		want(t, call(t, srv, "GET", "/jobs/"+job+"/wait?timeout=0", nil), 200)
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("took %v", d)
		}
	})
}

// ORCHARD_MAX_CPU and ORCHARD_MAX_MEMORY replace the host's size as the
// limits: below it to keep room, above it to take clients that always ask
// for Orchard Env's defaults.
func TestConfiguredLimits(t *testing.T) {
	cpus := goruntime.NumCPU()
	srv := testserver.Start(t, testserver.Options{Manager: manager.Config{MaxCPU: float64(cpus + 2), MaxMemory: 512 << 20}})
	for _, tc := range []struct {
		cpu, memory string
		loc         []any
	}{
		{strconv.Itoa(cpus + 3), "256Mi", []any{"body", "cpu"}},
		{"1", "513Mi", []any{"body", "memory"}},
	} {
		t.Run(tc.cpu+" "+tc.memory, func(t *testing.T) {
			r := call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "block_network": true, "cpu": tc.cpu, "memory": tc.memory})
			wantInvalid(t, r, tc.loc, faults.CodeLimitExceeded, "value_error")
			if !strings.Contains(string(r.raw), "ORCHARD_MAX_") {
				t.Errorf("message does not name the setting: %s", r.raw)
			}
		})
	}
	r := call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "block_network": true, "cpu": strconv.Itoa(cpus + 2), "memory": "512Mi"})
	want(t, r, 200)
	want(t, call(t, srv, "DELETE", "/sandboxes/"+r.body["sandbox_id"].(string), nil), 200)
	// The OpenAPI document states this server's limits.
	doc := call(t, srv, "GET", "/openapi.json", nil, "")
	props := doc.body["components"].(map[string]any)["schemas"].(map[string]any)["CreateSandboxRequest"].(map[string]any)["properties"].(map[string]any)
	if d, _ := props["memory"].(map[string]any)["description"].(string); !strings.Contains(d, "at most 512Mi") {
		t.Errorf("memory description %q", d)
	}
	if d, _ := props["cpu"].(map[string]any)["description"].(string); !strings.Contains(d, fmt.Sprintf("at most %d", cpus+2)) {
		t.Errorf("cpu description %q", d)
	}
	schemas := doc.body["components"].(map[string]any)["schemas"].(map[string]any)
	for _, f := range []struct{ schema, field string }{
		{"CreateSandboxRequest", "timeout"}, {"CreateSandboxRequest", "ttl_seconds"},
		{"ExecRequest", "timeout_seconds"}, {"PatchRequest", "timeout_seconds"}, {"episodeRequestDoc", "step_timeout_ms"},
	} {
		p := schemas[f.schema].(map[string]any)["properties"].(map[string]any)[f.field].(map[string]any)
		if p["minimum"] != float64(0) || p["description"] == nil {
			t.Errorf("%s.%s: %v, want minimum 0 and a description", f.schema, f.field, p)
		}
	}
	paths := doc.body["paths"].(map[string]any)
	for _, path := range []string{"/sandboxes/{id}/wait", "/jobs/{job_id}/wait"} {
		var timeout map[string]any
		for _, p := range paths[path].(map[string]any)["get"].(map[string]any)["parameters"].([]any) {
			if p := p.(map[string]any); p["name"] == "timeout" {
				timeout = p
			}
		}
		if timeout == nil || timeout["schema"].(map[string]any)["minimum"] != float64(0) {
			t.Errorf("%s timeout: %v, want minimum 0", path, timeout)
		}
	}
}
