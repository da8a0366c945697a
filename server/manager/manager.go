// Package manager is the sandbox manager: sandbox lifecycle over a runtime,
// exec jobs serialised per sandbox, files and patches through the agent,
// TTL/heartbeat cleanup and reconciliation. It serves no HTTP: the server
// renders its errors, and reaches agents through its Agent interface.
package manager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"regexp"
	goruntime "runtime"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/websocket"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/harness"
	"github.com/orchard/orchard/internal/failpoint"
	"github.com/orchard/orchard/retry"
	"github.com/orchard/orchard/runtime"
	"github.com/orchard/orchard/store"
)

// Agent is a sandbox's agent as the server reaches it: the one seam
// between the server and whatever runtime holds the sandbox. The manager
// runs jobs, files and patches through it; the server's PTY, browser,
// desktop and episode paths reach it through Manager.Agent.
type Agent interface {
	Exec(ctx context.Context, req api.AgentExecRequest, onEvent func(api.ExecEvent)) (api.ExecExit, error)
	Upload(ctx context.Context, req api.UploadRequest) (api.UploadResult, error)
	// UploadFrom writes a file from its bytes as content yields them;
	// mode is asked for once content has ended.
	UploadFrom(ctx context.Context, path string, content io.Reader, mode func() string) (api.UploadResult, error)
	OpenDownload(ctx context.Context, path string) (io.ReadCloser, error)
	List(ctx context.Context, path string) (api.FileList, error)
	Patch(ctx context.Context, req api.AgentPatchRequest) (api.AgentPatchResult, error)
	// DialPTY opens an interactive terminal session (api.PTY* frames);
	// header is added to the handshake.
	DialPTY(ctx context.Context, header http.Header) (*websocket.Conn, *http.Response, error)
	// HTTP returns the agent's base URL and a transport that reaches it
	// (credentials included), for the calls the server forwards as they
	// are: the browser's and desktop's daemons, CDP, live views.
	HTTP() (*url.URL, http.RoundTripper)
}

// Dialer returns the Agent at a runtime's agent address
// (runtime.Instance.AgentAddr). It is expected to pool.
type Dialer func(addr string) Agent

// Egress keeps network-enabled sandboxes' egress tunnels attached.
type Egress interface {
	Attach(id, agentAddr string, allow []string)
	Detach(id string)
}

// Config holds the manager's settings; zero values take the defaults of
// ORCHARD_COMPAT §8.
type Config struct {
	Namespace    string // SANDBOX_NAMESPACE
	DefaultImage string // used when a create names no image (never by the SDK)
	// RuntimeImages leaves the image of a create that names none to the
	// runtime (its default image per kind) instead of DefaultImage.
	RuntimeImages           bool
	DefaultCPU              string // DEFAULT_CPU
	DefaultMemory           string // DEFAULT_MEMORY
	DefaultEphemeralStorage string // DEFAULT_EPHEMERAL_STORAGE: what a sandbox may write
	// DefaultHarnesses are the harnesses (or "all") of a create that names
	// none (DEFAULT_HARNESSES); empty: none.
	DefaultHarnesses        []string
	DefaultTimeoutSeconds   int           // DEFAULT_TIMEOUT_SECONDS (exec)
	WorkingDir              string        // DEFAULT_WORKING_DIR
	SandboxTTL              time.Duration // SANDBOX_TTL_HOURS: hard cap on age
	PendingTimeoutBuffer    time.Duration // PENDING_TIMEOUT_BUFFER_SECONDS
	HeartbeatTimeout        time.Duration // HEARTBEAT_TIMEOUT_SECONDS
	HeartbeatCleanupEnabled bool
	OrphanJobTTL            time.Duration // ORPHAN_JOB_TTL_HOURS
	CleanupInterval         time.Duration // CLEANUP_INTERVAL_SECONDS
	AgentReadyWait          time.Duration // AGENT_READY_WAIT_SECONDS
	ExecConnectRetryWindow  time.Duration // EXEC_CONNECT_RETRY_WINDOW
	MaxConcurrentCreates    int           // MAX_CONCURRENT_CREATES
	MaxOutputBytes          int64         // per stream, per job
	// MaxCPU (cores) and MaxMemory (bytes) are the largest cpu and memory
	// a create may ask for (ORCHARD_MAX_CPU, ORCHARD_MAX_MEMORY); 0 means
	// the host's CPUs and RAM. DefaultCPU and DefaultMemory are not held
	// to them: they are the operator's own choice.
	MaxCPU    float64
	MaxMemory int64
	// DisableEgress makes block_network:false creates fail with 501 (a
	// server with no way to give sandboxes network).
	DisableEgress bool
	// Egress attaches network-enabled sandboxes to the server's egress
	// dialer; nil when the runtime gives sandboxes their own network.
	Egress Egress
	// Browser enables kind "browser" sandboxes (the runtime's images have
	// Chromium and the agent drives it).
	Browser bool
	// Desktop enables kind "desktop" sandboxes (the images have Xvfb).
	Desktop bool
	// AdoptOrphans makes Recover adopt live sandboxes that have no record
	// (their records died with an earlier process's memory store). Leave it
	// off with a shared store, whose records outlive processes.
	AdoptOrphans bool
	// OnRetry observes each retry the manager makes (layer "create": a
	// create the runtime refused for capacity); nil = none.
	OnRetry func(layer string)
	// ReplicaID names this server process among replicas sharing a store
	// (leader election); default host-pid-random.
	ReplicaID string
	// SnapshotMaxBytes caps the filesystem changes one snapshot (or fork)
	// copies (ORCHARD_SNAPSHOT_MAX_BYTES); default 10 GiB.
	SnapshotMaxBytes int64
	// ForkMax caps the branches of one fork (ORCHARD_FORK_MAX); default 32.
	ForkMax int
	// HostID names the machine among replicas sharing a store (ClaimHost);
	// empty: HostID().
	HostID string
	// PoolsFile keeps the warm pools' definitions and claims across
	// restarts when the store is the process's memory (under the state
	// directory); empty with a store that outlives processes.
	PoolsFile string
}

