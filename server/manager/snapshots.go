package manager

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/runtime"
	"github.com/orchard/orchard/store"
)

// Snapshots are the runtime's saved layers (runtime.Snapshotter): the
// layer holds the sandbox's filesystem changes, and its metadata
// (snapMeta) what a sandbox started from it needs besides: kind, image,
// kind settings and the browser's state. Nothing about them is in the
// store: they live with their layers, on the host, and so outlive the
// server and are seen by every replica on the same state directory.
//
// A fork is a snapshot of its own (internal: not listed) that its branches
// start from, released as soon as they are ready: it goes once the last
// branch does.

// snapMeta is the metadata kept with a snapshot's layer.
type snapMeta struct {
	Internal bool `json:"internal,omitempty"`
	// SandboxID is the sandbox's id as its clients know it (the layer's
	// source is the runtime's, which a claimed pool sandbox's is not).
	SandboxID string             `json:"sandbox_id,omitempty"`
	Labels    map[string]string  `json:"labels,omitempty"`
	Source    api.SnapshotSource `json:"source"`
}

// Snapshot limits.
const (
	// defaultSnapshotMaxBytes bounds what one snapshot copies.
	defaultSnapshotMaxBytes = 10 << 30
	// defaultForkMax bounds one fork's branches.
	defaultForkMax = 32
	// maxBrowserState bounds a browser state read from an agent.
	maxBrowserState = 64 << 20
	// defaultForkTimeout bounds a fork's wait for its branches.
	defaultForkTimeout = 300
)

func (m *Manager) snapshotter() (runtime.Snapshotter, error) {
	sn, ok := m.rt.(runtime.Snapshotter)
	if !ok {
		return nil, faults.New(faults.CodeSnapshotUnavailable, faults.NotImplemented, faults.Client,
			"this server's runtime keeps no snapshots (the local runtime does; Kubernetes pods cannot be snapshotted yet)")
	}
	return sn, nil
}

func newSnapshotID(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// Snapshot saves sandbox id's filesystem changes (and a browser
// sandbox's browser state) as a snapshot that outlives the sandbox.
func (m *Manager) Snapshot(ctx context.Context, id string, req api.SnapshotRequest) (api.Snapshot, error) {
	ly, meta, err := m.saveSnapshot(ctx, id, newSnapshotID("snap-"), req.Labels, false)
	if err != nil {
		return api.Snapshot{}, err
	}
	all, err := m.layers(ctx)
	if err != nil {
		return api.Snapshot{}, err
	}
	return snapshotJSON(ly, meta, all), nil
}

// saveSnapshot takes the snapshot called name of sandbox id.
func (m *Manager) saveSnapshot(ctx context.Context, id, name string, labels map[string]string, internal bool) (runtime.Layer, snapMeta, error) {
	sn, err := m.snapshotter()
	if err != nil {
		return runtime.Layer{}, snapMeta{}, err
	}
	rec, err := m.st.GetSandbox(ctx, id)
	if err != nil {
		return runtime.Layer{}, snapMeta{}, err
	}
	if rec.Status != api.StatusReady && rec.Status != api.StatusPaused {
		return runtime.Layer{}, snapMeta{}, faults.Newf(faults.CodeSandboxNotReady, faults.Conflict, faults.Client,
			"Sandbox %s is %s: only a ready or paused sandbox can be snapshotted", id, rec.Status)
	}
	inst, err := m.rt.Inspect(ctx, rec.RuntimeName())
	if err != nil {
		return runtime.Layer{}, snapMeta{}, err
	}
	meta := snapMeta{Internal: internal, Labels: labels, SandboxID: id, Source: api.SnapshotSource{
		Kind: rec.Kind, Image: rec.Image, KindOptions: json.RawMessage(inst.Spec.KindOptions), Labels: rec.Labels,
	}}
	if rec.Kind == api.KindBrowser {
		if rec.Status == api.StatusPaused {
			return runtime.Layer{}, snapMeta{}, faults.Newf(faults.CodeSandboxPaused, faults.Conflict, faults.Client,
				"Sandbox %s is paused: a browser sandbox's snapshot reads the browser's state, so resume it first", id)
		}
		st, err := m.browserState(ctx, rec)
		if err != nil {
			return runtime.Layer{}, snapMeta{}, err
		}
		meta.Source.BrowserState = st
	}
	b, err := json.Marshal(meta)
	if err != nil {
		return runtime.Layer{}, snapMeta{}, err
	}
	ly, err := sn.SaveLayer(ctx, rec.RuntimeName(), name, runtime.LayerOptions{
		Meta: b, MaxBytes: m.cfg.SnapshotMaxBytes, Exclude: api.DaemonStatePaths})
	if err != nil {
		return runtime.Layer{}, snapMeta{}, err
	}
	return ly, meta, nil
}

// browserState reads the browser's state from a browser sandbox's agent.
func (m *Manager) browserState(ctx context.Context, rec store.Sandbox) (json.RawMessage, error) {
	if rec.AgentAddr == "" {
		return nil, faults.Newf(faults.CodeSandboxNotReady, faults.Conflict, faults.Client, "Sandbox %s is not ready", rec.ID)
	}
	b, err := agentCall(ctx, m.agent(rec.AgentAddr), http.MethodGet, "/browser/state", nil)
	if err != nil {
		return nil, fmt.Errorf("read the browser's state of sandbox %s: %w", rec.ID, err)
	}
	return b, nil
}

// agentCall makes one JSON call to a path of an agent's HTTP face and
// returns the answer's body; an error answer is the agent's fault.
func agentCall(ctx context.Context, a Agent, method, path string, body []byte) ([]byte, error) {
	base, rt := a.HTTP()
	u := *base
	u.Path = strings.TrimRight(u.Path, "/") + path
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		return nil, faults.Wrap(err, faults.CodeAgentUnreachable, faults.Unavailable, faults.Sandbox, "the sandbox's agent did not answer")
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, maxBrowserState+1))
	if err != nil {
		return nil, faults.Wrap(err, faults.CodeAgentUnreachable, faults.Unavailable, faults.Sandbox, "the sandbox's agent's answer broke off")
	}
	if len(out) > maxBrowserState {
		return nil, faults.Newf(faults.CodeSnapshotTooLarge, faults.TooLarge, faults.Client, "the agent's answer to %s exceeds %d MiB", path, maxBrowserState>>20)
	}
	if resp.StatusCode/100 != 2 {
		var env faults.Envelope
		if json.Unmarshal(out, &env) == nil && env.Error != nil {
			return nil, faults.FromInfo(*env.Error, resp.StatusCode)
		}
		return nil, faults.Newf(faults.CodeInternal, faults.Internal, faults.Sandbox, "%s %s: agent answered %d: %.200s", method, path, resp.StatusCode, out)
	}
	return out, nil
}

