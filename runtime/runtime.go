// Package runtime defines where sandboxes live: the contract every backend
// (local containers, Kubernetes pods) implements, and the sandbox spec it
// receives. runtimetest holds the conformance suite.
package runtime

import (
	"context"
	"time"
)

// Spec describes the sandbox a backend must create.
type Spec struct {
	ID           string
	Kind         string  // api.KindShell, ...
	Image        string  // "host", an OCI reference, "oci-layout:PATH[@ref]", "docker-archive:PATH"
	CPU          float64 // cores; 0 = unlimited
	MemoryBytes  int64   // 0 = unlimited
	PidsLimit    int64   // 0 = backend default
	BlockNetwork bool
	Env          map[string]string // added to the agent's environment (and so every exec's)
	Labels       map[string]string

	// EphemeralStorageBytes caps what the sandbox can write to its root
	// filesystem (its writable layer): a write beyond it fails with ENOSPC.
	// 0 = the backend's default.
	EphemeralStorageBytes int64 `json:",omitempty"`

	// The quantities as the user wrote them and the idle lifetime: kept by
	// the runtime with the sandbox so a restarted server can rebuild its record.
	// KindOptions are the kind's settings as JSON (the `browser` object of
	// a create request), handed to the agent as they are.
	KindOptions    []byte `json:",omitempty"`
	CPUQuantity    string `json:",omitempty"`
	MemoryQuantity string `json:",omitempty"`
	TTLSeconds     int    `json:",omitempty"`
	// EphemeralStorageQuantity is EphemeralStorageBytes as the user wrote it.
	EphemeralStorageQuantity string `json:",omitempty"`
	// EgressAllow is the host allow-list of a network-enabled sandbox
	// (empty: every public host). The server enforces it when it dials.
	EgressAllow []string `json:",omitempty"`
	// NetworkMode of a network-enabled sandbox: NetworkProxy (the default:
	// egress through the agent's HTTP proxy) or NetworkFull (a routed
	// interface, NAT and a firewall, for tools that ignore proxies).
	NetworkMode string `json:",omitempty"`
	// Faults is a fault plan (JSON) for the agent to inject.
	Faults []byte `json:",omitempty"`
	// Layers are saved layers (Snapshotter.SaveLayer) the sandbox's root
	// starts from, top first, stacked over its image: the filesystem a
	// snapshot kept. Empty: the image alone.
	Layers []string `json:",omitempty"`
	// Harnesses are the coding-agent harnesses (harness.Names) the
	// sandbox has on PATH, from the backend's read-only harness store
	// mounted at harness.MountPath; names the backend reported installed
	// (HarnessLister).
	Harnesses []string `json:",omitempty"`
}

// Network modes of Spec.NetworkMode.
const (
	NetworkProxy = "proxy"
	NetworkFull  = "full"
)

// Instance is a live (or dead) sandbox as the backend sees it.
type Instance struct {
	ID string
	// AgentAddr is how the server reaches the agent: "unix:/path/agent.sock"
	// for local sandboxes, "http://ip:port" for pods.
	AgentAddr string
	Image     string
	CreatedAt time.Time
	Alive     bool
	// Reason says why a dead sandbox ended ("oom", "exited: 137", ...).
	Reason string
	// Spec is the spec the sandbox was created with, when the runtime kept
	// it (empty ID otherwise).
	Spec Spec
}

// Runtime creates and removes sandboxes. Create returns once the agent
// answers /health; Delete is idempotent and removes everything the sandbox
// used (processes, mounts, cgroups, state).
type Runtime interface {
	Create(ctx context.Context, spec Spec) (Instance, error)
	Delete(ctx context.Context, id string) error
	// Inspect reports the sandbox's liveness; a faults not_found error if
	// the backend has no such sandbox.
	Inspect(ctx context.Context, id string) (Instance, error)
	// List returns every sandbox the backend holds, including ones created
	// by an earlier server process (for reconciliation).
	List(ctx context.Context) ([]Instance, error)
}