func (c *Config) setDefaults() {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&c.Namespace, "sandbox-pods")
	def(&c.DefaultImage, "host")
	def(&c.DefaultCPU, "4")
	def(&c.DefaultMemory, "16Gi")
	def(&c.DefaultEphemeralStorage, "10Gi")
	def(&c.WorkingDir, "/workspace")
	dur := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	dur(&c.SandboxTTL, 2*time.Hour)
	dur(&c.PendingTimeoutBuffer, 600*time.Second)
	dur(&c.HeartbeatTimeout, 180*time.Second)
	dur(&c.OrphanJobTTL, time.Hour)
	dur(&c.CleanupInterval, 300*time.Second)
	dur(&c.AgentReadyWait, 15*time.Second)
	dur(&c.ExecConnectRetryWindow, 45*time.Second)
	if c.DefaultTimeoutSeconds == 0 {
		c.DefaultTimeoutSeconds = 300
	}
	if c.MaxConcurrentCreates == 0 {
		// Creates are kernel-bound (namespaces, mounts, cgroups): more in
		// flight than a few per core only adds contention. 1,000 concurrent
		// creates on 2 cores: 16.3 s at 8 in flight, 17.9 s at 64.
		c.MaxConcurrentCreates = 4 * goruntime.NumCPU()
	}
	if c.MaxOutputBytes == 0 {
		c.MaxOutputBytes = 64 << 20
	}
	if c.SnapshotMaxBytes == 0 {
		c.SnapshotMaxBytes = defaultSnapshotMaxBytes
	}
	if c.ForkMax == 0 {
		c.ForkMax = defaultForkMax
	}
	if c.HostID == "" {
		c.HostID = HostID()
	}
	if c.ReplicaID == "" {
		host, _ := os.Hostname()
		c.ReplicaID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), uuid.NewString()[:8])
	}
}

// Manager owns sandbox lifecycles.
type Manager struct {
	cfg     Config
	rt      runtime.Runtime
	st      store.Store
	dial    Dialer
	log     *slog.Logger
	creates chan struct{} // semaphore bounding concurrent runtime creates
	limits  Limits

	mu       sync.Mutex // guards locks, creating, deleting, jobs
	locks    map[string]*sandboxLock
	creating map[string]*creation
	// deleting holds, per id, the end of the latest runtime delete of
	// that id (closed when it is done): a create that reuses the id waits
	// for it, or the runtime still has the old sandbox.
	deleting map[string]chan struct{}
	jobs     map[string]map[string]context.CancelCauseFunc // sandbox id → job id → cancel
	pauses   keyedMutex                                    // serialises Pause and Resume per sandbox
	pruneMu  sync.Mutex                                    // one layer prune at a time
	// hostState is the state directory ClaimHost recorded for this host;
	// set before Run.
	hostState string
	pl        pools // warm pools (pools.go)

	bg       sync.WaitGroup // background work: creates, deletes, jobs
	stopping chan struct{}
	// stopCtx ends when stopping is closed (stopCancel, with it), for
	// waits that take a context.
	stopCtx    context.Context
	stopCancel context.CancelFunc
	stopOnce   sync.Once
	now        func() time.Time
}

// New returns a manager. dial returns the agent client for an address; it
// should hand out one pooled client per address (agent.Pool).
// Store is the state store the manager keeps sandboxes and jobs in; the
// server keeps its episodes there too.
func (m *Manager) Store() store.Store { return m.st }

