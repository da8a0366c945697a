package server

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	goruntime "runtime"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/egress"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/runtime"
	"github.com/orchard/orchard/server/manager"
	"github.com/orchard/orchard/sitehealth"
	"github.com/orchard/orchard/store"
)

// route is one API path: registered with gin and described in the OpenAPI
// document from the same entry, so the two cannot drift.
type route struct {
	method, path string
	summary      string
	public       bool // no API key
	ws           bool // WebSocket upgrade
	request      any  // body type, nil if none
	response     any  // 200 body type
	query        []queryParam
	// queryMin holds the minimums of integer query parameters, which the
	// handler enforces (queryInt).
	queryMin map[string]int
	handler  handlerFunc
	// produces is the 200 media type when it is not JSON.
	produces string
	// rawBody: the body is a file (JSONL, YAML), not one JSON document.
	rawBody bool
	// stream: the handler reads the body itself, as it arrives, within
	// the body limit; readBody leaves it alone for a caller with a key.
	stream bool
	// statuses are the codes this route answers with a status of its own,
	// where Orchard Env's differs from the rest of the API (fileStatus).
	statuses map[string]int
}

type queryParam struct {
	name, typ, doc string
	required       bool
}

func (s *Server) table() []route {
	return []route{
		{method: "GET", path: "/", summary: "Service banner", public: true, response: map[string]string{}, handler: s.root},
		{method: "GET", path: "/health", summary: "Liveness", public: true, response: map[string]string{}, handler: s.health},
		{method: "GET", path: "/openapi.json", summary: "This document", public: true, response: map[string]any{}, handler: s.openapi},
		{method: "GET", path: "/metrics", summary: "Prometheus metrics", public: true, produces: "text/plain", handler: s.serveMetrics},
		{method: "GET", path: "/resources", summary: "Host capacity and sandbox usage", response: resources{}, handler: s.resources},
		{method: "GET", path: "/sitehealth", summary: "Per-host circuit breakers and rate limits shared by all sandboxes",
			response: siteHealthList{}, handler: s.siteHealth},
		{method: "POST", path: "/sandboxes", summary: "Create a sandbox (returns at once, status pending)",
			request: api.CreateSandboxRequest{}, response: api.CreateSandboxResponse{}, handler: s.createSandbox},
		{method: "GET", path: "/sandboxes", summary: "List sandboxes",
			query: []queryParam{{"labels", "string", "comma-separated k=v pairs that must all match", false},
				{"kind", "string", "shell, browser or desktop", false}, {"status", "string", "sandbox status", false}},
			response: api.SandboxList{}, handler: s.listSandboxes},
		{method: "GET", path: "/sandboxes/:id", summary: "Get a sandbox", response: api.Sandbox{}, handler: s.getSandbox},
		{method: "GET", path: "/sandboxes/:id/wait", summary: "Wait until the sandbox is ready (408 on timeout)",
			query:    []queryParam{{"timeout", "integer", "seconds (default 3600; 0 looks once and answers)", false}},
			queryMin: map[string]int{"timeout": 0}, response: api.Sandbox{}, handler: s.waitSandbox},
		{method: "DELETE", path: "/sandboxes/:id", summary: "Delete a sandbox (idempotent)", response: api.DeleteResponse{}, handler: s.deleteSandbox},
		{method: "POST", path: "/sandboxes/:id/heartbeat", summary: "Record a heartbeat", response: api.StatusOK{}, handler: s.heartbeat},
		{method: "POST", path: "/sandboxes/:id/pause", summary: "Stop every process of the sandbox in place, memory kept (status paused; 409 sandbox.paused for work until resumed)",
			response: api.Sandbox{}, handler: s.pauseSandbox},
		{method: "POST", path: "/sandboxes/:id/resume", summary: "Let a paused sandbox's processes go on where they stopped",
			response: api.Sandbox{}, handler: s.resumeSandbox},
		{method: "POST", path: "/sandboxes/:id/exec", summary: "Run a command as a job",
			request: api.ExecRequest{}, response: api.Job{}, handler: s.exec},
		{method: "GET", path: "/sandboxes/:id/exec/pty", summary: "Interactive PTY over WebSocket", ws: true,
			query: []queryParam{{"api_key", "string", "API key (WebSocket clients cannot set headers)", false}}, handler: s.pty},
		{method: "POST", path: "/sandboxes/:id/apply_patch", summary: "Apply a unified diff with git apply in /workspace",
			request: api.PatchRequest{}, response: api.PatchResult{}, handler: s.applyPatch},
		{method: "POST", path: "/sandboxes/:id/files", summary: "Upload a file (base64)",
			request: api.UploadRequest{}, response: api.UploadResult{}, handler: s.upload, stream: true, statuses: fileStatus},
		{method: "GET", path: "/sandboxes/:id/files", summary: "Download a file (base64)",
			query: []queryParam{{"path", "string", "file path in the sandbox", true}}, response: api.FileContent{}, handler: s.download, statuses: fileStatus},
		{method: "GET", path: "/sandboxes/:id/files/list", summary: "List a directory",
			query: []queryParam{{"path", "string", "directory (default /workspace)", false}}, response: api.FileList{}, handler: s.listFiles, statuses: fileStatus},
		{method: "GET", path: "/jobs/:job_id", summary: "Get a job", response: api.Job{}, handler: s.getJob},
		{method: "GET", path: "/jobs/:job_id/wait", summary: "Wait for a job (200 with its state, terminal or not)",
			query:    []queryParam{{"timeout", "integer", "seconds (default 300; 0 answers at once)", false}},
			queryMin: map[string]int{"timeout": 0}, response: api.Job{}, handler: s.waitJob},
		{method: "POST", path: "/jobs/:job_id/cancel", summary: "Cancel a job: kill its command; 200 with the job once ended (a finished job unchanged)",
			response: api.Job{}, handler: s.cancelJob},
	}
}

