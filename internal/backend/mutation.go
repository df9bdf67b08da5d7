package backend

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

// ErrNotImplemented is returned by a pack whose mutation path is not built yet. It is never
// papered over with a pretend success.
var ErrNotImplemented = errors.New("this backend pack's mutation path is not implemented yet")

// ErrUnreachable means the backend could not be reached at all: nothing can be said of what it
// holds.
var ErrUnreachable = errors.New("the backend is unreachable")

// ErrScriptHeld means the backend holds the script name for another worker UID (SPEC 3.4): a
// write never moves a script from one worker to another, whatever its generation.
var ErrScriptHeld = errors.New("the backend holds this script name for another worker")

// ErrMisconfigured means the backend refused the installation's configuration or credentials (a
// Cloudflare token without the permissions, or none): no retry helps until an operator fixes it.
// Its message names the installation, never a credential.
var ErrMisconfigured = errors.New("the backend installation is misconfigured")

// ErrPlacementDrift means the backend is not where the catalog says (a Cloudflare account whose
// workers.dev subdomain differs from the installation's accountSubdomain).
var ErrPlacementDrift = errors.New("the backend is not where the catalog places it")

// RefusedError is code the backend refused to run (Cloudflare's 10006, 10021, 10027: syntax, size,
// compatibility), with the backend's own message. A retry of the same code would only repeat it.
type RefusedError struct{ Message string }

func (e *RefusedError) Error() string { return "the backend refused the script: " + e.Message }

// Native kinds a backend holds.
const (
	NativeWorker = "worker"
	NativeRoute  = "endpoint"
)

// Bundle is a worker's code as the backend receives it.
type Bundle struct {
	Modules           map[string]string `json:"modules"`
	MainModule        string            `json:"mainModule"`
	CompatibilityDate string            `json:"compatibilityDate"`
	// Settings are its variables and compatibility flags (normalized: nil when none).
	Settings workerconf.Settings `json:"settings"`
	// ServiceScripts are its service bindings' callee script names by binding (what a Cloudflare
	// service binding names; the runtime node routes by the callee's UID in Settings instead).
	ServiceScripts map[string]string `json:"serviceScripts,omitempty"`
}

// Labels say whose a native object is; a backend uses them only to scope its own brakes.
type Labels struct {
	Organization string
	Space        string
	Worker       string
}

// Desired is one native object the backend must hold, or release: a worker script or an endpoint
// route, written by one deployment.
type Desired struct {
	Kind         string
	NativeName   string
	DeploymentID uuid.UUID
	// EffectID makes the backend call idempotent: a retried call with it does no new work.
	EffectID uuid.UUID
	// ResourceUID is the worker's or the endpoint's UID.
	ResourceUID uuid.UUID
	// Sequence orders the deployments of one resource: a later one always has a larger one, so a
	// late copy of an older call can never revert a newer deployment.
	Sequence int64
	Labels   Labels
	// Worker: the bundle and the names of its secret bindings.
	Bundle      *Bundle
	SecretNames []string
	// Endpoint: the script the route sends to, and its worker's limits.cpuMs where the route
	// carries it (wfp-managed).
	ScriptName string
	CPUMs      int64
}

// Observation is what the backend reports of one native object.
type Observation struct {
	Present      bool
	DeploymentID uuid.UUID
	// WorkerUID is the worker the object says it belongs to, where the backend stamps one into
	// it (a Cloudflare script's TAKOFORM_WORKER_UID); empty where it does not.
	WorkerUID string
	// Admitted: the object serves (or, for a worker with secret bindings, is ready to serve once
	// its values arrive) at DeploymentID.
	Admitted bool
	// Failed: the backend gave up on DeploymentID (its incarnation never became Ready).
	Failed bool
	// Ready: it serves now. Reason and Message say why not.
	Ready   bool
	Reason  string
	Message string
	// Incident: the backend's continuity raised an incident (repeated restarts).
	Incident        bool
	IncidentMessage string
	// Quarantined: the backend runs the worker apart from its organization's other workers,
	// for its repeated kills of their shared process (or waits to, answering 503).
	Quarantined       bool
	QuarantineMessage string
	// AnyDeployment: the backend cannot tell this object's deployments apart (a workers.dev
	// route is two flags on its script), so Present means it holds whichever the Host wrote last.
	AnyDeployment bool
	// Version identifies what this observation says, where the pack can wait for it to change
	// (ChangeObserver); empty where it cannot.
	Version string
	// Lingers, on an object that reads back absent: the backend's edge may still serve it for this
	// long after this read (route propagation, KV caches; SPEC 8), so its deletion is certain only
	// then. Zero: absence is certain at once.
	Lingers time.Duration
	// Members, on a pool of runtime nodes: what each member that may route answered to this
	// read, for the ledger's effect per member (SPEC 6.2). Empty where the backend is no pool.
	Members []MemberRead
}