func New(cfg Config, rt runtime.Runtime, st store.Store, dial Dialer, log *slog.Logger) *Manager {
	cfg.setDefaults()
	if log == nil {
		log = slog.Default()
	}
	stopCtx, stopCancel := context.WithCancel(context.Background())
	return &Manager{
		cfg: cfg, rt: rt, st: st, dial: dial, log: log,
		creates:  make(chan struct{}, cfg.MaxConcurrentCreates),
		limits:   cfg.limits(),
		locks:    map[string]*sandboxLock{},
		creating: map[string]*creation{},
		deleting: map[string]chan struct{}{},
		jobs:     map[string]map[string]context.CancelCauseFunc{},
		stopping: make(chan struct{}),
		stopCtx:  stopCtx,
		now:      time.Now,
		// Shutdown calls it, with closing stopping.
		stopCancel: stopCancel,
	}
}

// Config returns the effective configuration.
func (m *Manager) Config() Config { return m.cfg }

func (m *Manager) unix() float64 { return float64(m.now().UnixNano()) / 1e9 }

// errShutdown is the cause given to work cut short by Shutdown.
var errShutdown = faults.New(faults.CodeShuttingDown, faults.Unavailable, faults.Platform, "server is shutting down")

var idPattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// ValidID reports whether id can name a sandbox: a DNS-1123 label, as a pod
// name needs (Orchard fails such creates later with a 500).
func ValidID(id string) bool { return len(id) <= 63 && idPattern.MatchString(id) }

// CreateParams is a validated create request.
type CreateParams struct {
	ID           string // empty = generated
	Kind         string
	KindOptions  []byte // JSON settings of the kind (browser options)
	Image        string
	BlockNetwork bool
	CPU          string
	Memory       string
	Timeout      int // readiness timeout, seconds
	Env          map[string]string
	Labels       map[string]string
	TTLSeconds   int
	// EgressAllow is the host allow-list of a network-enabled sandbox.
	EgressAllow []string
	// NetworkMode is runtime.NetworkProxy (default) or runtime.NetworkFull.
	NetworkMode string
	// Faults is a validated fault plan (JSON) for the sandbox's agent.
	Faults []byte
	// EphemeralStorage caps what the sandbox writes (a quantity); empty:
	// the default.
	EphemeralStorage string
	// Snapshot is the snapshot the sandbox starts from; empty: none.
	Snapshot string

	// Set by fromSnapshot and Fork: the layers the sandbox stacks, the
	// browser state it is restored to, and the sandbox it branches off.
	layers       []string
	browserState []byte
	forkOf       string
	// StartExec runs in the sandbox before it is ready and before its
	// browser state is restored.
	StartExec []string
	// pool names the warm pool a create fills (pools.go).
	pool string
	// Harnesses are the coding-agent harnesses on the sandbox's PATH
	// (names or "all"); nil: Config.DefaultHarnesses.
	Harnesses []string
}

// harnesses resolves a create's harnesses (nil: the default) against
// those the runtime has installed; an unknown or missing name is a 422
// that names it.
func (m *Manager) harnesses(asked []string) ([]string, error) {
	if asked == nil {
		asked = m.cfg.DefaultHarnesses
	}
	if len(asked) == 0 {
		return nil, nil
	}
	var installed []string
	if hl, ok := m.rt.(runtime.HarnessLister); ok {
		var err error
		if installed, err = hl.Harnesses(); err != nil {
			return nil, faults.Wrap(err, faults.CodeInternal, faults.Internal, faults.Platform, "list installed harnesses")
		}
	}
	names, err := harness.Resolve(asked, installed)
	if err != nil {
		return nil, faults.Validation(faults.FieldError{Type: "value_error", Loc: []any{"body", "harnesses"}, Msg: err.Error(), Input: asked})
	}
	return names, nil
}

// maxOOMFaultMemory bounds the limit an injected oom fault fills: filling
// a sandbox of many gigabytes would strain the host, not test anything.
const maxOOMFaultMemory = 1 << 30

