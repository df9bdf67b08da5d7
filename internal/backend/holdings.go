package backend

import (
	"context"

	"github.com/google/uuid"
)

// Held is one native object a backend holds, as it says: the deployment that wrote it, whose it
// says it is, and its generation.
type Held struct {
	Kind       string
	NativeName string
	// DeploymentID is uuid.Nil when the backend's record does not parse as one.
	DeploymentID uuid.UUID
	// ResourceUID is the worker's (a script) or the endpoint's (a route) UID, as the backend
	// recorded it.
	ResourceUID string
	// ScriptName is the script a route sends to.
	ScriptName string
	// Organization is the organization's label the script was written with.
	Organization string
	Generation   int64
	// DeliveryID is the secret delivery a script holds ("" for none, and for a route).
	DeliveryID string
}

// Holdings is everything one backend holds, read at once.
type Holdings struct {
	Objects []Held
	// GenerationFloor: a worker write at or below it may be refused as stale on some name.
	GenerationFloor int64
	// Node names the pool member listed (a selfhost pool's, SPEC 6.2), and Boot the start of it
	// that answered.
	Node string
	Boot string
}

// Inventory is a Mutator whose backend the Host's reconciler puts back to what the ledger says:
// it lists what it holds, and writes one object again (a runtime node; Cloudflare's accounts are
// not listed, each call spends their budget, and they do not lose state).
type Inventory interface {
	// Holdings lists every native object the backend holds.
	Holdings(ctx context.Context) (Holdings, error)
	// Rewrite writes d as Apply does, without waiting for the backend to admit it.
	Rewrite(ctx context.Context, d Desired) error
}

// PoolInventory is an Inventory over several nodes (a selfhost pool, SPEC 6.2): the reconciler
// brings each member up to date on its own, through the mutator of that node alone (an
// Inventory, and a PoolSink where the pack has one).
type PoolInventory interface {
	Members(ctx context.Context) ([]Mutator, error)
}

// PoolAnnouncer tells the members of a pool their place in it (SPEC 6.2). A member that a sweep
// found wholly up to date (caughtUp: its name, and the start of it the sweep read) is confirmed
// for that start, which a member of a pool of two or more waits for after a restart before it
// serves; a retired or removed member that answers is told so, and serves nothing from then on.
type PoolAnnouncer interface {
	Announce(ctx context.Context, caughtUp map[string]string) error
}