// MemberRead is one pool member's answer to a read of an object.
type MemberRead struct {
	Name  string
	State string
	// Err says why the member did not answer; empty when it did.
	Err          string
	Present      bool
	DeploymentID uuid.UUID
	Admitted     bool
}

// Holds reports whether the member answered that it holds deployment.
func (m MemberRead) Holds(deployment uuid.UUID) bool {
	return m.Err == "" && m.Present && m.DeploymentID == deployment
}

// Holds reports whether the backend holds deployment, as far as it can tell.
func (o Observation) Holds(deployment uuid.UUID) bool {
	return o.Present && (o.AnyDeployment || o.DeploymentID == deployment)
}

// Mutator changes and observes native objects on one installation.
type Mutator interface {
	// Apply makes the native object hold d and waits, bounded, for the backend to admit or
	// refuse it; it returns what the backend then holds.
	Apply(ctx context.Context, d Desired) (Observation, error)
	// Delete removes the native object only while it still holds what d's deployment wrote
	// (compare-and-delete), so that a late delete never removes its successor; deleting an absent
	// object, or one a later deployment rewrote, succeeds without touching it.
	Delete(ctx context.Context, d Desired) error
	// Observe reads the native object back, changing nothing.
	Observe(ctx context.Context, kind, nativeName string) (Observation, error)
}

// ChangeObserver is a Mutator that can hold a read until the object changes: the Host awaits an
// admission with it instead of polling.
type ChangeObserver interface {
	// ObserveChange reads the native object back once it differs from since (an observation this
	// pack gave, with a Version), or when within has passed, whichever comes first.
	ObserveChange(ctx context.Context, kind, nativeName string, since Observation, within time.Duration) (Observation, error)
}

// Delivery names one runtime input's delivery to one worker (SPEC 3.5).
type Delivery struct {
	// ScriptName and WorkerUID name the worker that receives it.
	ScriptName string
	WorkerUID  uuid.UUID
	// PreparationID is the runtime input's id: what a value-free readback reads back as the
	// delivery (TAKOFORM_DELIVERY).
	PreparationID string
	// MaterialSetID names the sealed material (the runtime node's delivery id).
	MaterialSetID uuid.UUID
	// EffectID makes the delivery idempotent.
	EffectID uuid.UUID
	// SecretNames are the delivery's binding names, sorted.
	SecretNames []string
}

// SecretSink delivers runtime-input values to where a worker runs, and answers the readback
// over what the runtime was actually given (SPEC 3.5). It is the only value-bearing seam from the
// Host to a backend, and no value ever comes back through it.
type SecretSink interface {
	// DeliverSecrets gives the values to the worker d names, replacing any earlier delivery.
	DeliverSecrets(ctx context.Context, d Delivery, values map[string]vocab.Secret) error
	// ReadbackSecrets answers, for the script d names, HMAC-SHA256(challenge, canonical JSON of
	// the bindings as held), and false when nothing is held. The answer decides the lease of d:
	// when the script does not hold it, the backend refuses that delivery from then on, so that a
	// copy still on its way never lands after the lease failed. A ValueFreeSink answers its
	// value-free digest instead.
	ReadbackSecrets(ctx context.Context, d Delivery, challenge []byte) ([]byte, bool, error)
}

// ValueFreeSink is a SecretSink whose backend never shows a secret's value nor a keyed digest of
// one (Cloudflare). It settles on the value-free readback of SPEC 3.5 and 8: ReadbackSecrets
// ignores the challenge and answers DeliveryDigest of what one version of the script holds (its
// worker UID, delivery and secret names), and the lease expects ExpectedDigest, which the
// dispatch compare-and-swap records. Which readback applies is the pack's to say, by being one.
type ValueFreeSink interface {
	SecretSink
	// ExpectedDigest is what ReadbackSecrets answers once the script holds exactly d.
	ExpectedDigest(d Delivery) []byte
}