// Create stores a pending record and starts the sandbox in the background.
func (m *Manager) Create(ctx context.Context, p CreateParams) (store.Sandbox, error) {
	if p.Snapshot != "" {
		if err := m.fromSnapshot(ctx, &p); err != nil {
			return store.Sandbox{}, err
		}
	}
	if p.Kind == "" {
		p.Kind = api.KindShell
	}
	if err := checkReservedLabels(p); err != nil {
		return store.Sandbox{}, err
	}
	if p.Kind != api.KindShell && !(p.Kind == api.KindBrowser && m.cfg.Browser) && !(p.Kind == api.KindDesktop && m.cfg.Desktop) {
		return store.Sandbox{}, faults.Newf(faults.CodeKindUnsupported, faults.NotImplemented, faults.Client,
			"sandbox kind %q is not available on this server yet", p.Kind)
	}
	if !p.BlockNetwork && m.cfg.DisableEgress {
		return store.Sandbox{}, faults.New(faults.CodeNetworkEgressOff, faults.NotImplemented, faults.Client,
			"block_network=false needs sandbox egress, which this server does not offer yet; create with block_network=true")
	}
	if (len(p.EgressAllow) > 0 || p.NetworkMode == runtime.NetworkFull) && p.BlockNetwork {
		return store.Sandbox{}, faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Client,
			"egress settings need block_network=false")
	}
	if p.Image == "" && !m.cfg.RuntimeImages {
		p.Image = m.cfg.DefaultImage
	}
	if c, ok := m.rt.(runtime.ImageChecker); ok {
		if err := c.CheckImage(p.Image); err != nil {
			return store.Sandbox{}, err
		}
	}
	harnesses, err := m.harnesses(p.Harnesses)
	if err != nil {
		return store.Sandbox{}, err
	}
	if p.CPU == "" {
		p.CPU = m.cfg.DefaultCPU
	}
	if p.Memory == "" {
		p.Memory = m.cfg.DefaultMemory
	}
	if p.Timeout <= 0 {
		p.Timeout = 3600
	}
	cpu, err := ParseCPU(p.CPU)
	if err != nil {
		return store.Sandbox{}, faults.Wrap(err, faults.CodeValidation, faults.InvalidRequest, faults.Client, "invalid cpu: "+err.Error())
	}
	mem, err := ParseMemory(p.Memory)
	if err != nil {
		return store.Sandbox{}, faults.Wrap(err, faults.CodeValidation, faults.InvalidRequest, faults.Client, "invalid memory: "+err.Error())
	}
	asked := p.EphemeralStorage != ""
	if !asked {
		p.EphemeralStorage = m.cfg.DefaultEphemeralStorage
	}
	storage, err := m.ephemeralStorage(p.EphemeralStorage, asked)
	if err != nil {
		return store.Sandbox{}, err
	}
	if len(p.Faults) > 0 && (mem == 0 || mem > maxOOMFaultMemory) && strings.Contains(string(p.Faults), `"kind":"oom"`) {
		return store.Sandbox{}, faults.Newf(faults.CodeFaultPlanInvalid, faults.InvalidRequest, faults.Client,
			"an oom fault needs a memory limit of at most %d MiB (the fault fills it)", maxOOMFaultMemory>>20)
	}
	generated := p.ID == ""
	if generated {
		p.ID = uuid.NewString()[:8]
	} else if !ValidID(p.ID) {
		return store.Sandbox{}, faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client,
			"invalid sandbox_id %q: must be a DNS-1123 label (lowercase letters, digits and '-', at most 63 characters)", p.ID)
	}
	select {
	case <-m.stopping:
		return store.Sandbox{}, errShutdown
	default:
	}
	rec := store.Sandbox{
		ID: p.ID, Namespace: m.cfg.Namespace, Kind: p.Kind, Image: p.Image, BlockNetwork: p.BlockNetwork,
		CPU: p.CPU, Memory: p.Memory, EphemeralStorage: p.EphemeralStorage, CreatedAt: m.unix(), Status: api.StatusPending,
		CreationTimeout: p.Timeout, TTLSeconds: p.TTLSeconds, Labels: p.Labels, Env: p.Env,
		Snapshot: p.Snapshot, ForkOf: p.forkOf,
	}
	if p.pool != "" {
		rec.Pool, rec.PoolState = p.pool, store.PoolMember
	}
	ids := idRetry
	ids.Retryable = func(err error) bool { return generated && faults.Is(err, faults.CodeSandboxExists) }
	if res, err := retry.Do(ctx, ids, func(ctx context.Context, attempt int) error {
		if attempt > 1 { // the generated id was taken: draw another
			rec.ID = uuid.NewString()[:8]
		}
		return m.st.CreateSandbox(ctx, rec)
	}); err != nil {
		if last := res.LastErr(); last != nil {
			err = last // the store's error as it gave it
		}
		return store.Sandbox{}, err
	}
	spec := runtime.Spec{
		ID: rec.ID, Kind: p.Kind, Image: p.Image, CPU: cpu, MemoryBytes: mem, EphemeralStorageBytes: storage,
		BlockNetwork: p.BlockNetwork, Env: p.Env, Labels: p.runtimeLabels(),
		CPUQuantity: p.CPU, MemoryQuantity: p.Memory, EphemeralStorageQuantity: p.EphemeralStorage,
		TTLSeconds: p.TTLSeconds, KindOptions: p.KindOptions,
		EgressAllow: p.EgressAllow, Faults: p.Faults, NetworkMode: p.NetworkMode, Layers: p.layers,
		Harnesses: harnesses,
	}
	pctx, cancel := context.WithCancelCause(context.Background())
	cctx, stop := context.WithTimeoutCause(pctx, api.Seconds(p.Timeout),
		faults.Newf(faults.CodeWaitTimeout, faults.Timeout, faults.Sandbox, "sandbox did not start within %ds", p.Timeout))
	cancelAll := func(cause error) { cancel(cause); stop() }
	c := &creation{cancel: cancelAll, browserState: p.browserState, exec: p.StartExec}
	m.mu.Lock()
	m.creating[rec.ID] = c
	m.mu.Unlock()
	m.bg.Add(1)
	go m.start(cctx, c, spec)
	return rec, nil
}