func (s *Server) root(c *gin.Context) error {
	c.JSON(http.StatusOK, gin.H{"service": s.cfg.ServiceName, "version": Version, "status": "running"})
	return nil
}

func (s *Server) health(c *gin.Context) error {
	c.JSON(http.StatusOK, gin.H{"status": "healthy"})
	return nil
}

func (s *Server) sandboxJSON(r store.Sandbox) api.Sandbox {
	// The hard cap on the sandbox's age (SANDBOX_TTL_HOURS, or its own ttl_seconds).
	ttl := s.mgr.Config().SandboxTTL.Seconds()
	if r.TTLSeconds > 0 {
		ttl = float64(r.TTLSeconds)
	}
	exp := r.CreatedAt + ttl
	return api.Sandbox{
		SandboxID: r.ID, Namespace: r.Namespace, Image: r.Image, PodName: "sandbox-" + r.ID,
		BlockNetwork: r.BlockNetwork, CPU: r.CPU, Memory: r.Memory, CreatedAt: r.CreatedAt,
		Ready: r.Ready, Status: r.Status, StatusMessage: r.StatusMessage, Kind: r.Kind,
		Labels: r.Labels, LastHeartbeat: r.LastHeartbeat, ExpiresAt: &exp, Fault: r.Fault,
		EphemeralStorage: r.EphemeralStorage, Snapshot: r.Snapshot, ForkOf: r.ForkOf,
	}
}

type siteHealthList struct {
	Hosts []sitehealth.HostStatus `json:"hosts"`
}

func (s *Server) siteHealth(c *gin.Context) error {
	out := siteHealthList{Hosts: []sitehealth.HostStatus{}}
	if s.cfg.SiteHealth != nil {
		hosts, err := s.cfg.SiteHealth.Status(c.Request.Context())
		if err != nil {
			return err
		}
		out.Hosts = append(out.Hosts, hosts...)
	}
	c.JSON(http.StatusOK, out)
	return nil
}

