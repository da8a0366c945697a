package manager

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/runtime"
	"github.com/orchard/orchard/store"
)

// Warm pools keep sandboxes of one spec started ahead of need, so that a
// create matching the spec hands one over at once (a claim) instead of
// starting a container. Pools are manager-level: they work on every
// runtime and, through the store, across replicas.
//
// A member is an ordinary sandbox record with Pool set and PoolState
// PoolMember: hidden from List, exempt from heartbeat cleanup. A claim is
// one atomic UpdateSandbox that flips PoolState from PoolMember to "" (or
// to PoolMoving, when the client named its own sandbox_id: the record is
// then re-created under that id with RuntimeID naming the container), so
// two replicas never hand out the same member. Definitions are store Docs
// of kind "pool" (and, with the process's memory store, a file under the
// state directory, Config.PoolsFile).

// PoolLabel is the runtime label marking a sandbox a pool made; its value
// is the pool's name. The runtime keeps a sandbox's labels across server
// restarts, which is how a restarted server recognises its pools' members.
// Creates may not set it.
const PoolLabel = "orchard.pool"

// MaxPoolSize caps a pool's size and max.
const MaxPoolSize = 256

const (
	poolDocKind  = "pool"
	poolStatKind = "poolstat"
	// poolTick is how often each replica looks at every pool even when
	// nothing kicked it: it notices members that died, a pool another
	// replica defined, and a refill another replica's lease held back.
	poolTick = 2 * time.Second
	// poolBusyRetry is how soon a refill that found another replica
	// refilling the pool tries again, so that a claim made meanwhile is
	// not left unrefilled until the next tick.
	poolBusyRetry = 100 * time.Millisecond
	// poolLeaseTTL bounds how long a refiller that died blocks the pool's
	// refills; a refill pass takes milliseconds (it stores pending records
	// and leaves the starts to the background).
	poolLeaseTTL = 15 * time.Second
)

// Pool is a warm pool's definition.
type Pool struct {
	Name string `json:"name"`
	// Size is how many ready members the pool keeps.
	Size int `json:"size"`
	// Max bounds ready plus starting members (recycling starts a
	// replacement before the old member goes); default Size.
	Max int `json:"max"`
	// Sandbox is the POST /sandboxes body the members are made from, as
	// the client gave it.
	Sandbox json.RawMessage `json:"sandbox"`
	// Params is Sandbox validated, the server's defaults applied.
	Params    CreateParams `json:"params"`
	CreatedAt float64      `json:"created_at"`
}

// PoolStatus is a pool with its counts.
type PoolStatus struct {
	Pool
	Ready    int `json:"ready"`
	Starting int `json:"starting"`
	// Claims and Misses count creates that went to the pool since it was
	// defined (per replica since it started, summed over replicas): a
	// miss found it empty and started a sandbox cold.
	Claims int `json:"claims"`
	Misses int `json:"misses"`
}

// PoolResult says how a create went through a pool.
type PoolResult struct {
	// Pool is the pool the create named or matched; "" for none.
	Pool string
	// Claimed: a ready member was handed over. False with Pool set is a
	// miss: the pool was empty and the sandbox starts cold.
	Claimed bool
}

// pools is the manager's warm-pool state on this replica.
type pools struct {
	once  sync.Once
	kick  chan struct{} // wakes the refill loop; buffered 1
	slots chan struct{} // the pools' share of the creates semaphore

	mu      sync.Mutex                // guards defs, stats, claimed
	defs    map[string]Pool           // known definitions, for implicit matching
	stats   map[string]*poolStat      // this replica's claims and misses
	claimed map[string]claimedSandbox // Config.PoolsFile: claimed sandboxes by runtime id
	fileMu  sync.Mutex                // serialises writes of Config.PoolsFile
	started bool                      // the refill loop runs
}

type poolStat struct{ Claims, Misses int }

// claimedSandbox is what a restart needs to give a claimed member back to
// its user with the memory store: its record (claim-time id, labels, TTL)
// and the egress allow-list of the claim.
type claimedSandbox struct {
	Record      store.Sandbox `json:"record"`
	EgressAllow []string      `json:"egress_allow,omitempty"`
}

// poolsFile is the layout of Config.PoolsFile.
type poolsFile struct {
	Pools   []Pool                    `json:"pools"`
	Claimed map[string]claimedSandbox `json:"claimed,omitempty"`
}

func (m *Manager) poolState() *pools {
	p := &m.pl
	p.once.Do(func() {
		p.kick = make(chan struct{}, 1)
		// Refills take at most half the create slots, so users' cold
		// creates always find the other half free: a pool refilling after
		// a burst of claims cannot starve them.
		p.slots = make(chan struct{}, max(1, m.cfg.MaxConcurrentCreates/2))
		p.defs = map[string]Pool{}
		p.stats = map[string]*poolStat{}
		p.claimed = map[string]claimedSandbox{}
	})
	return p
}