// creation is a create in progress.
type creation struct {
	cancel context.CancelCauseFunc
	// exec runs, then browserState is restored, before the sandbox is ready.
	exec         []string
	browserState []byte
}

// start runs the runtime create and records its outcome.
func (m *Manager) start(ctx context.Context, c *creation, spec runtime.Spec) {
	defer m.bg.Done()
	defer c.cancel(nil)
	defer func() {
		m.mu.Lock()
		if m.creating[spec.ID] == c { // not a later create of the same id
			delete(m.creating, spec.ID)
		}
		m.mu.Unlock()
	}()
	log := m.log.With("sandbox_id", spec.ID)
	inst, err := m.createWithRetry(ctx, spec)
	if err == nil {
		if err = m.restore(ctx, inst.AgentAddr, c.exec, c.browserState); err != nil {
			if derr := m.rt.Delete(context.Background(), spec.ID); derr != nil {
				log.Error("remove sandbox", "err", derr)
			}
		}
	}
	if err == nil {
		m.attachEgress(spec, inst.AgentAddr)
		_, err = m.recordOutcome(spec.ID, func(r *store.Sandbox) error {
			r.Ready, r.Status, r.StatusMessage, r.AgentAddr = true, api.StatusReady, "", inst.AgentAddr
			return nil
		})
		if err != nil { // deleted while starting (or the store is gone): nothing may be left behind
			log.Info("sandbox deleted while starting; removing it", "err", err)
			m.detachEgress(spec.ID)
			if derr := m.rt.Delete(context.Background(), spec.ID); derr != nil {
				log.Error("remove sandbox", "err", derr)
			}
		}
	} else {
		if c := context.Cause(ctx); c != nil && !errors.Is(err, c) {
			err = fmt.Errorf("%w: %w", c, err)
		}
		f := faults.Of(err)
		log.Warn("sandbox failed to start", "err", err, "code", f.Code, "category", f.Category)
		_, _ = m.recordOutcome(spec.ID, func(r *store.Sandbox) error {
			r.Status, r.StatusMessage = api.StatusFailed, f.Message
			fi := toFaultInfo(f)
			r.Fault = &fi
			return nil
		})
	}
	_ = m.st.Publish(context.Background(), store.SandboxTopic(spec.ID))
}

// afterDelete waits for the runtime delete of an earlier sandbox with the
// same id, if one is still running.
func (m *Manager) afterDelete(ctx context.Context, id string) error {
	m.mu.Lock()
	done := m.deleting[id]
	m.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// idRetry draws a new id for a create whose generated id is taken, up to
// five times in all. A new id needs no wait: the millisecond only keeps
// the policy's spacing negligible.
var idRetry = retry.Policy{Attempts: 5, Initial: time.Millisecond, Max: time.Millisecond}

// createRetry retries a create the runtime refused for capacity (a full
// machine frees up as other sandboxes end) inside the create's deadline.
var createRetry = retry.Policy{Attempts: 5, Initial: 500 * time.Millisecond, Max: 5 * time.Second,
	Retryable: func(err error) bool { return faults.Of(err).Category == faults.Capacity }}

func (m *Manager) createWithRetry(ctx context.Context, spec runtime.Spec) (runtime.Instance, error) {
	if err := m.afterDelete(ctx, spec.ID); err != nil {
		return runtime.Instance{}, err
	}
	p := createRetry
	p.OnRetry = func(attempt int, err error) {
		m.log.Info("create refused for capacity; retrying", "sandbox_id", spec.ID, "attempt", attempt, "err", err)
		if m.cfg.OnRetry != nil {
			m.cfg.OnRetry("create")
		}
	}
	inst, _, err := retry.DoValue(ctx, p, func(ctx context.Context, _ int) (runtime.Instance, error) {
		return m.createWithSlot(ctx, spec)
	})
	return inst, err
}

func (m *Manager) createWithSlot(ctx context.Context, spec runtime.Spec) (runtime.Instance, error) {
	if spec.Labels[PoolLabel] != "" { // a pool's refill: within the pools' share
		release, err := m.poolSlot(ctx)
		if err != nil {
			return runtime.Instance{}, err
		}
		defer release()
	}
	select {
	case m.creates <- struct{}{}:
	case <-ctx.Done():
		return runtime.Instance{}, context.Cause(ctx)
	}
	defer func() { <-m.creates }()
	return m.rt.Create(ctx, spec)
}

func toFaultInfo(f *faults.Error) api.FaultInfo {
	return api.FaultInfo{Category: string(f.Category), Source: string(f.Source), Code: f.Code, Message: f.Message, Retryable: f.Retryable}
}

// Get returns the record with its live status: a ready sandbox whose
// runtime reports it dead is failed.
func (m *Manager) Get(ctx context.Context, id string) (store.Sandbox, error) {
	rec, err := m.st.GetSandbox(ctx, id)
	if err != nil {
		return rec, err
	}
	if rec.PoolState != "" { // a pool's, not yet anyone's
		return store.Sandbox{}, store.ErrSandboxNotFound(id)
	}
	return m.live(ctx, rec), nil
}

func (m *Manager) live(ctx context.Context, rec store.Sandbox) store.Sandbox {
	if rec.Status != api.StatusReady && rec.Status != api.StatusPaused {
		return rec
	}
	inst, err := m.rt.Inspect(ctx, rec.RuntimeName())
	switch {
	case err != nil && faults.Of(err).Category == faults.NotFound:
		rec.Status, rec.StatusMessage = api.StatusNotFound, "Pod not found"
	case err != nil:
		// The runtime could not tell: report the stored state.
	case !inst.Alive:
		rec.Status, rec.StatusMessage = api.StatusFailed, deathMessage(inst.Reason)
		f := deathFault(inst.Reason)
		rec.Fault = &f
	}
	return rec
}

// deathSettle is how long DeathFault waits for the runtime to notice a
// sandbox whose agent just stopped answering: the exit of its first
// process is seen within milliseconds.
const deathSettle = time.Second

// DeathFault explains a failed call to a sandbox's agent: the sandbox's
// death fault (sandbox.died, sandbox.oom) when the runtime reports it
// dead, nil while it lives.
func (m *Manager) DeathFault(ctx context.Context, id string) *faults.Error {
	deadline := time.Now().Add(deathSettle)
	id = m.runtimeName(ctx, id)
	for {
		inst, err := m.rt.Inspect(ctx, id)
		if err == nil && !inst.Alive {
			f := deathFault(inst.Reason)
			return faults.FromInfo(faults.Info{Category: faults.Category(f.Category), Source: faults.Source(f.Source),
				Code: f.Code, Message: f.Message, Retryable: f.Retryable}, 0)
		}
		if err != nil || time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(25 * time.Millisecond):
		}
	}
}