func (s *Server) createSandbox(c *gin.Context) error {
	raw := body(c)
	var req api.CreateSandboxRequest
	if err := decodeJSON(raw, &req); err != nil {
		return err
	}
	// image is required and a string: look at the body's own key, not at
	// whatever text the body holds (a label or id named "image").
	var top map[string]json.RawMessage
	_ = json.Unmarshal(raw, &top)
	_, fromSnapshot := top["snapshot"]
	switch img, ok := top["image"]; {
	case !ok && fromSnapshot: // the snapshot's image
	case !ok:
		return faults.Validation(missingField("body", "image", jsonInput(raw)))
	case string(img) == "null":
		return faults.Validation(faults.FieldError{Type: "string_type", Loc: []any{"body", "image"}, Msg: "Input should be a valid string", Input: nil})
	}
	p := manager.CreateParams{BlockNetwork: true}
	if err := s.sandboxParams(&p, req, "body"); err != nil {
		return err
	}
	rec, err := s.createOrClaim(c, p, req)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, api.CreateSandboxResponse{
		SandboxID: rec.ID, Namespace: rec.Namespace, Image: rec.Image, BlockNetwork: rec.BlockNetwork,
		CPU: rec.CPU, Memory: rec.Memory, Timeout: rec.CreationTimeout, Status: rec.Status, Kind: rec.Kind,
		EphemeralStorage: rec.EphemeralStorage, Ready: rec.Ready, Pool: rec.Pool,
	})
	return nil
}

// sandboxParams applies a POST /sandboxes body to p, validating it; loc is
// where the body is in the request, for validation errors. POST /episodes
// uses it for its "sandbox" field, over defaults of its own.
func (s *Server) sandboxParams(p *manager.CreateParams, req api.CreateSandboxRequest, loc ...any) error {
	at := func(field ...any) []any { return joinLoc(loc, field...) }
	kind := p.Kind
	if req.Kind != "" {
		kind = req.Kind
	}
	// Every setting is checked here, before any sandbox starts: the
	// daemons in the sandbox decode the same types and would otherwise be
	// the first to see a bad one.
	var c checks
	lim := s.mgr.Limits()
	c.cpu(req.CPU, lim, at("cpu"))
	c.memory(req.Memory, lim, at("memory"))
	c.nonNegative(req.Timeout, at("timeout"))
	c.nonNegative(req.TTLSeconds, at("ttl_seconds"))
	c.env(req.Env, at("env"))
	if req.Browser != nil {
		if kind != api.KindBrowser {
			c.add(faults.CodeValidation, faults.FieldError{Type: "value_error", Loc: at("browser"),
				Msg: "browser settings need kind \"browser\"", Input: req.Browser})
		}
		c.fields(at("browser"), req.Browser.Validate())
	}
	if req.Desktop != nil {
		if kind != api.KindDesktop {
			c.add(faults.CodeValidation, faults.FieldError{Type: "value_error", Loc: at("desktop"),
				Msg: "desktop settings need kind \"desktop\"", Input: req.Desktop})
		}
		c.fields(at("desktop"), req.Desktop.Validate())
	}
	if req.Egress != nil {
		c.fields(at("egress"), req.Egress.Validate())
	}
	if err := c.err(); err != nil {
		return err
	}
	p.Kind = kind
	if req.Image != "" {
		p.Image = req.Image
	}
	if req.Env != nil {
		p.Env = req.Env
	}
	if req.Labels != nil {
		p.Labels = req.Labels
	}
	if req.Browser != nil {
		p.KindOptions, _ = json.Marshal(req.Browser)
	}
	if req.Desktop != nil {
		p.KindOptions, _ = json.Marshal(req.Desktop)
	}
	if req.BlockNetwork != nil {
		p.BlockNetwork = *req.BlockNetwork
	}
	if req.Egress != nil {
		if err := egress.ValidatePatterns(req.Egress.Allow); err != nil {
			return err
		}
		p.EgressAllow = req.Egress.Allow
		if req.Egress.Mode == api.EgressFull {
			p.NetworkMode = runtime.NetworkFull
		}
	}
	if req.Faults != nil {
		if err := req.Faults.Validate(); err != nil {
			return err
		}
		p.Faults, _ = json.Marshal(req.Faults)
	}
	if req.SandboxID != nil {
		p.ID = *req.SandboxID
	}
	if req.CPU != nil {
		p.CPU = *req.CPU
	}
	if req.Memory != nil {
		p.Memory = *req.Memory
	}
	if req.EphemeralStorage != nil {
		// "" takes the default, as for cpu and memory.
		if _, err := manager.ParseEphemeralStorage(*req.EphemeralStorage); err != nil && *req.EphemeralStorage != "" {
			return faults.Validation(faults.FieldError{Type: "value_error", Loc: at("ephemeral_storage"),
				Msg: "ephemeral_storage: " + err.Error(), Input: *req.EphemeralStorage})
		}
		p.EphemeralStorage = *req.EphemeralStorage
	}
	if req.Timeout != nil {
		p.Timeout = *req.Timeout
	}
	if req.TTLSeconds != nil {
		p.TTLSeconds = *req.TTLSeconds
	}
	if req.Snapshot != nil {
		p.Snapshot = *req.Snapshot
	}
	for i, cmd := range req.Exec {
		if strings.TrimSpace(cmd) == "" || strings.ContainsRune(cmd, 0) {
			return faults.Validation(faults.FieldError{Type: "value_error", Loc: at("exec", i), Msg: "a command must be non-empty and hold no NUL byte", Input: cmd})
		}
	}
	p.StartExec = req.Exec
	if req.Harnesses != nil {
		p.Harnesses = req.Harnesses
	}
	return nil
}