// PoolSink is a SecretSink whose backend is a pool of runtime nodes sharing a pool key (SPEC 6.2):
// at dispatch the Host seals the values to the pool's public key, keeps the blob (it can never
// open it again), and gives the nodes the blob, not the values; it names the blob again to a node
// that lost its state. A pool whose installation names no key answers false from PoolSeal, and
// its deliveries go through DeliverSecrets.
type PoolSink interface {
	SecretSink
	// PoolSeal seals plaintext (the material as the runtime input sealed it) for d.
	PoolSeal(d Delivery, plaintext []byte) ([]byte, bool, error)
	// DeliverSealed gives the blob PoolSeal made for d to the pool, replacing any earlier
	// delivery.
	DeliverSealed(ctx context.Context, d Delivery, blob []byte) error
	// RestoreSealed gives it again to a node whose script holds exactly the delivery replaces
	// ("": none; a node that lost its state, or came back from a backup holding a superseded
	// one), so that a restore never replaces a newer delivery: ErrNotRestored when the node held
	// something else, or no longer holds d's worker.
	RestoreSealed(ctx context.Context, d Delivery, blob []byte, replaces string) error
}

// ErrNotRestored is a restoring DeliverSealed the backend did not take.
var ErrNotRestored = errors.New("the backend holds another delivery of the worker, or not the worker: nothing restored")

// DeliveryCheck is a SecretSink that can tell, before anything is claimed, that its backend
// could not take a delivery (a pool node without the pool's key): the one-shot lease is then not
// spent on it.
type DeliveryCheck interface {
	CheckDelivery(ctx context.Context) error
}

// DeliveryBudget is a SecretSink whose backend limits its API calls: ReserveDelivery takes the
// budget a delivery needs before anything is claimed, and answers a RateLimitedError instead
// while the installation cannot call (SPEC 8 "Rate limits").
type DeliveryBudget interface {
	ReserveDelivery(ctx context.Context) error
}

// DeliveryDigest is the value-free readback digest (SPEC 3.5): SHA-256 of the canonical JSON
// {workerUid, delivery, secretNames}, the names sorted.
func DeliveryDigest(workerUID, delivery string, secretNames []string) []byte {
	names := slices.Clone(secretNames)
	slices.SortFunc(names, func(a, b string) int {
		if canonjson.LessUTF16(a, b) {
			return -1
		} else if a == b {
			return 0
		}
		return 1
	})
	if names == nil {
		names = []string{}
	}
	sum := sha256.Sum256(canonjson.Marshal(canonjson.Object{
		{Key: "workerUid", Value: workerUID},
		{Key: "delivery", Value: delivery},
		{Key: "secretNames", Value: names},
	}))
	return sum[:]
}

// Pack makes the mutator of one installation of a backend pack.
type Pack func(inst catalog.Installation, env PackEnv) Mutator

// PackEnv is what a Registry hands each pack it makes a mutator with.
type PackEnv struct {
	// Budget is the rate budget the Cloudflare packs take from (nil: none).
	Budget RateBudget
	// EdgeClient reaches Cloudflare's edge for the wfp-managed Ready probe (nil: a plain client).
	EdgeClient *http.Client
	// Log is where a pack says what an operator must know (nil: nowhere).
	Log *slog.Logger
	// Pools reads the members of a selfhost pool (nil: every pool is the catalog's one node).
	Pools PoolMembers
}

// ErrPoolEmpty means every member of a selfhost pool was retired or removed: no node may route
// any of its origins, so every absence is confirmed, and nothing can be deployed or listed.
var ErrPoolEmpty = errors.New("the pool has no runtime node")

// PoolMember is one runtime node of a selfhost pool (SPEC 6.2).
type PoolMember struct {
	Name  string
	URL   string
	State string
	// Epoch is the pool's epoch as the member's row holds it; Since is when its state last
	// changed (a draining member's drain began then).
	Epoch int64
	Since time.Time
	// Implicit: the catalog's node of a pool that has no membership rows (it is told nothing).
	Implicit bool
	// Settled: not a member that joined so recently that a Host replica may still read the pool
	// without it (a cached read). Nothing is written to an unsettled member, so that no replica
	// confirms an absence without asking a member that holds the object.
	Settled bool
	// Fence is the pool's fenceSeconds as recorded in the database (nil: not recorded yet, so the
	// catalog's): every replica tells members this one.
	Fence *time.Duration
}