// startPools starts the refill loop once; the manager's Shutdown ends it.
func (m *Manager) startPools() {
	p := m.poolState()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started {
		return
	}
	select {
	case <-m.stopping:
		return
	default:
	}
	p.started = true
	m.bg.Add(1)
	go m.poolLoop()
}

func (m *Manager) kickPools() {
	select {
	case m.poolState().kick <- struct{}{}:
	default:
	}
}

// poolSlot takes a create slot from the pools' share; release gives it back.
func (m *Manager) poolSlot(ctx context.Context) (release func(), err error) {
	s := m.poolState().slots
	select {
	case s <- struct{}{}:
		return func() { <-s }, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

func (m *Manager) docs() (store.Docs, error) {
	d, ok := m.st.(store.Docs)
	if !ok {
		return nil, faults.New(faults.CodeKindUnsupported, faults.NotImplemented, faults.Platform, "this server's store cannot keep warm pools")
	}
	return d, nil
}

// Pool errors.
func errPoolNotFound(name string) error {
	return faults.Newf(faults.CodePoolNotFound, faults.NotFound, faults.Client, "pool %s not found", name)
}

func poolInvalid(format string, a ...any) error {
	return faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client, format, a...)
}

// CreatePool validates and stores a pool definition and starts filling it.
func (m *Manager) CreatePool(ctx context.Context, def Pool) (PoolStatus, error) {
	d, err := m.docs()
	if err != nil {
		return PoolStatus{}, err
	}
	switch {
	case !ValidID(def.Name):
		return PoolStatus{}, poolInvalid("invalid pool name %q: must be a DNS-1123 label (lowercase letters, digits and '-', at most 63 characters)", def.Name)
	case def.Size < 0 || def.Size > MaxPoolSize:
		return PoolStatus{}, poolInvalid("size must be 0 to %d", MaxPoolSize)
	case def.Max == 0:
		def.Max = def.Size
	}
	if def.Max < def.Size || def.Max > MaxPoolSize {
		return PoolStatus{}, poolInvalid("max must be at least size (%d) and at most %d", def.Size, MaxPoolSize)
	}
	if def.Params.ID != "" {
		return PoolStatus{}, poolInvalid("a pool's sandbox names no sandbox_id: each claim may name its own")
	}
	p, err := m.poolParams(def.Params)
	if err != nil {
		return PoolStatus{}, err
	}
	def.Params = p
	def.CreatedAt = m.unix()
	// The pool's lease keeps two creates of one name (on two replicas)
	// from both finding it free.
	release, err := m.poolLease(ctx, def.Name)
	if err != nil {
		return PoolStatus{}, err
	}
	if release == nil {
		return PoolStatus{}, faults.Newf(faults.CodePoolExists, faults.Conflict, faults.Client, "pool %s is being changed; try again", def.Name)
	}
	defer release()
	if _, ok, err := d.GetDoc(ctx, poolDocKind, def.Name); err != nil {
		return PoolStatus{}, err
	} else if ok {
		return PoolStatus{}, faults.Newf(faults.CodePoolExists, faults.Conflict, faults.Client, "pool %s already exists", def.Name)
	}
	b, err := json.Marshal(def)
	if err != nil {
		return PoolStatus{}, err
	}
	if err := d.PutDoc(ctx, poolDocKind, def.Name, b, 0); err != nil {
		return PoolStatus{}, err
	}
	ps := m.poolState()
	ps.mu.Lock()
	ps.defs[def.Name] = def
	ps.mu.Unlock()
	m.savePoolsFile(ctx)
	m.startPools()
	m.kickPools()
	return PoolStatus{Pool: def}, nil
}

// poolLease takes the pool's lease ("pool:"+name) when the store elects
// (nil release when another holder has it); with no Elector, a no-op.
func (m *Manager) poolLease(ctx context.Context, name string) (release func(), err error) {
	e, ok := m.st.(store.Elector)
	if !ok {
		return func() {}, nil
	}
	lease := "pool:" + name
	got, err := e.TryAcquire(ctx, lease, m.cfg.ReplicaID, poolLeaseTTL)
	if err != nil || !got {
		return nil, err
	}
	return func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = e.Release(rctx, lease, m.cfg.ReplicaID)
	}, nil
}