// layers lists the runtime's layers by name.
func (m *Manager) layers(ctx context.Context) (map[string]runtime.Layer, error) {
	sn, err := m.snapshotter()
	if err != nil {
		return nil, err
	}
	all, err := sn.Layers(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]runtime.Layer, len(all))
	for _, l := range all {
		out[l.Name] = l
	}
	return out, nil
}

func decodeSnapMeta(l runtime.Layer) (snapMeta, bool) {
	var meta snapMeta
	return meta, json.Unmarshal(l.Meta, &meta) == nil
}

// snapshotJSON is a layer as the API shows it; all holds every layer, for
// the sizes of those below it.
func snapshotJSON(l runtime.Layer, meta snapMeta, all map[string]runtime.Layer) api.Snapshot {
	total := l.Bytes
	for _, p := range l.Parents {
		total += all[p].Bytes
	}
	s := api.Snapshot{
		SnapshotID: l.Name, SandboxID: cmp.Or(meta.SandboxID, l.Source), Kind: meta.Source.Kind, Image: meta.Source.Image,
		CreatedAt: float64(l.CreatedAt.UnixNano()) / 1e9, Bytes: l.Bytes, TotalBytes: total,
		BrowserState: len(meta.Source.BrowserState) > 0, Labels: meta.Labels,
	}
	if len(l.Parents) > 0 {
		s.Parent = l.Parents[0]
	}
	return s
}

// visible reports whether a layer is a snapshot the API shows: not a
// fork's own, not deleted.
func visible(l runtime.Layer, meta snapMeta) bool { return !l.Released && !meta.Internal }

// Snapshots lists the snapshots, oldest first.
func (m *Manager) Snapshots(ctx context.Context) ([]api.Snapshot, error) {
	all, err := m.layers(ctx)
	if err != nil {
		return nil, err
	}
	out := []api.Snapshot{}
	for _, l := range all {
		if meta, ok := decodeSnapMeta(l); ok && visible(l, meta) {
			out = append(out, snapshotJSON(l, meta, all))
		}
	}
	sortSnapshots(out)
	return out, nil
}

func sortSnapshots(s []api.Snapshot) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && (s[j].CreatedAt < s[j-1].CreatedAt ||
			s[j].CreatedAt == s[j-1].CreatedAt && s[j].SnapshotID < s[j-1].SnapshotID); j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