func deathMessage(reason string) string {
	if reason == "" {
		return "Pod exited"
	}
	return "Pod exited: " + reason
}

func deathFault(reason string) api.FaultInfo {
	if strings.HasPrefix(reason, "oom") {
		return toFaultInfo(faults.New(faults.CodeOOM, faults.ActionFailed, faults.Sandbox, "sandbox was killed: out of memory"))
	}
	if strings.HasPrefix(reason, "evicted") {
		return toFaultInfo(faults.New(faults.CodeSandboxEvicted, faults.Unavailable, faults.Sandbox, "sandbox was evicted: "+reason))
	}
	return toFaultInfo(faults.New(faults.CodeSandboxDied, faults.Unavailable, faults.Sandbox, deathMessage(reason)))
}

// List returns all records, live status included, filtered by labels.
func (m *Manager) List(ctx context.Context, labels map[string]string, kind, status string) ([]store.Sandbox, error) {
	recs, err := m.st.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	out := recs[:0]
next:
	for _, r := range recs {
		for k, v := range labels {
			if r.Labels[k] != v {
				continue next
			}
		}
		if kind != "" && r.Kind != kind || r.PoolState != "" {
			continue
		}
		r = m.live(ctx, r)
		if status != "" && r.Status != status {
			continue
		}
		out = append(out, r)
	}
	return out, nil
}

// errWaitTimeout is Wait's error when the sandbox did not become ready in
// time (the server answers it 408, as Orchard Env).
func errWaitTimeout(id string, timeout int) *faults.Error {
	return faults.Newf(faults.CodeWaitTimeout, faults.Timeout, faults.Sandbox,
		"Sandbox %s did not become ready within %ds", id, timeout)
}

// Wait blocks until the sandbox is ready, failed or gone, or timeout passes.
func (m *Manager) Wait(ctx context.Context, id string, timeout int) (store.Sandbox, error) {
	rec, err := m.st.GetSandbox(ctx, id)
	if err != nil {
		return rec, err
	}
	ev, cancel, err := m.st.Subscribe(ctx, store.SandboxTopic(id))
	if err != nil {
		return rec, err
	}
	defer cancel()
	deadline := time.NewTimer(api.Seconds(timeout))
	defer deadline.Stop()
	for {
		rec, err = m.st.GetSandbox(ctx, id)
		if err != nil {
			if faults.Is(err, faults.CodeSandboxNotFound) {
				rec.Status, rec.StatusMessage, rec.Ready = api.StatusNotFound, "Pod disappeared", false
				return rec, nil
			}
			return rec, err
		}
		rec = m.live(ctx, rec)
		if rec.Status != api.StatusPending && rec.Status != api.StatusUnschedulable {
			return rec, nil
		}
		select {
		case <-ev:
		case <-deadline.C:
			return rec, errWaitTimeout(id, timeout)
		case <-ctx.Done():
			return rec, context.Cause(ctx)
		case <-m.stopping:
			return rec, errShutdown
		}
	}
}