func jsonInput(raw []byte) any {
	var v any
	_ = json.Unmarshal(raw, &v)
	return v
}

func (s *Server) listSandboxes(c *gin.Context) error {
	labels := map[string]string{}
	for _, q := range append(c.QueryArray("labels"), c.QueryArray("label")...) {
		for _, kv := range strings.Split(q, ",") {
			if kv == "" {
				continue
			}
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client, "label filter %q is not k=v", kv)
			}
			labels[k] = v
		}
	}
	recs, err := s.mgr.List(c.Request.Context(), labels, c.Query("kind"), c.Query("status"))
	if err != nil {
		return err
	}
	out := api.SandboxList{Sandboxes: make([]api.Sandbox, 0, len(recs))}
	for _, r := range recs {
		out.Sandboxes = append(out.Sandboxes, s.sandboxJSON(r))
	}
	c.JSON(http.StatusOK, out)
	return nil
}

func (s *Server) getSandbox(c *gin.Context) error {
	rec, err := s.mgr.Get(c.Request.Context(), c.Param("id"))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, s.sandboxJSON(rec))
	return nil
}

func (s *Server) waitSandbox(c *gin.Context) error {
	timeout, err := queryInt(c, "timeout", 3600, 0)
	if err != nil {
		return err
	}
	rec, err := s.mgr.Wait(c.Request.Context(), c.Param("id"), timeout)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, s.sandboxJSON(rec))
	return nil
}

func (s *Server) deleteSandbox(c *gin.Context) error {
	id := c.Param("id")
	rec, getErr := s.mgr.Get(c.Request.Context(), id)
	if err := s.mgr.Delete(c.Request.Context(), id); err != nil {
		return err
	}
	if getErr == nil {
		// The sandbox's service URLs die with it (a URL also checks its
		// sandbox on every request; this frees the records).
		if _, err := s.revokeServices(c.Request.Context(), rec, 0); err != nil {
			s.log.Warn("revoke services of a deleted sandbox", "sandbox_id", id, "err", err)
		}
	}
	c.JSON(http.StatusOK, api.DeleteResponse{Status: "deleted", SandboxID: id})
	return nil
}

func (s *Server) heartbeat(c *gin.Context) error {
	id := c.Param("id")
	if err := s.mgr.Heartbeat(c.Request.Context(), id); err != nil {
		return err
	}
	c.JSON(http.StatusOK, api.StatusOK{Status: "ok", SandboxID: id})
	return nil
}