func snapshotNotFound(id string) error {
	return faults.Newf(faults.CodeSnapshotNotFound, faults.NotFound, faults.Client, "Snapshot %s not found", id)
}

// GetSnapshot returns one snapshot.
func (m *Manager) GetSnapshot(ctx context.Context, id string) (api.Snapshot, error) {
	l, meta, all, err := m.lookupSnapshot(ctx, id)
	if err != nil {
		return api.Snapshot{}, err
	}
	return snapshotJSON(l, meta, all), nil
}

func (m *Manager) lookupSnapshot(ctx context.Context, id string) (runtime.Layer, snapMeta, map[string]runtime.Layer, error) {
	all, err := m.layers(ctx)
	if err != nil {
		return runtime.Layer{}, snapMeta{}, nil, err
	}
	l, ok := all[id]
	if !ok {
		return runtime.Layer{}, snapMeta{}, nil, snapshotNotFound(id)
	}
	meta, ok := decodeSnapMeta(l)
	if !ok || !visible(l, meta) {
		return runtime.Layer{}, snapMeta{}, nil, snapshotNotFound(id)
	}
	return l, meta, all, nil
}

// DeleteSnapshot deletes a snapshot: it is no longer listed nor can
// sandboxes start from it; its files go once no sandbox and no other
// snapshot uses them. Deleting an unknown snapshot is a not-found error.
func (m *Manager) DeleteSnapshot(ctx context.Context, id string) error {
	if _, _, _, err := m.lookupSnapshot(ctx, id); err != nil {
		return err
	}
	sn, _ := m.snapshotter()
	if err := sn.ReleaseLayer(ctx, id); err != nil {
		return err
	}
	m.pruneSoon()
	return nil
}

// pruneSoon removes unused released layers in the background, for the
// request paths that release them.
func (m *Manager) pruneSoon() {
	if _, ok := m.rt.(runtime.Snapshotter); !ok {
		return
	}
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		m.prune(ctx)
	}()
}

// prune removes unused released layers, one prune at a time.
func (m *Manager) prune(ctx context.Context) {
	sn, ok := m.rt.(runtime.Snapshotter)
	if !ok {
		return
	}
	m.pruneMu.Lock()
	defer m.pruneMu.Unlock()
	if removed, err := sn.PruneLayers(ctx); err != nil {
		m.log.Warn("prune snapshot layers", "err", err)
	} else if len(removed) > 0 {
		m.log.Info("snapshot layers removed", "layers", removed)
	}
}

// fromSnapshot fills a create's parameters from the snapshot it starts
// from: its layers, kind and image (a create may not name others), its
// kind settings unless the create has its own, and the browser state the
// sandbox is restored to before it is ready.
func (m *Manager) fromSnapshot(ctx context.Context, p *CreateParams) error {
	l, meta, _, err := m.lookupSnapshot(ctx, p.Snapshot)
	if err != nil {
		return err
	}
	src := meta.Source
	if p.Kind != "" && p.Kind != src.Kind {
		return faults.Validation(faults.FieldError{Type: "value_error", Loc: []any{"body", "kind"},
			Msg: fmt.Sprintf("snapshot %s is of a %s sandbox; the create asks for kind %q", p.Snapshot, src.Kind, p.Kind), Input: p.Kind})
	}
	if p.Image != "" && p.Image != src.Image {
		return faults.Validation(faults.FieldError{Type: "value_error", Loc: []any{"body", "image"},
			Msg: fmt.Sprintf("snapshot %s holds changes to image %q; the create names image %q (omit it)", p.Snapshot, src.Image, p.Image), Input: p.Image})
	}
	p.Kind, p.Image = src.Kind, src.Image
	if len(p.KindOptions) == 0 {
		p.KindOptions = src.KindOptions
	}
	p.layers = append([]string{l.Name}, l.Parents...)
	p.browserState = src.BrowserState
	return nil
}

// startExecTimeout bounds each of a create's start commands, seconds.
const startExecTimeout = 120

// restore runs a create's start commands and puts what a snapshot kept
// besides files back into a sandbox that started from it: the browser's
// state.
func (m *Manager) restore(ctx context.Context, addr string, exec []string, browserState []byte) error {
	a := m.agent(addr)
	for _, cmd := range exec {
		var stderr bytes.Buffer
		exit, err := a.Exec(ctx, api.AgentExecRequest{Command: cmd, TimeoutSeconds: startExecTimeout}, func(ev api.ExecEvent) {
			if ev.Stream == "stderr" && stderr.Len() < 4096 {
				stderr.Write(ev.Data)
			}
		})
		if err != nil {
			return fmt.Errorf("start command %q: %w", cmd, err)
		}
		if exit.ExitCode != 0 || exit.SpawnError != "" {
			return faults.Newf(faults.CodeCreateFailed, faults.ActionFailed, faults.Client,
				"start command %q exited %d: %s%s", cmd, exit.ExitCode, exit.SpawnError, strings.TrimSpace(stderr.String()))
		}
	}
	if len(browserState) == 0 {
		return nil
	}
	if _, err := agentCall(ctx, a, http.MethodPut, "/browser/state", browserState); err != nil {
		return fmt.Errorf("restore the browser's state: %w", err)
	}
	return nil
}