// Delete removes the record now and tears the sandbox down in the
// background. Unknown ids are fine (idempotent, as Orchard).
func (m *Manager) Delete(ctx context.Context, id string) error {
	// One read of the record: the runtime's name of the sandbox, and
	// whether it started from a snapshot or a fork (its layers may then be
	// unused once it is gone). Unknown ids delete fine.
	rid, stacked := id, false
	if rec, err := m.st.GetSandbox(ctx, id); err == nil {
		rid, stacked = rec.RuntimeName(), rec.Snapshot != "" || rec.ForkOf != ""
		if !m.reaches(rec) {
			return m.deleteElsewhere(ctx, rec)
		}
	}
	if err := m.st.DeleteSandbox(ctx, id); err != nil {
		return err
	}
	_ = m.st.Publish(ctx, store.SandboxTopic(id))
	m.mu.Lock()
	if c, ok := m.creating[id]; ok {
		c.cancel(faults.New(faults.CodeSandboxGone, faults.Canceled, faults.Client, "sandbox deleted while starting"))
	}
	for _, cancel := range m.jobs[id] {
		cancel(faults.New(faults.CodeSandboxGone, faults.Canceled, faults.Client, "sandbox was deleted"))
	}
	prev, done := m.deleting[rid], make(chan struct{})
	m.deleting[rid] = done
	m.mu.Unlock()
	m.detachEgress(rid)
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		defer close(done)
		if prev != nil { // deletes of one id end in order
			<-prev
		}
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := m.rt.Delete(dctx, rid); err != nil {
			m.log.Error("delete sandbox", "sandbox_id", id, "err", err)
		} else if stacked {
			m.pruneSoon()
		}
		m.mu.Lock()
		delete(m.locks, id)
		if m.deleting[rid] == done {
			delete(m.deleting, rid)
		}
		m.mu.Unlock()
	}()
	return nil
}

// runtimeName is the runtime's id of sandbox id (store.Sandbox.RuntimeName):
// id itself when it has no record.
func (m *Manager) runtimeName(ctx context.Context, id string) string {
	if rec, err := m.st.GetSandbox(ctx, id); err == nil {
		return rec.RuntimeName()
	}
	return id
}

func (m *Manager) attachEgress(spec runtime.Spec, addr string) {
	if m.cfg.Egress != nil && !spec.BlockNetwork && spec.NetworkMode != runtime.NetworkFull && addr != "" {
		m.cfg.Egress.Attach(spec.ID, addr, spec.EgressAllow)
	}
}

func (m *Manager) detachEgress(id string) {
	if m.cfg.Egress != nil {
		m.cfg.Egress.Detach(id)
	}
}

// Heartbeat records a heartbeat, opting the sandbox into heartbeat cleanup.
func (m *Manager) Heartbeat(ctx context.Context, id string) error {
	now := m.unix()
	_, err := m.st.UpdateSandbox(ctx, id, func(r *store.Sandbox) error {
		r.LastHeartbeat = &now
		return nil
	})
	return err
}

// agent returns the client for an agent address; dial is expected to pool.
func (m *Manager) agent(addr string) Agent { return m.dial(addr) }

// readyAgent returns the agent of a sandbox whose stored record is ready
// (the files gate of ORCHARD_COMPAT §3.14; the server answers its refusal
// 400 on the file routes).
func (m *Manager) readyAgent(ctx context.Context, id string) (Agent, error) {
	rec, err := m.st.GetSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := pausedFault(rec); err != nil {
		return nil, err
	}
	if !rec.Ready || rec.AgentAddr == "" {
		return nil, faults.Newf(faults.CodeSandboxNotReady, faults.Conflict, faults.Client, "Sandbox %s is not ready", id)
	}
	return m.agent(rec.AgentAddr), nil
}

// Upload writes a file into the sandbox.
func (m *Manager) Upload(ctx context.Context, id string, req api.UploadRequest) (api.UploadResult, error) {
	a, err := m.readyAgent(ctx, id)
	if err != nil {
		return api.UploadResult{}, err
	}
	res, err := a.Upload(ctx, req)
	return res, err
}

// UploadFrom writes a file into the sandbox from content, the file's
// bytes, passed on to the sandbox's agent as they are read: an upload of
// any size costs the server a few buffers. mode is asked for once content
// has ended. When reading content fails, nothing is written and that
// error is returned as it is.
func (m *Manager) UploadFrom(ctx context.Context, id, path string, content io.Reader, mode func() string) (api.UploadResult, error) {
	a, err := m.readyAgent(ctx, id)
	if err != nil {
		return api.UploadResult{}, err
	}
	res, err := a.UploadFrom(ctx, path, content, mode)
	return res, err
}