// poolParams checks a pool's sandbox spec as Create would check a create
// (nothing is started for a bad one) and applies the server's defaults.
func (m *Manager) poolParams(p CreateParams) (CreateParams, error) {
	if err := checkReservedLabels(p); err != nil {
		return p, err
	}
	p = m.withDefaults(p)
	if p.Kind != api.KindShell && !(p.Kind == api.KindBrowser && m.cfg.Browser) && !(p.Kind == api.KindDesktop && m.cfg.Desktop) {
		return p, faults.Newf(faults.CodeKindUnsupported, faults.NotImplemented, faults.Client,
			"sandbox kind %q is not available on this server yet", p.Kind)
	}
	if !p.BlockNetwork && m.cfg.DisableEgress {
		return p, faults.New(faults.CodeNetworkEgressOff, faults.NotImplemented, faults.Client,
			"block_network=false needs sandbox egress, which this server does not offer yet")
	}
	if (len(p.EgressAllow) > 0 || p.NetworkMode == runtime.NetworkFull) && p.BlockNetwork {
		return p, poolInvalid("egress settings need block_network=false")
	}
	if c, ok := m.rt.(runtime.ImageChecker); ok {
		if err := c.CheckImage(p.Image); err != nil {
			return p, err
		}
	}
	if _, err := ParseCPU(p.CPU); err != nil {
		return p, poolInvalid("invalid cpu: %v", err)
	}
	if _, err := ParseMemory(p.Memory); err != nil {
		return p, poolInvalid("invalid memory: %v", err)
	}
	if _, err := m.ephemeralStorage(p.EphemeralStorage, true); err != nil {
		return p, err
	}
	return p, nil
}

// checkReservedLabels refuses a create that sets PoolLabel: a sandbox
// carrying it would be taken for a pool's member after a restart.
func checkReservedLabels(p CreateParams) error {
	if v, ok := p.Labels[PoolLabel]; ok && p.pool == "" {
		return faults.Validation(faults.FieldError{Type: "value_error", Loc: []any{"body", "labels", PoolLabel},
			Msg: fmt.Sprintf("label %q is reserved for warm pools", PoolLabel), Input: v})
	}
	return nil
}

// withDefaults applies the defaults Create applies, so that two specs
// can be compared as the sandboxes they make.
func (m *Manager) withDefaults(p CreateParams) CreateParams {
	if p.Kind == "" {
		p.Kind = api.KindShell
	}
	if p.Image == "" && !m.cfg.RuntimeImages {
		p.Image = m.cfg.DefaultImage
	}
	if p.CPU == "" {
		p.CPU = m.cfg.DefaultCPU
	}
	if p.Memory == "" {
		p.Memory = m.cfg.DefaultMemory
	}
	if p.EphemeralStorage == "" {
		p.EphemeralStorage = m.cfg.DefaultEphemeralStorage
	}
	return p
}

// runtimeLabels are the labels a create gives the runtime: the request's,
// plus PoolLabel for a pool's member.
func (p CreateParams) runtimeLabels() map[string]string {
	if p.pool == "" {
		return p.Labels
	}
	l := maps.Clone(p.Labels)
	if l == nil {
		l = map[string]string{}
	}
	l[PoolLabel] = p.pool
	return l
}

// coldDiff returns the first setting in which two creates differ that
// needs another sandbox (a cold start), by its request field name, or ""
// when a member made from pool can serve req. Per-claim settings — labels,
// ttl_seconds, timeout, sandbox_id, egress.allow, the browser's viewport
// and start_url — are not compared: a claim applies them.
func (m *Manager) coldDiff(pool, req CreateParams) string {
	a, b := m.withDefaults(pool), m.withDefaults(req)
	switch {
	case a.Kind != b.Kind:
		return "kind"
	case a.Image != b.Image:
		return "image"
	case !sameQuantity(a.CPU, b.CPU, ParseCPU):
		return "cpu"
	case !sameQuantity(a.Memory, b.Memory, ParseMemory):
		return "memory"
	case !sameQuantity(a.EphemeralStorage, b.EphemeralStorage, ParseEphemeralStorage):
		return "ephemeral_storage"
	case a.BlockNetwork != b.BlockNetwork:
		return "block_network"
	case a.NetworkMode != b.NetworkMode:
		return "egress.mode"
	case !maps.Equal(a.Env, b.Env):
		return "env"
	case !bytes.Equal(a.Faults, b.Faults):
		return "faults"
	case a.Snapshot != b.Snapshot:
		return "snapshot"
	case !slices.Equal(a.StartExec, b.StartExec):
		return "exec"
	case !slices.Equal(a.Harnesses, b.Harnesses):
		return "harnesses"
	case !bytes.Equal(launchOptions(a), launchOptions(b)):
		return a.Kind // "browser" or "desktop": their launch settings
	}
	return ""
}

func sameQuantity[T comparable](a, b string, parse func(string) (T, error)) bool {
	if a == b {
		return true
	}
	x, errA := parse(a)
	y, errB := parse(b)
	return errA == nil && errB == nil && x == y
}

// launchOptions are a create's kind settings that need a new process
// (all of them but the browser's viewport and start_url), canonical.
func launchOptions(p CreateParams) []byte {
	switch p.Kind {
	case api.KindBrowser:
		var o api.BrowserOptions
		_ = json.Unmarshal(p.KindOptions, &o)
		o.Viewport, o.StartURL = api.Viewport{}, ""
		b, _ := json.Marshal(o)
		return b
	case api.KindDesktop:
		var o api.DesktopOptions
		_ = json.Unmarshal(p.KindOptions, &o)
		b, _ := json.Marshal(o)
		return b
	}
	return nil
}

