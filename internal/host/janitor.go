package host

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// step is one of the janitor's steps: run does it once and says how many rows it settled, done
// is what the log says when it settled some (nothing when empty), fails what it says on an error.
type step struct {
	name  string
	run   func(context.Context) (int64, error)
	done  string
	fails string
}

// steps are the janitor's steps, in the order it runs them. Every one is a database statement or
// a compare-and-swap, so any number of replicas may run them at once.
func (h *Host) steps() []step {
	return []step{{
		// The operations of leases a stopped Host left to expire (a later request on the same
		// object would recover them too).
		name: "recover", run: func(ctx context.Context) (int64, error) { return count(h.Owners.RecoverExpired(ctx)) },
		done: "recovered operations left by a stopped Host", fails: "recover operations of expired leases",
	}, {
		// What creates that never committed left open on a backend.
		name: "orphans", run: func(ctx context.Context) (int64, error) { return count(h.Resources.CollectOrphans(ctx, h.DB)) },
		done: "took down deployments of creates that never committed", fails: "collect orphaned deployments",
	}, {
		// Scripts a backend without fences was read back not to hold, read again once a late
		// upload could have landed; those that landed late are taken down (logged one by one).
		name: "late-writes", run: h.recheckLateWrites,
		fails: "re-check scripts a late upload may have landed on",
	}, {
		// Host-minted reservations of deleted workers, under the four fences.
		name: "release-minted", run: func(ctx context.Context) (int64, error) { return count(h.Reservations.ReleaseGone(ctx, h.DB)) },
		done: "released Host-minted reservations of deleted workers", fails: "release Host-minted reservations of deleted workers",
	}, {
		// What stands on revoked custom domains, undone in the destroy order on the owners' behalf.
		name: "revoked-domains", run: h.letGoOfRevoked,
		done: "let go of endpoints and reservations on revoked custom domains", fails: "let go of what stands on revoked custom domains",
	}, {
		// Reservations whose TTL passed, stored expired.
		name: "expire-reservations", run: func(ctx context.Context) (int64, error) { return h.Reservations.ExpireLapsed(ctx, h.DB) },
		done: "expired reservations whose TTL passed", fails: "expire lapsed reservations",
	}, {
		// Deletion attestations whose route propagation ended.
		name: "attestations", run: func(ctx context.Context) (int64, error) { return h.Resources.SettleAttestations(ctx, h.DB) },
		fails: "close deletion attestations whose route propagation ended",
	}, {
		// Runtime inputs past their window, their sealed material dropped.
		name: "expire-runtime-inputs", run: func(ctx context.Context) (int64, error) { return h.RuntimeInputs.SweepExpired(ctx, h.DB) },
		done: "expired runtime inputs and dropped their sealed material", fails: "expire runtime inputs",
	}, {
		// Pool blobs of deleted or replaced workers (SPEC 6.2).
		name: "pool-blobs", run: func(ctx context.Context) (int64, error) { return h.RuntimeInputs.SweepPoolBlobs(ctx, h.DB) },
		done: "dropped the pool blobs of deleted workers", fails: "drop the pool blobs of deleted workers",
	}, {
		// Expired tombstones, which every lookup already ignores.
		name: "tombstones", run: h.Owners.PurgeTombstones,
		done: "purged expired tombstones", fails: "purge tombstones",
	}, {
		// Cron ticks a stopped replica claimed and never recorded.
		name: "abandoned-ticks", run: func(ctx context.Context) (int64, error) { return h.Resources.SettleAbandonedTicks(ctx, h.DB) },
		done: "failed cron ticks whose Host stopped before it recorded them", fails: "settle abandoned cron ticks",
	}, {
		// Whether each runtime node answers the Host (takoserver_backend_reachable).
		name: "reach", run: h.reach,
		fails: "a runtime node does not answer the Host",
	}, {
		// Each runtime node put back to what the ledger says (a node that lost its state or came
		// back from a backup, a database restored to an earlier point); logged one by one.
		name: "reconcile-nodes", run: h.reconcileNodes,
		fails: "could not put a runtime node back to what the ledger says",
	}}
}

// probeScript is a script name no worker has: reading it asks a node for nothing that exists.
const probeScript = "takoform-probe-00000000000000000000000000000000"