// CheckUpload returns the error an upload to sandbox id meets before it
// reaches the sandbox (no such sandbox, not ready), or nil.
func (m *Manager) CheckUpload(ctx context.Context, id string) error {
	_, err := m.readyAgent(ctx, id)
	return err
}

// Download reads a file from the sandbox.
func (m *Manager) Download(ctx context.Context, id, path string) (io.ReadCloser, error) {
	a, err := m.readyAgent(ctx, id)
	if err != nil {
		return nil, err
	}
	body, err := a.OpenDownload(ctx, path)
	return body, err
}

// ListFiles lists a directory of the sandbox.
func (m *Manager) ListFiles(ctx context.Context, id, path string) (api.FileList, error) {
	a, err := m.readyAgent(ctx, id)
	if err != nil {
		return api.FileList{}, err
	}
	res, err := a.List(ctx, path)
	return res, err
}

// Nodes returns the machines the runtime places sandboxes on, or ok=false
// when it does not say (the local runtime: this machine).
func (m *Manager) Nodes(ctx context.Context) (nodes []runtime.Node, ok bool, err error) {
	nl, ok := m.rt.(runtime.NodeLister)
	if !ok {
		return nil, false, nil
	}
	nodes, err = nl.Nodes(ctx)
	return nodes, true, err
}

// Agent returns the agent of a ready sandbox, for the calls the server
// makes to it directly (PTY, browser, desktop, episodes).
func (m *Manager) Agent(ctx context.Context, id string) (Agent, error) {
	rec, err := m.st.GetSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := pausedFault(rec); err != nil {
		return nil, err
	}
	if !rec.Ready || rec.AgentAddr == "" {
		return nil, faults.Newf(faults.CodeSandboxNotReady, faults.Conflict, faults.Client, "Sandbox %s is not ready", id)
	}
	return m.agent(rec.AgentAddr), nil
}

// ApplyPatch applies a unified diff with git apply in the working dir,
// serialised with the sandbox's jobs.
func (m *Manager) ApplyPatch(ctx context.Context, id, patch string, timeout int) (api.PatchResult, error) {
	rec, err := m.st.GetSandbox(ctx, id)
	if err != nil {
		return api.PatchResult{}, err
	}
	if err := pausedFault(rec); err != nil {
		return api.PatchResult{}, err
	}
	if rec.AgentAddr == "" {
		return api.PatchResult{}, faults.Newf(faults.CodeAgentNotReady, faults.NotFound, faults.Sandbox, "No pod IP available for sandbox %s", id)
	}
	if timeout <= 0 {
		timeout = 30
	}
	h, err := m.lock(ctx, id, nil)
	if err != nil {
		return api.PatchResult{}, err
	}
	defer h.unlock()
	res, err := m.agent(rec.AgentAddr).Patch(ctx, api.AgentPatchRequest{Patch: patch, TimeoutSeconds: timeout, Dir: m.cfg.WorkingDir})
	if err != nil {
		msg := faults.Of(err).Message
		return api.PatchResult{Success: false, Error: &msg}, nil
	}
	code := res.ExitCode
	return api.PatchResult{Success: code == 0, Stdout: res.Stdout, Stderr: res.Stderr, ExitCode: &code}, nil
}

// outageWindow bounds how long throughOutage retries: the writes it
// carries are ones nothing else will ever make (a create's outcome moves
// its record out of pending; a job's final state ends it while its runner
// lives), so giving up early leaves them undone for good.
const outageWindow = 30 * time.Second

// outageRetry spaces the writes of throughOutage: a store failing over
// comes back within a second or two; the Budget is outageWindow.
var outageRetry = retry.Policy{Budget: outageWindow, Initial: 50 * time.Millisecond, Max: 2 * time.Second}

// throughOutage runs write until it does not fail with a store outage,
// retrying with backoff for up to outageWindow or until the manager stops.
// The first write is made even when the manager is stopping: a create
// that ends during shutdown still records its outcome. A Backoff rather
// than retry.Do, whose canceled context would skip it.
func (m *Manager) throughOutage(write func() error) error {
	b := retry.NewBackoff(outageRetry)
	for {
		err := write()
		if err == nil || !faults.Is(err, faults.CodeStoreUnavailable) {
			return err
		}
		if b.Wait(m.stopCtx, err) != nil { // out of time, or stopping
			return err
		}
	}
}

// recordOutcome applies a create's outcome to the sandbox's record,
// through a store outage; not_found means the sandbox was deleted.
func (m *Manager) recordOutcome(id string, fn func(*store.Sandbox) error) (rec store.Sandbox, err error) {
	err = m.throughOutage(func() error {
		if err := failpoint.Eval("manager.create.outcome"); err != nil {
			return err
		}
		rec, err = m.st.UpdateSandbox(context.Background(), id, fn)
		return err
	})
	return rec, err
}