// loadPools reads every definition from the store and refreshes the cache
// used for implicit matching.
func (m *Manager) loadPools(ctx context.Context) (map[string]Pool, error) {
	d, err := m.docs()
	if err != nil {
		return nil, err
	}
	raw, err := d.ListDocs(ctx, poolDocKind)
	if err != nil {
		return nil, err
	}
	defs := make(map[string]Pool, len(raw))
	for name, b := range raw {
		var p Pool
		if err := json.Unmarshal(b, &p); err != nil {
			m.log.Warn("pools: undecodable definition", "pool", name, "err", err)
			continue
		}
		defs[name] = p
	}
	ps := m.poolState()
	ps.mu.Lock()
	ps.defs = maps.Clone(defs)
	ps.mu.Unlock()
	return defs, nil
}

// getPool returns one definition from the store.
func (m *Manager) getPool(ctx context.Context, name string) (Pool, error) {
	d, err := m.docs()
	if err != nil {
		return Pool{}, err
	}
	b, ok, err := d.GetDoc(ctx, poolDocKind, name)
	if err != nil {
		return Pool{}, err
	}
	if !ok {
		return Pool{}, errPoolNotFound(name)
	}
	var p Pool
	if err := json.Unmarshal(b, &p); err != nil {
		return Pool{}, err
	}
	return p, nil
}