// reach asks the node of each selfhost installation for a script no worker has. A node that
// answers, whatever it says, is reachable; one that cannot be asked is not, and the step fails
// naming it. (Cloudflare's installations are not asked: each call spends their API budget, and
// their calls are counted as they happen.) It counts the nodes asked.
func (h *Host) reach(ctx context.Context) (int64, error) {
	var asked int64
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(h.Catalog.Installations)) {
		inst := h.Catalog.Installations[name]
		if inst.Pack != catalog.PackSelfhost {
			continue
		}
		mut, err := h.backends.Mutator(inst)
		if err != nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = mut.Observe(cctx, backend.NativeWorker, probeScript)
		cancel()
		if ctx.Err() != nil {
			return asked, ctx.Err()
		}
		asked++
		up := !errors.Is(err, backend.ErrUnreachable)
		h.metrics.reachable.WithLabelValues(name).Set(map[bool]float64{true: 1, false: 0}[up])
		if !up {
			errs = append(errs, fmt.Errorf("installation %s: %w", name, err))
		}
	}
	return asked, errors.Join(errs...)
}

// count is a step's count as int64.
func count[N int | int64](n N, err error) (int64, error) { return int64(n), err }

// Janitor does the Host's periodic housekeeping every interval until ctx ends.
func (h *Host) Janitor(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		h.Sweep(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sweep runs the janitor's steps once. A step that fails is logged and the next one runs. A
// replica whose database a newer release has migrated runs none: its steps are the older rules.
func (h *Host) Sweep(ctx context.Context) {
	var newer *store.SchemaNewer
	if err := store.CheckSchema(ctx, h.DB); errors.As(err, &newer) {
		h.Log.Warn("janitor paused: the database's schema is newer than this takoserver", "database_schema_version", newer.Database, "binary_schema_version", newer.Binary)
		return
	}
	for _, s := range h.steps() {
		n, err := s.run(ctx)
		if h.metrics != nil && n > 0 {
			h.metrics.settled.WithLabelValues(s.name).Add(float64(n))
		}
		switch {
		case err != nil && ctx.Err() == nil:
			h.Log.Warn(s.fails, "step", s.name, "error", err.Error())
			if h.metrics != nil {
				h.metrics.stepFailures.WithLabelValues(s.name).Inc()
			}
		case err == nil && n > 0 && s.done != "":
			h.Log.Info(s.done, "step", s.name, "count", n)
		}
	}
}

// reconcileNodes is the node reconciler's step: each change is logged and counted, and a fenced
// object (one the ledger has no record of) is a warning, since only a database restored to an
// earlier point (or a node shared with another Host) leaves one.
func (h *Host) reconcileNodes(ctx context.Context) (int64, error) {
	done, err := h.Resources.ReconcileNodes(ctx, h.DB)
	for _, r := range done {
		attrs := []any{"installation", r.Installation, "kind", r.Kind, "name", r.NativeName, "deployment", r.DeploymentID,
			"resource_uid", r.ResourceUID, "organization", r.Organization, "action", string(r.Action), "detail", r.Detail}
		switch r.Action {
		case dbsqlc.NodeReconciliationActionFenced:
			h.Log.Warn("took down an object the ledger has no record of from a runtime node", attrs...)
		case dbsqlc.NodeReconciliationActionRemoved:
			h.Log.Warn("took down an object the ledger deleted from a runtime node", attrs...)
		default:
			h.Log.Info("wrote an object the runtime node lacked again", attrs...)
		}
		if h.metrics != nil {
			kind := "worker"
			if r.Kind == backend.NativeRoute {
				kind = "endpoint"
			}
			h.metrics.reconciled.WithLabelValues(r.Installation, kind, string(r.Action)).Inc()
		}
	}
	return int64(len(done)), err
}

// recheckLateWrites is the late-write step, which logs each script it re-checked.
func (h *Host) recheckLateWrites(ctx context.Context) (int64, error) {
	late, err := h.Resources.RecheckLateWrites(ctx, h.DB)
	for _, lw := range late {
		attrs := []any{"installation", lw.Installation, "script", lw.ScriptName, "worker_uid", lw.WorkerUID.String(), "deployment", lw.Deployment.String(), "status", lw.Status}
		if lw.Status == "removed" {
			h.Log.Warn("took down a script that landed after its apply was decided lost (late upload)", append(attrs, "held_deployment", lw.Held.String())...)
		} else {
			h.Log.Info("re-checked a script a late upload may have landed on", attrs...)
		}
	}
	return int64(len(late)), err
}