// Fork starts req.Count sandboxes from sandbox id's current state (its
// filesystem and, for a browser sandbox, its browser's state; not its
// running processes) while it keeps running, and returns them once all
// are ready. If any fails to start, none is kept.
func (m *Manager) Fork(ctx context.Context, id string, req api.ForkRequest) ([]store.Sandbox, error) {
	if req.Count < 1 || req.Count > m.cfg.ForkMax {
		return nil, faults.Validation(faults.FieldError{Type: "value_error", Loc: []any{"body", "count"},
			Msg: fmt.Sprintf("count must be 1 to %d", m.cfg.ForkMax), Input: req.Count})
	}
	if req.Timeout < 0 {
		return nil, faults.Validation(faults.FieldError{Type: "value_error", Loc: []any{"body", "timeout"}, Msg: "timeout must be ≥ 0", Input: req.Timeout})
	}
	if req.Timeout == 0 {
		req.Timeout = defaultForkTimeout
	}
	rec, err := m.st.GetSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	inst, err := m.rt.Inspect(ctx, rec.RuntimeName())
	if err != nil {
		return nil, err
	}
	name := newSnapshotID("fork-")
	ly, meta, err := m.saveSnapshot(ctx, id, name, nil, true)
	if err != nil {
		return nil, err
	}
	sn, _ := m.snapshotter()
	// Released once the branches have started from it (or failed to):
	// it then lives exactly as long as they do.
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := sn.ReleaseLayer(rctx, name); err != nil {
			m.log.Warn("release fork layer", "layer", name, "err", err)
		}
		m.pruneSoon()
	}()

	spec := inst.Spec
	labels := maps.Clone(rec.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, req.Labels)
	base := CreateParams{
		Kind: rec.Kind, KindOptions: spec.KindOptions, Image: rec.Image, BlockNetwork: rec.BlockNetwork,
		CPU: rec.CPU, Memory: rec.Memory, EphemeralStorage: rec.EphemeralStorage, Timeout: req.Timeout,
		Env: maps.Clone(rec.Env), Labels: labels, TTLSeconds: rec.TTLSeconds,
		EgressAllow: spec.EgressAllow, NetworkMode: spec.NetworkMode,
		layers: append([]string{ly.Name}, ly.Parents...), browserState: meta.Source.BrowserState, forkOf: id,
		StartExec: req.Exec,
		// The source's harnesses, none included (not the server's default).
		Harnesses: append([]string{}, spec.Harnesses...),
	}
	if rec.BlockNetwork {
		base.NetworkMode = ""
	}
	recs := make([]store.Sandbox, req.Count)
	for i := range recs {
		p := base
		p.Labels = maps.Clone(labels)
		if recs[i], err = m.Create(ctx, p); err != nil {
			m.deleteAll(recs[:i])
			return nil, err
		}
	}
	// Wait for all of them together.
	var wg sync.WaitGroup
	errs := make([]error, len(recs))
	for i := range recs {
		wg.Go(func() {
			r, err := m.Wait(ctx, recs[i].ID, req.Timeout)
			if err == nil && r.Status != api.StatusReady {
				err = faults.Newf(faults.CodeCreateFailed, faults.Internal, faults.Platform, "branch %s of sandbox %s: %s %s", r.ID, id, r.Status, r.StatusMessage)
				if r.Fault != nil {
					err = faults.FromInfo(faults.Info{Category: faults.Category(r.Fault.Category), Source: faults.Source(r.Fault.Source),
						Code: r.Fault.Code, Message: fmt.Sprintf("branch %s of sandbox %s: %s", r.ID, id, r.Fault.Message), Retryable: r.Fault.Retryable}, 0)
				}
			}
			recs[i], errs[i] = r, err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		m.deleteAll(recs)
		return nil, err
	}
	return recs, nil
}

// deleteAll deletes sandboxes a failed fork made.
func (m *Manager) deleteAll(recs []store.Sandbox) {
	for _, r := range recs {
		if r.ID != "" {
			_ = m.Delete(context.Background(), r.ID)
		}
	}
}