// OOMCounter is an optional ability: the number of OOM kills inside a
// sandbox so far, used to classify an exec that died as sandbox.oom.
type OOMCounter interface {
	OOMKills(id string) (uint64, error)
}

// ImageChecker is an optional ability: refuse an image reference before
// a sandbox record exists (a local image path the server may not read),
// so that the create request fails with the reason instead of returning
// a sandbox that fails to start.
type ImageChecker interface {
	CheckImage(ref string) error
}

// Pauser is an optional ability: stop every process of a sandbox in place,
// its memory kept, and let them go on later. Both are idempotent: pausing
// a paused sandbox and resuming a running one do nothing.
type Pauser interface {
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
}

// Snapshotter is an optional ability: keep a sandbox's filesystem changes
// (its writable layer) as a read-only layer that later sandboxes start
// from (Spec.Layers), shared by all of them rather than copied to each.
// A layer lives until it is released and nothing uses it: no sandbox
// starts from it and no other layer lies on it.
type Snapshotter interface {
	// SaveLayer copies the writable layer of sandbox id into a new layer
	// called name, its processes frozen meanwhile so the copy is of one
	// moment.
	SaveLayer(ctx context.Context, id, name string, opts LayerOptions) (Layer, error)
	// Layers lists every layer, released ones included.
	Layers(ctx context.Context) ([]Layer, error)
	// ReleaseLayer marks the layer as no longer wanted: PruneLayers removes
	// it once nothing uses it. Releasing a released or missing layer does
	// nothing.
	ReleaseLayer(ctx context.Context, name string) error
	// PruneLayers removes the released layers nothing uses, and returns
	// their names.
	PruneLayers(ctx context.Context) ([]string, error)
}

// LayerOptions are SaveLayer's.
type LayerOptions struct {
	// Meta is kept with the layer as it is (JSON).
	Meta []byte
	// MaxBytes (> 0) caps the writable layer: a larger one fails with
	// snapshot.too_large and leaves nothing.
	MaxBytes int64
	// Exclude lists paths in the sandbox (globs, as filepath.Match takes
	// them) left out of the layer: state of processes that a sandbox
	// started from it does not carry (daemons' sockets and lock files).
	Exclude []string
}

// Layer is a saved layer.
type Layer struct {
	Name      string
	CreatedAt time.Time
	// Bytes is the space its files take.
	Bytes int64
	// Source is the sandbox it was saved from.
	Source string
	// Parents are the layers below it, top first: those its source
	// sandbox started from. A sandbox starts from [Name] + Parents.
	Parents  []string
	Meta     []byte
	Released bool
}

// MinEphemeralStorageBytes is the smallest writable layer every backend
// accepts: a filesystem and the few files a sandbox's start writes fit.
const MinEphemeralStorageBytes = 16 << 20

// StorageCapacity is an optional ability: the largest writable layer
// (Spec.EphemeralStorageBytes) the backend can give a sandbox now.
type StorageCapacity interface {
	MaxEphemeralStorage() (int64, error)
}

// Node is a machine sandboxes run on, as GET /resources reports it.
type Node struct {
	Name                              string
	CapacityCPU, AllocatableCPU       float64 // cores
	CapacityMemory, AllocatableMemory int64   // bytes
}

// NodeLister is an optional ability: the machines the backend places
// sandboxes on (a cluster's sandbox nodes). Without it, the server reports
// the machine it runs on.
type NodeLister interface {
	Nodes(ctx context.Context) ([]Node, error)
}

// HarnessLister is an optional ability: the harnesses a sandbox can have
// (Spec.Harnesses). A backend without it offers none.
type HarnessLister interface {
	Harnesses() ([]string, error)
}

// Closer is an optional ability: release backend resources at shutdown
// without deleting sandboxes (they are re-attached on the next start).
type Closer interface {
	Close() error
}