func (s *Server) pauseSandbox(c *gin.Context) error {
	rec, err := s.mgr.Pause(c.Request.Context(), c.Param("id"))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, s.sandboxJSON(rec))
	return nil
}

func (s *Server) resumeSandbox(c *gin.Context) error {
	rec, err := s.mgr.Resume(c.Request.Context(), c.Param("id"))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, s.sandboxJSON(rec))
	return nil
}

func (s *Server) exec(c *gin.Context) error {
	raw := body(c)
	var req api.ExecRequest
	if err := decodeJSON(raw, &req); err != nil {
		return err
	}
	if req.Command == nil {
		return faults.Validation(missingField("body", "command", jsonInput(raw)))
	}
	var v checks
	v.noNUL(string(*req.Command), "command", []any{"body", "command"})
	v.nonNegative(req.TimeoutSeconds, []any{"body", "timeout_seconds"})
	if req.Cwd != nil {
		v.noNUL(*req.Cwd, "cwd", []any{"body", "cwd"})
	}
	v.env(req.Env, []any{"body", "env"})
	if err := v.err(); err != nil {
		return err
	}
	p := manager.ExecParams{Command: string(*req.Command), Env: req.Env, LoginShell: req.LoginShell, Wait: req.Wait}
	if req.TimeoutSeconds != nil {
		p.TimeoutSeconds = *req.TimeoutSeconds
	}
	if req.Cwd != nil {
		p.Cwd = *req.Cwd
	}
	job, err := s.mgr.Exec(c.Request.Context(), c.Param("id"), p)
	if err != nil {
		return err
	}
	if !req.Wait {
		c.JSON(http.StatusOK, api.ExecQueued{JobID: job.JobID, Status: job.Status})
		return nil
	}
	c.JSON(http.StatusOK, job)
	return nil
}

func (s *Server) getJob(c *gin.Context) error {
	j, err := s.mgr.GetJob(c.Request.Context(), c.Param("job_id"))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, j)
	return nil
}

func (s *Server) waitJob(c *gin.Context) error {
	timeout, err := queryInt(c, "timeout", 300, 0)
	if err != nil {
		return err
	}
	j, err := s.mgr.WaitJob(c.Request.Context(), c.Param("job_id"), api.Seconds(timeout))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, j)
	return nil
}

func (s *Server) cancelJob(c *gin.Context) error {
	j, err := s.mgr.CancelJob(c.Request.Context(), c.Param("job_id"))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, j)
	return nil
}

func (s *Server) applyPatch(c *gin.Context) error {
	raw := body(c)
	var req api.PatchRequest
	if err := decodeJSON(raw, &req); err != nil {
		return err
	}
	if req.Patch == nil {
		return faults.Validation(missingField("body", "patch", jsonInput(raw)))
	}
	var v checks
	v.nonNegative(req.TimeoutSeconds, []any{"body", "timeout_seconds"})
	if err := v.err(); err != nil {
		return err
	}
	timeout := 30
	if req.TimeoutSeconds != nil {
		timeout = *req.TimeoutSeconds
	}
	res, err := s.mgr.ApplyPatch(c.Request.Context(), c.Param("id"), *req.Patch, timeout)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, res)
	return nil
}

func (s *Server) download(c *gin.Context) error {
	path, ok := c.GetQuery("path")
	if !ok {
		return faults.Validation(missingField("query", "path", nil))
	}
	body, err := s.mgr.Download(c.Request.Context(), c.Param("id"), path)
	if err != nil {
		return err
	}
	defer body.Close()
	// The agent's answer is already the FileContent this path returns:
	// passed on as it streams, a large file never sits in memory here.
	c.Header("Content-Type", "application/json")
	c.Status(http.StatusOK)
	if _, err := io.Copy(c.Writer, body); err != nil {
		// Too late for an error body: break the connection so that the
		// client sees a failed transfer rather than a short file.
		s.log.Warn("download aborted", "sandbox_id", c.Param("id"), "path", path, "err", err)
		panic(http.ErrAbortHandler)
	}
	return nil
}