// States of a pool member.
const (
	MemberJoining  = "joining"
	MemberServing  = "serving"
	MemberDraining = "draining"
	MemberRemoved  = "removed"
	MemberRetired  = "retired"
)

// MayRoute reports whether the member may still route an origin: every member but one removed
// (it confirmed it holds nothing) or retired (the operator attested it fenced).
func (m PoolMember) MayRoute() bool { return m.State != MemberRemoved && m.State != MemberRetired }

// PoolMembers reads the members of a selfhost installation's pool from where membership lives
// (PostgreSQL). An installation with no membership rows is the pool of its catalog node alone.
type PoolMembers interface {
	Members(ctx context.Context, inst catalog.Installation) ([]PoolMember, error)
}

// FreshPoolMembers is a PoolMembers that can also read the membership afresh, bypassing any
// cached read: what the node reconciler and the announcements read, off the request path.
type FreshPoolMembers interface {
	Fresh(ctx context.Context, inst catalog.Installation) ([]PoolMember, error)
}

// Registry hands out the mutator of each installation.
type Registry struct {
	// Packs makes the mutators of each pack, by its name (internal/backend/packs names every pack
	// built). An installation of a pack it lacks is not_implemented.
	Packs map[string]Pack
	// Wrap, when set, wraps every mutator handed out (tests hold or fail backend calls with it).
	Wrap func(Mutator) Mutator
	// Budget, when set, is the rate budget the Cloudflare packs take from (the Host's, in
	// PostgreSQL).
	Budget RateBudget
	// EdgeClient reaches Cloudflare's edge for the wfp-managed Ready probe (default: a plain
	// client); tests and demos resolve worker hostnames to a stand-in's edge with it.
	EdgeClient *http.Client
	// Log, when set, is where the backends say what an operator must know (a runtime node that
	// refuses the Host's token).
	Log *slog.Logger
	// Seen, when set, is told of every mutator call (the Host's metrics).
	Seen Seen
	// Pools, when set, reads the members of selfhost pools (the Host's, in PostgreSQL).
	Pools PoolMembers
	mu    sync.Mutex
	made  map[catalog.Installation]Mutator
}

// Supports reports whether m mutates native objects of kind. A pack whose mutation path is built
// for some kinds only says so (a Supports method), and the Host answers not_implemented for the
// others before it plans anything.
func Supports(m Mutator, kind string) bool {
	if s, ok := As[interface{ Supports(string) bool }](m); ok {
		return s.Supports(kind)
	}
	return true
}

// As finds the T that m is, or wraps: a mutator handed out by the Registry may be wrapped (the
// Host's call metrics, tests' fault injection), and each wrapper answers Unwrap.
func As[T any](m Mutator) (T, bool) {
	for {
		if t, ok := m.(T); ok {
			return t, true
		}
		u, ok := m.(interface{ Unwrap() Mutator })
		if !ok {
			var zero T
			return zero, false
		}
		m = u.Unwrap()
	}
}

// Mutator returns the mutator of inst.
func (r *Registry) Mutator(inst catalog.Installation) (Mutator, error) {
	pack, ok := r.Packs[inst.Pack]
	if !ok {
		return nil, fmt.Errorf("%w (pack %s)", ErrNotImplemented, inst.Pack)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	// Every setting of the installation is the key (so it stays a comparable struct): a changed
	// catalog gets a new mutator.
	if m, ok := r.made[inst]; ok {
		return m, nil
	}
	m := pack(inst, PackEnv{Budget: r.Budget, EdgeClient: r.EdgeClient, Log: r.Log, Pools: r.Pools})
	if r.Seen != nil {
		m = observe(m, inst.Name, r.Seen)
	}
	if r.Wrap != nil {
		m = r.Wrap(m)
	}
	if r.made == nil {
		r.made = map[catalog.Installation]Mutator{}
	}
	r.made[inst] = m
	return m, nil
}

// SecretSink returns the secret sink of inst.
func (r *Registry) SecretSink(inst catalog.Installation) (SecretSink, error) {
	m, err := r.Mutator(inst)
	if err != nil {
		return nil, err
	}
	sink, ok := SinkOf(m)
	if !ok {
		return nil, fmt.Errorf("%w (pack %s cannot receive runtime inputs)", ErrNotImplemented, inst.Pack)
	}
	return sink, nil
}

// SinkOf finds the SecretSink m is, or wraps.
func SinkOf(m Mutator) (SecretSink, bool) { return As[SecretSink](m) }