// ListPools returns every pool with its counts.
func (m *Manager) ListPools(ctx context.Context) ([]PoolStatus, error) {
	defs, err := m.loadPools(ctx)
	if err != nil {
		return nil, err
	}
	if len(defs) > 0 {
		m.startPools()
	}
	recs, err := m.st.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	stats := m.poolStats(ctx)
	out := make([]PoolStatus, 0, len(defs))
	for _, def := range defs {
		out = append(out, m.poolStatus(def, recs, stats))
	}
	slices.SortFunc(out, func(a, b PoolStatus) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// GetPool returns one pool with its counts.
func (m *Manager) GetPool(ctx context.Context, name string) (PoolStatus, error) {
	def, err := m.getPool(ctx, name)
	if err != nil {
		return PoolStatus{}, err
	}
	recs, err := m.st.ListSandboxes(ctx)
	if err != nil {
		return PoolStatus{}, err
	}
	return m.poolStatus(def, recs, m.poolStats(ctx)), nil
}

func (m *Manager) poolStatus(def Pool, recs []store.Sandbox, stats map[string]poolStat) PoolStatus {
	s := PoolStatus{Pool: def, Claims: stats[def.Name].Claims, Misses: stats[def.Name].Misses}
	for _, r := range recs {
		if r.Pool != def.Name || r.PoolState != store.PoolMember {
			continue
		}
		switch r.Status {
		case api.StatusReady:
			s.Ready++
		case api.StatusPending:
			s.Starting++
		}
	}
	return s
}

// poolStats sums the claims and misses of every replica: the others' from
// their stat documents, this one's as it counts them now.
func (m *Manager) poolStats(ctx context.Context) map[string]poolStat {
	out := map[string]poolStat{}
	mine := "/" + m.cfg.ReplicaID
	if d, err := m.docs(); err == nil {
		if raw, err := d.ListDocs(ctx, poolStatKind); err == nil {
			for id, b := range raw {
				name, replica, ok := strings.Cut(id, "/")
				if !ok || "/"+replica == mine {
					continue
				}
				var st poolStat
				if json.Unmarshal(b, &st) == nil {
					o := out[name]
					o.Claims, o.Misses = o.Claims+st.Claims, o.Misses+st.Misses
					out[name] = o
				}
			}
		}
	}
	ps := m.poolState()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for name, st := range ps.stats {
		o := out[name]
		o.Claims, o.Misses = o.Claims+st.Claims, o.Misses+st.Misses
		out[name] = o
	}
	return out
}

// flushPoolStats stores this replica's counts for the others to read.
func (m *Manager) flushPoolStats(ctx context.Context) {
	d, err := m.docs()
	if err != nil {
		return
	}
	ps := m.poolState()
	ps.mu.Lock()
	stats := make(map[string]poolStat, len(ps.stats))
	for name, st := range ps.stats {
		stats[name] = *st
	}
	ps.mu.Unlock()
	for name, st := range stats {
		b, _ := json.Marshal(st)
		_ = d.PutDoc(ctx, poolStatKind, name+"/"+m.cfg.ReplicaID, b, 0)
	}
}

func (m *Manager) countPool(name string, claimed bool) {
	ps := m.poolState()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	st := ps.stats[name]
	if st == nil {
		st = &poolStat{}
		ps.stats[name] = st
	}
	if claimed {
		st.Claims++
	} else {
		st.Misses++
	}
}

// DeletePool removes a pool and drains it: its unclaimed members are
// deleted; claimed ones are their users' and stay. It returns how many
// members it deleted.
func (m *Manager) DeletePool(ctx context.Context, name string) (int, error) {
	d, err := m.docs()
	if err != nil {
		return 0, err
	}
	if _, err := m.getPool(ctx, name); err != nil {
		return 0, err
	}
	if err := d.DeleteDoc(ctx, poolDocKind, name); err != nil {
		return 0, err
	}
	ps := m.poolState()
	ps.mu.Lock()
	delete(ps.defs, name)
	delete(ps.stats, name)
	ps.mu.Unlock()
	if raw, err := d.ListDocs(ctx, poolStatKind); err == nil {
		for id := range raw {
			if strings.HasPrefix(id, name+"/") {
				_ = d.DeleteDoc(ctx, poolStatKind, id)
			}
		}
	}
	m.savePoolsFile(ctx)
	// A refill on another replica may store one more member after this
	// listing; every replica's loop deletes members of pools that are gone,
	// this one's from now.
	defer m.kickPools()
	return m.drain(ctx, name, nil)
}

// drain deletes the unclaimed members of pool (of every pool not in keep
// when pool is "").
func (m *Manager) drain(ctx context.Context, pool string, keep map[string]Pool) (int, error) {
	recs, err := m.st.ListSandboxes(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range recs {
		if r.PoolState != store.PoolMember {
			continue
		}
		if pool != "" && r.Pool != pool {
			continue
		}
		if _, ok := keep[r.Pool]; pool == "" && ok {
			continue
		}
		if err := m.Delete(ctx, r.ID); err != nil {
			m.log.Warn("pools: delete member", "pool", r.Pool, "sandbox_id", r.ID, "err", err)
			continue
		}
		n++
	}
	return n, nil
}

// CreateOrClaim is a create that may be served by a warm pool. pool names
// the pool to claim from ("" = any pool whose spec p matches). A pool
// whose spec p does not match is a conflict when named, no match when
// not. An empty pool falls back to a cold create (a miss).
func (m *Manager) CreateOrClaim(ctx context.Context, p CreateParams, pool string) (store.Sandbox, PoolResult, error) {
	if err := checkReservedLabels(p); err != nil {
		return store.Sandbox{}, PoolResult{}, err
	}
	var def Pool
	if pool != "" {
		var err error
		if def, err = m.getPool(ctx, pool); err != nil {
			return store.Sandbox{}, PoolResult{}, err
		}
		if f := m.coldDiff(def.Params, p); f != "" {
			return store.Sandbox{}, PoolResult{}, faults.ValidationCode(faults.CodePoolMismatch, faults.FieldError{
				Type: "value_error", Loc: append([]any{"body"}, anySlice(strings.Split(f, "."))...),
				Msg: fmt.Sprintf("pool %s makes sandboxes with another %s; a claim can change only labels, ttl_seconds, timeout, sandbox_id, "+
					"egress.allow and the browser's viewport and start_url", pool, f)})
		}
		m.startPools()
	} else {
		ok := false
		if def, ok = m.matchPool(p); !ok {
			rec, err := m.Create(ctx, p)
			return rec, PoolResult{}, err
		}
	}
	if p.ID != "" && !ValidID(p.ID) {
		return store.Sandbox{}, PoolResult{}, poolInvalid("invalid sandbox_id %q: must be a DNS-1123 label (lowercase letters, digits and '-', at most 63 characters)", p.ID)
	}
	if len(p.EgressAllow) > 0 && def.Params.BlockNetwork {
		return store.Sandbox{}, PoolResult{}, poolInvalid("egress settings need block_network=false")
	}
	rec, ok, err := m.claim(ctx, def, p)
	if err != nil {
		return store.Sandbox{}, PoolResult{}, err
	}
	m.countPool(def.Name, ok)
	m.kickPools()
	if ok {
		return rec, PoolResult{Pool: def.Name, Claimed: true}, nil
	}
	rec, err = m.Create(ctx, p)
	return rec, PoolResult{Pool: def.Name}, err
}

// matchPool returns a pool (the oldest, when several match) whose spec p
// matches. The definitions come from this replica's cache, which its
// refill loop reloads every poolTick: a pool another replica just defined
// is matched from the next tick on.
func (m *Manager) matchPool(p CreateParams) (Pool, bool) {
	ps := m.poolState()
	ps.mu.Lock()
	defs := slices.Collect(maps.Values(ps.defs))
	ps.mu.Unlock()
	slices.SortFunc(defs, func(a, b Pool) int { return strings.Compare(a.Name, b.Name) })
	for _, d := range defs {
		if m.coldDiff(d.Params, p) == "" {
			return d, true
		}
	}
	return Pool{}, false
}

// errTaken aborts a claim's update of a member another claim took first.
var errTaken = errors.New("pool member taken")

// claim hands a ready member of def over to the create p, or reports
// ok=false when there is none.
func (m *Manager) claim(ctx context.Context, def Pool, p CreateParams) (rec store.Sandbox, ok bool, err error) {
	recs, err := m.st.ListSandboxes(ctx)
	if err != nil {
		return store.Sandbox{}, false, err
	}
	var cands []string
	for _, r := range recs {
		if r.Pool == def.Name && r.PoolState == store.PoolMember && r.Status == api.StatusReady {
			cands = append(cands, r.ID)
		}
	}
	// Concurrent claims (on this and other replicas) start at different
	// members rather than all contend for the first.
	if n := len(cands); n > 1 {
		k := rand.IntN(n)
		cands = append(cands[k:], cands[:k]...)
	}
	alias := p.ID
	for _, id := range cands {
		now := m.unix()
		got, err := m.st.UpdateSandbox(ctx, id, func(r *store.Sandbox) error {
			if r.PoolState != store.PoolMember || r.Status != api.StatusReady {
				return errTaken
			}
			if alias != "" && alias != r.ID {
				r.PoolState = store.PoolMoving
				return nil
			}
			applyClaim(r, p, now)
			return nil
		})
		if errors.Is(err, errTaken) || faults.Is(err, faults.CodeSandboxNotFound) {
			continue
		}
		if err != nil {
			return store.Sandbox{}, false, err
		}
		if live := m.live(ctx, got); live.Status != api.StatusReady {
			// Died while waiting: the refill replaces it.
			m.log.Info("pools: member found dead at claim", "pool", def.Name, "sandbox_id", got.ID)
			_ = m.Delete(ctx, got.ID)
			continue
		}
		if got.PoolState == store.PoolMoving {
			moved := got.Clone()
			moved.ID, moved.RuntimeID = alias, got.RuntimeName()
			applyClaim(&moved, p, now)
			if err := m.st.CreateSandbox(ctx, moved); err != nil {
				// The id is taken: the member goes back to its pool.
				_, _ = m.st.UpdateSandbox(context.WithoutCancel(ctx), got.ID, func(r *store.Sandbox) error {
					if r.PoolState == store.PoolMoving {
						r.PoolState = store.PoolMember
					}
					return nil
				})
				return store.Sandbox{}, false, err
			}
			// Only the record goes: its container is moved's now.
			if err := m.st.DeleteSandbox(ctx, got.ID); err != nil {
				m.log.Warn("pools: remove the record of a moved member", "sandbox_id", got.ID, "err", err)
			}
			got = moved
		}
		m.afterClaim(ctx, def, got, p)
		return got, true, nil
	}
	return store.Sandbox{}, false, nil
}

// applyClaim turns a member's record into its user's: the per-claim
// settings, and an age counted from now.
func applyClaim(r *store.Sandbox, p CreateParams, now float64) {
	r.PoolState = ""
	r.CreatedAt = now
	r.Labels = maps.Clone(p.Labels)
	r.TTLSeconds = p.TTLSeconds
	// Heartbeat cleanup starts with the user's first heartbeat, as after
	// a cold create.
	r.LastHeartbeat = nil
	if p.Timeout > 0 {
		r.CreationTimeout = p.Timeout
	}
}

// afterClaim applies the claim's egress allow-list and keeps the claim
// across restarts (Config.PoolsFile).
func (m *Manager) afterClaim(ctx context.Context, def Pool, rec store.Sandbox, p CreateParams) {
	if !rec.BlockNetwork && def.Params.NetworkMode != runtime.NetworkFull && m.cfg.Egress != nil && rec.AgentAddr != "" &&
		!slices.Equal(p.EgressAllow, def.Params.EgressAllow) {
		m.cfg.Egress.Attach(rec.RuntimeName(), rec.AgentAddr, p.EgressAllow)
	}
	if m.cfg.PoolsFile != "" {
		ps := m.poolState()
		ps.mu.Lock()
		ps.claimed[rec.RuntimeName()] = claimedSandbox{Record: rec, EgressAllow: p.EgressAllow}
		ps.mu.Unlock()
		m.savePoolsFile(ctx)
	}
	_ = m.st.Publish(ctx, store.SandboxTopic(rec.ID))
}

// poolLoop keeps every pool filled until the manager stops.
func (m *Manager) poolLoop() {
	defer m.bg.Done()
	t := time.NewTicker(poolTick)
	defer t.Stop()
	kick := m.poolState().kick
	for {
		busy := m.refillPools(m.stopCtx)
		var soon <-chan time.Time
		if busy {
			soon = time.After(poolBusyRetry)
		}
		select {
		case <-m.stopping:
			return
		case <-kick:
		case <-t.C:
		case <-soon:
		}
	}
}

// refillPools makes one pass over every pool; busy reports a pool whose
// refill another replica held.
func (m *Manager) refillPools(ctx context.Context) (busy bool) {
	defs, err := m.loadPools(ctx)
	if err != nil {
		m.log.Warn("pools: list definitions", "err", err)
		return false
	}
	m.flushPoolStats(ctx)
	recs, err := m.st.ListSandboxes(ctx)
	if err != nil {
		m.log.Warn("pools: list sandboxes", "err", err)
		return false
	}
	members := map[string][]store.Sandbox{}
	orphans := false
	for _, r := range recs {
		if r.PoolState != store.PoolMember {
			continue
		}
		if _, ok := defs[r.Pool]; !ok {
			orphans = true
			continue
		}
		members[r.Pool] = append(members[r.Pool], r)
	}
	if orphans { // members of a pool deleted meanwhile
		_, _ = m.drain(ctx, "", defs)
	}
	for _, def := range defs {
		if !m.refillPool(ctx, def, members[def.Name]) {
			busy = true
		}
	}
	return busy
}

// recycleAge is the age at which a waiting member is replaced: half the
// age cap (SANDBOX_TTL), so a runtime that enforces the cap from the
// container's start (a pod's deadline) never ends a sandbox soon after
// its claim.
func (m *Manager) recycleAge() time.Duration { return m.cfg.SandboxTTL / 2 }

// refillPool brings one pool to its size under its lease; false when
// another replica holds the lease.
func (m *Manager) refillPool(ctx context.Context, def Pool, members []store.Sandbox) bool {
	release, err := m.poolLease(ctx, def.Name)
	if err != nil {
		m.log.Warn("pools: lease", "pool", def.Name, "err", err)
		return true
	}
	if release == nil {
		return false
	}
	defer release()
	// The list was taken before the lease: take it again so that another
	// replica's refill that ended just before is seen.
	if recs, err := m.st.ListSandboxes(ctx); err == nil {
		members = members[:0]
		for _, r := range recs {
			if r.Pool == def.Name && r.PoolState == store.PoolMember {
				members = append(members, r)
			}
		}
	}
	now := m.now()
	var fresh, starting int
	var old []string
	for _, r := range members {
		switch r.Status {
		case api.StatusPending, api.StatusUnschedulable:
			starting++
			continue
		case api.StatusReady:
			if live := m.live(ctx, r); live.Status == api.StatusReady {
				if now.Sub(unixTime(r.CreatedAt)) > m.recycleAge() {
					old = append(old, r.ID)
				} else {
					fresh++
				}
				continue
			}
		}
		// Failed, or found dead: replace it.
		m.log.Info("pools: removing a dead member", "pool", def.Name, "sandbox_id", r.ID, "status", r.Status)
		_ = m.Delete(ctx, r.ID)
	}
	need := def.Size - fresh - starting
	// Replacements of old members start before the old ones go, within max.
	for over := fresh + starting + len(old) + max(need, 0) - def.Max; over > 0 && len(old) > 0; over-- {
		_ = m.Delete(ctx, old[0])
		old = old[1:]
	}
	n := min(need, def.Max-fresh-starting-len(old))
	for range max(n, 0) {
		p := def.Params
		p.pool = def.Name
		if _, err := m.Create(ctx, p); err != nil {
			m.log.Warn("pools: create member", "pool", def.Name, "err", err)
			break
		}
	}
	if fresh >= def.Size { // replaced: the old ones go
		for _, id := range old {
			_ = m.Delete(ctx, id)
		}
	}
	return true
}

// loadPoolsFile brings the definitions kept in Config.PoolsFile into the
// store (a memory store starts empty) and returns the claimed sandboxes
// it recorded.
func (m *Manager) loadPoolsFile(ctx context.Context) map[string]claimedSandbox {
	if m.cfg.PoolsFile == "" {
		return nil
	}
	b, err := os.ReadFile(m.cfg.PoolsFile)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			m.log.Warn("pools: read state", "err", err)
		}
		return nil
	}
	var f poolsFile
	if err := json.Unmarshal(b, &f); err != nil {
		m.log.Warn("pools: decode state", "file", m.cfg.PoolsFile, "err", err)
		return nil
	}
	d, err := m.docs()
	if err != nil {
		return nil
	}
	ps := m.poolState()
	for _, p := range f.Pools {
		if _, ok, err := d.GetDoc(ctx, poolDocKind, p.Name); err == nil && !ok {
			b, _ := json.Marshal(p)
			_ = d.PutDoc(ctx, poolDocKind, p.Name, b, 0)
		}
		ps.mu.Lock()
		ps.defs[p.Name] = p
		ps.mu.Unlock()
	}
	return f.Claimed
}

// savePoolsFile writes the definitions and claims to Config.PoolsFile.
func (m *Manager) savePoolsFile(ctx context.Context) {
	if m.cfg.PoolsFile == "" {
		return
	}
	ps := m.poolState()
	ps.fileMu.Lock()
	defer ps.fileMu.Unlock()
	defs, err := m.loadPools(ctx)
	if err != nil {
		m.log.Warn("pools: save state", "err", err)
		return
	}
	f := poolsFile{Pools: slices.Collect(maps.Values(defs))}
	slices.SortFunc(f.Pools, func(a, b Pool) int { return strings.Compare(a.Name, b.Name) })
	ps.mu.Lock()
	f.Claimed = maps.Clone(ps.claimed)
	ps.mu.Unlock()
	b, err := json.Marshal(f)
	if err == nil {
		err = os.MkdirAll(filepath.Dir(m.cfg.PoolsFile), 0o700)
	}
	if err == nil {
		tmp := m.cfg.PoolsFile + ".tmp"
		if err = os.WriteFile(tmp, b, 0o600); err == nil {
			err = os.Rename(tmp, m.cfg.PoolsFile)
		}
	}
	if err != nil {
		m.log.Warn("pools: save state", "file", m.cfg.PoolsFile, "err", err)
	}
}

// adoptPooled re-adopts a live sandbox a pool made, left by an earlier
// process with the memory store: a claimed one gets its claim's record
// back, an unclaimed one rejoins its pool, and one whose pool is gone is
// removed. It reports whether inst was a pool's.
func (m *Manager) adoptPooled(ctx context.Context, inst runtime.Instance, claimed map[string]claimedSandbox) bool {
	name := inst.Spec.Labels[PoolLabel]
	if name == "" {
		return false
	}
	if c, ok := claimed[inst.ID]; ok {
		rec := c.Record
		rec.AgentAddr, rec.Ready, rec.Status, rec.StatusMessage = inst.AgentAddr, true, api.StatusReady, ""
		if err := m.st.CreateSandbox(ctx, rec); err != nil {
			m.log.Warn("recover: store record", "sandbox_id", rec.ID, "err", err)
			return true
		}
		if !rec.BlockNetwork && inst.Spec.NetworkMode != runtime.NetworkFull {
			m.attachEgress(runtime.Spec{ID: inst.ID, EgressAllow: c.EgressAllow}, inst.AgentAddr)
		}
		ps := m.poolState()
		ps.mu.Lock()
		ps.claimed[inst.ID] = c
		ps.mu.Unlock()
		m.log.Info("recover: re-attached a claimed pool sandbox", "sandbox_id", rec.ID, "pool", name)
		return true
	}
	ps := m.poolState()
	ps.mu.Lock()
	_, known := ps.defs[name]
	ps.mu.Unlock()
	if !known {
		m.log.Info("recover: removing a member of a pool that is gone", "sandbox_id", inst.ID, "pool", name)
		if err := m.rt.Delete(ctx, inst.ID); err != nil {
			m.log.Warn("recover: delete", "sandbox_id", inst.ID, "err", err)
		}
		return true
	}
	sp := inst.Spec
	labels := maps.Clone(sp.Labels)
	delete(labels, PoolLabel)
	rec := store.Sandbox{
		ID: inst.ID, Namespace: m.cfg.Namespace, Kind: sp.Kind, Image: sp.Image, BlockNetwork: sp.BlockNetwork,
		CPU: sp.CPUQuantity, Memory: sp.MemoryQuantity, CreatedAt: float64(inst.CreatedAt.UnixNano()) / 1e9,
		Ready: true, Status: api.StatusReady, CreationTimeout: 3600, Labels: labels, Env: sp.Env,
		AgentAddr: inst.AgentAddr, EphemeralStorage: sp.EphemeralStorageQuantity,
		Pool: name, PoolState: store.PoolMember,
	}
	if err := m.st.CreateSandbox(ctx, rec); err != nil {
		m.log.Warn("recover: store record", "sandbox_id", inst.ID, "err", err)
		return true
	}
	m.log.Info("recover: a pool member rejoined its pool", "sandbox_id", inst.ID, "pool", name)
	return true
}

// recoverPools is Recover's part for pools: definitions from
// Config.PoolsFile, then the members and claimed sandboxes adopted by
// adoptPooled, then the refill loop.
func (m *Manager) recoverPools(ctx context.Context) (adopt func(runtime.Instance) bool, done func()) {
	claimed := m.loadPoolsFile(ctx)
	adopt = func(inst runtime.Instance) bool { return m.adoptPooled(ctx, inst, claimed) }
	done = func() {
		// Claims whose sandboxes are gone are forgotten.
		m.savePoolsFile(ctx)
		if defs, err := m.loadPools(ctx); err == nil && len(defs) > 0 {
			m.startPools()
		}
	}
	return adopt, done
}

func anySlice(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// PoolMembers returns the unclaimed members of every pool: not the users'
// sandboxes, but they hold their share of the machine all the same.
func (m *Manager) PoolMembers(ctx context.Context) ([]store.Sandbox, error) {
	recs, err := m.st.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	out := recs[:0]
	for _, r := range recs {
		if r.PoolState != "" {
			out = append(out, r)
		}
	}
	return out, nil
}