func (s *Server) listFiles(c *gin.Context) error {
	path := c.DefaultQuery("path", s.mgr.Config().WorkingDir)
	res, err := s.mgr.ListFiles(c.Request.Context(), c.Param("id"), path)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, res)
	return nil
}

// resources is the body of GET /resources (ORCHARD_COMPAT §3.3) for one host.
type resources struct {
	Status           string        `json:"status"`
	Nodes            []node        `json:"nodes"`
	TotalCapacity    quantity      `json:"total_capacity"`
	TotalAllocatable quantity      `json:"total_allocatable"`
	TotalRequested   quantity      `json:"total_requested"`
	Available        quantity      `json:"available"`
	SandboxPods      []sandboxUsed `json:"sandbox_pods"`
}

type quantity struct {
	CPU         float64 `json:"cpu"`
	MemoryBytes int64   `json:"memory_bytes"`
}

type node struct {
	Name        string   `json:"name"`
	Capacity    quantity `json:"capacity"`
	Allocatable quantity `json:"allocatable"`
}

type sandboxUsed struct {
	Name               string  `json:"name"`
	Namespace          string  `json:"namespace"`
	Phase              string  `json:"phase"`
	CPURequest         float64 `json:"cpu_request"`
	MemoryRequestBytes int64   `json:"memory_request_bytes"`
}

func (s *Server) resources(c *gin.Context) error {
	host, _ := os.Hostname()
	capQ := quantity{CPU: float64(goruntime.NumCPU()), MemoryBytes: manager.HostMemory()}
	recs, err := s.mgr.List(c.Request.Context(), nil, "", "")
	if err != nil {
		return err
	}
	// Warm pools' unclaimed sandboxes are no one's, but use the machine.
	if members, err := s.mgr.PoolMembers(c.Request.Context()); err == nil {
		recs = append(recs, members...)
	}
	out := resources{Status: "ok", Nodes: []node{{Name: host, Capacity: capQ, Allocatable: capQ}},
		TotalCapacity: capQ, TotalAllocatable: capQ, SandboxPods: []sandboxUsed{}}
	allocQ := capQ
	if nodes, ok, err := s.mgr.Nodes(c.Request.Context()); ok {
		if err != nil {
			return faults.Wrap(err, faults.CodeKubeAPI, faults.Unavailable, faults.Platform, "the cluster's nodes could not be listed")
		}
		out.Nodes, out.TotalCapacity, allocQ = []node{}, quantity{}, quantity{}
		for _, n := range nodes {
			nc := quantity{CPU: n.CapacityCPU, MemoryBytes: n.CapacityMemory}
			na := quantity{CPU: n.AllocatableCPU, MemoryBytes: n.AllocatableMemory}
			out.Nodes = append(out.Nodes, node{Name: n.Name, Capacity: nc, Allocatable: na})
			out.TotalCapacity.CPU += nc.CPU
			out.TotalCapacity.MemoryBytes += nc.MemoryBytes
			allocQ.CPU += na.CPU
			allocQ.MemoryBytes += na.MemoryBytes
		}
		out.TotalAllocatable = allocQ
	}
	for _, r := range recs {
		cpu, _ := manager.ParseCPU(r.CPU)
		mem, _ := manager.ParseMemory(r.Memory)
		phase := "Pending"
		switch r.Status {
		case api.StatusReady:
			phase = "Running"
		case api.StatusFailed:
			phase = "Failed"
		}
		out.SandboxPods = append(out.SandboxPods, sandboxUsed{Name: "sandbox-" + r.ID, Namespace: r.Namespace,
			Phase: phase, CPURequest: cpu, MemoryRequestBytes: mem})
		if phase != "Failed" {
			out.TotalRequested.CPU += cpu
			out.TotalRequested.MemoryBytes += mem
		}
	}
	out.Available = quantity{CPU: max(allocQ.CPU-out.TotalRequested.CPU, 0), MemoryBytes: max(allocQ.MemoryBytes-out.TotalRequested.MemoryBytes, 0)}
	c.JSON(http.StatusOK, out)
	return nil
}
