package server_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare"
	"github.com/takoform/terraform-provider-takoform/internal/cloudflare/cfstandin"
	"github.com/takoform/terraform-provider-takoform/internal/host"
	"github.com/takoform/terraform-provider-takoform/internal/resource"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
)

// stopper stops its Host in the middle of one worker's apply: the upload goes out (and the
// Cloudflare stand-in holds it, FaultHold), and the request never takes another step, as if the
// Host's process had died with the upload in a socket buffer. It never renews anything itself;
// the request's lease runs out by the database's clock.
type stopper struct {
	backend.Mutator
	script *atomic.Value // the script name whose next apply stops the Host
	dead   chan struct{}
	// unanswered: instead of stopping, the Host's call ends without an answer (as a deadline
	// does) while the upload goes on.
	unanswered *atomic.Bool
}

func (s *stopper) Unwrap() backend.Mutator { return s.Mutator }

func (s *stopper) Apply(ctx context.Context, d backend.Desired) (backend.Observation, error) {
	if name, _ := s.script.Load().(string); d.Kind != backend.NativeWorker || name == "" || name != d.NativeName {
		return s.Mutator.Apply(ctx, d)
	}
	s.script.Store("")
	go func() { _, _ = s.Mutator.Apply(context.Background(), d) }() // the upload outlives its Host
	if s.unanswered.Load() {
		return backend.Observation{}, fmt.Errorf("%w: the call's deadline passed", backend.ErrUnreachable)
	}
	<-s.dead
	return backend.Observation{}, errors.New("the Host stopped")
}

// lateWrites is a Host (A) that stops mid-create on the Cloudflare packs, and the other Hosts'
// janitors (sweeper) on the same database.
type lateWrites struct {
	*cfScripts
	stopAt     *atomic.Value
	unanswered *atomic.Bool
}

func setupLateWrites(t *testing.T) *lateWrites {
	t.Helper()
	stopAt, unanswered := &atomic.Value{}, &atomic.Bool{}
	dead := make(chan struct{})
	c := setupCFScripts(t, cfScriptsOptions{wrap: func(m backend.Mutator) backend.Mutator {
		return &stopper{Mutator: m, script: stopAt, dead: dead, unanswered: unanswered}
	}})
	// Registered after the harness: runs first, while the stand-in and the database still answer.
	t.Cleanup(func() { close(dead) })
	return &lateWrites{cfScripts: c, stopAt: stopAt, unanswered: unanswered}
}

// sweeper is another Host replica on the database, for its janitor (Sweep).
func (l *lateWrites) sweeper() *host.Host {
	l.t.Helper()
	db, err := pgxpool.New(context.Background(), l.dbURL)
	require.NoError(l.t, err)
	l.t.Cleanup(db.Close)
	return host.New(host.Config{DB: db, Catalog: loadCatalog(l.t, l.catalog, l.runtime.Info), SealingRing: l.ring,
		Logger: slog.New(slog.NewJSONHandler(&runtimetest.Buffer{}, nil))})
}

const lateCode = `export default { fetch() { return new Response("late") } }`

// stopMidCreate sends a create of prod/api on offering (cf-worker or wfp-worker) to Host A, which
// stops once the upload is out; the stand-in holds the upload. Another Host's janitor then
// recovers the request after its lease runs out: it reads the script back absent, abandons the
// create and records the re-check. It returns the script name, the abandoned worker's UID and
// the re-check's deployment.
func (l *lateWrites) stopMidCreate(janitor *host.Host, offering string) (script string, uid, deployment uuid.UUID) {
	l.t.Helper()
	script = l.scriptNameOf("prod", "api")
	require.NoError(l.t, l.standin.Inject(cfstandin.Fault{Kind: cfstandin.FaultHold, Method: http.MethodPut, PathContains: "/scripts/" + script}))
	l.stopAt.Store(script)
	body := cfWorkerBody(lateCode)
	body["offeringId"] = offering
	go func() { _ = l.tryPutWorker("prod", "api", "token-late-api-0000000000", body) }()
	require.Eventually(l.t, func() bool { return l.standin.Held() == 1 }, 20*time.Second, 10*time.Millisecond, "the upload reached the stand-in")
	require.NoError(l.t, l.db.QueryRow(context.Background(), `SELECT uid FROM workers WHERE name = 'api' AND status = 'creating'`).Scan(&uid))

	// The Host is gone: its lease runs out by the database's clock, and another Host recovers.
	l.pass(90 * time.Second)
	pollUntil(l.t, 20*time.Second, func() bool {
		l.exec(`UPDATE ownership_intents SET lease_expires_at = db_now() - interval '1 second' WHERE external_key = 'prod/api'`)
		janitor.Sweep(context.Background())
		return l.status(`SELECT status FROM workers WHERE uid = $1`, uid) == "deleted"
	}, "recovery abandons the create")
	require.Equal(l.t, "abandoned", l.status(`SELECT o.code FROM operations o JOIN workers w ON w.operation_id = o.id WHERE w.uid = $1`, uid))
	_, present := l.standin.NamespaceScript(l.namespaceOf(offering), script)
	require.False(l.t, present, "recovery read the script back absent")
	require.NoError(l.t, l.db.QueryRow(context.Background(),
		`SELECT deployment_id FROM late_write_rechecks WHERE worker_uid = $1 AND status = 'pending'`, uid).Scan(&deployment))
	return script, uid, deployment
}

func (l *lateWrites) namespaceOf(offering string) string {
	if offering == "wfp-worker" {
		return cfNamespace
	}
	return ""
}

// land lets the held upload go on and waits until the script holds the abandoned worker's UID.
func (l *lateWrites) land(offering, script string, uid uuid.UUID) {
	l.t.Helper()
	l.standin.Release()
	require.Eventually(l.t, func() bool {
		sc, ok := l.standin.NamespaceScript(l.namespaceOf(offering), script)
		if !ok {
			return false
		}
		b, ok := sc.Current.Binding(cloudflare.BindingWorkerUID)
		return ok && b.Text == uid.String()
	}, 20*time.Second, 10*time.Millisecond, "the stopped Host's upload lands late")
}

// holder is the worker UID the script holds on the stand-in ("" when absent).
func (l *lateWrites) holder(offering, script string) string {
	sc, ok := l.standin.NamespaceScript(l.namespaceOf(offering), script)
	if !ok {
		return ""
	}
	b, _ := sc.Current.Binding(cloudflare.BindingWorkerUID)
	return b.Text
}

// TestALateUploadOfAStoppedHostsCreateIsTakenDownByTheRecheckOfAnotherHost: the Host that stopped
// mid-create sent its upload; recovery (another Host) read the script back absent and abandoned
// the create; the upload lands after that read: an orphan script that runs with no worker row.
// The re-check recovery recorded is durable: that Host stops too before it is due, and a third
// Host's janitor (two of them at once) reads the script again and takes it down exactly once.
func TestALateUploadOfAStoppedHostsCreateIsTakenDownByTheRecheckOfAnotherHost(t *testing.T) {
	t.Parallel()
	for _, offering := range []string{"cf-worker", "wfp-worker"} {
		t.Run(offering, func(t *testing.T) {
			l := setupLateWrites(t)
			script, uid, deployment := l.stopMidCreate(l.sweeper(), offering)
			l.land(offering, script, uid)

			// The orphan: it runs, and no worker stands for it.
			require.Equal(t, uid.String(), l.holder(offering, script))
			require.Zero(t, l.count(`SELECT count(*) FROM workers WHERE name = 'api' AND status <> 'deleted'`))
			if offering == "cf-worker" {
				require.Equal(t, "late", l.fetchWorkersDev(script), "the orphan serves")
			}

			// The recovering Host stops before the re-check is due: its janitor never runs again.
			// Before it is due, nobody touches the script.
			early := l.sweeper()
			early.Sweep(context.Background())
			require.Equal(t, "pending", l.status(`SELECT status FROM late_write_rechecks WHERE deployment_id = $1`, deployment))
			require.Equal(t, uid.String(), l.holder(offering, script))

			l.pass(resource.LateWriteDelay)
			a, b := l.sweeper(), l.sweeper()
			var wg sync.WaitGroup
			for _, s := range []*host.Host{a, b} {
				wg.Add(1)
				go func() { defer wg.Done(); s.Sweep(context.Background()) }()
			}
			wg.Wait()
			require.Empty(t, l.holder(offering, script), "the script that landed late is gone")
			require.Equal(t, "removed", l.status(`SELECT status FROM late_write_rechecks WHERE deployment_id = $1`, deployment))
			require.Equal(t, 1, l.count(`SELECT count(*) FROM operations WHERE kind = 'janitor' AND code = 'late_write_removed' AND external_key = $1`, deployment.String()),
				"two janitors, one removal in the ledger")
			require.Equal(t, "deleted", l.status(`SELECT status FROM deployments WHERE id = $1`, deployment))
			if offering == "cf-worker" {
				status, _ := fetchWorkersDev(t, l.standin, script)
				require.NotEqual(t, http.StatusOK, status)
			}
		})
	}
}

// createAgain puts prod/api again (a newer worker under the same name, same script name) on
// Host A and returns the reply.
func (l *lateWrites) createAgain(offering, code string) reply {
	l.t.Helper()
	body := cfWorkerBody(code)
	body["offeringId"] = offering
	return l.putWorker("prod", "api", "token-newer-api-000000000", body)
}

// newerServes checks the newer worker holds the script and, on workers-dev, serves its own code.
func (l *lateWrites) newerServes(offering, script string, w map[string]any) {
	l.t.Helper()
	require.Equal(l.t, w["uid"], l.holder(offering, script), "the newer worker holds its script")
	if offering == "cf-worker" {
		require.Equal(l.t, "newer", l.fetchWorkersDev(script))
	}
	require.Equal(l.t, true, l.get("/v1/spaces/prod/workers/api").json(l.t)["ready"])
}

const newerCode = `export default { fetch() { return new Response("newer") } }`

// TestANewerWorkerUnderTheSameNameIsNeverTouchedByTheOldOnesRecheck: a worker destroyed (here:
// its create abandoned) and created again under the same space/name has a new UID and the same
// script name (SPEC 3.4 v2 derives it from tenant, space and name). Whichever comes first, the
// old create's late upload or the newer worker's create, the newer worker's script is never taken
// down: while the old one's re-check is pending the name is not taken (retryable witness_open),
// and once it is taken, a re-check that reads another worker's UID leaves the script alone.
func TestANewerWorkerUnderTheSameNameIsNeverTouchedByTheOldOnesRecheck(t *testing.T) {
	t.Parallel()
	for _, order := range []string{"late upload first", "newer create first"} {
		t.Run(order, func(t *testing.T) {
			const offering = "cf-worker"
			l := setupLateWrites(t)
			janitor := l.sweeper()
			script, uid, deployment := l.stopMidCreate(janitor, offering)
			if order == "late upload first" {
				l.land(offering, script, uid)
			}
			p := l.createAgain(offering, newerCode).problem(t, http.StatusConflict, "witness_open")
			require.Equal(t, []any{"late_write_recheck"}, p["unmetFences"])
			if order == "newer create first" {
				require.Empty(t, l.holder(offering, script), "the refused create wrote nothing")
				l.land(offering, script, uid)
			}
			require.Equal(t, uid.String(), l.holder(offering, script), "the refused create left the late script as it was")

			l.pass(resource.LateWriteDelay)
			janitor.Sweep(context.Background())
			require.Equal(t, "removed", l.status(`SELECT status FROM late_write_rechecks WHERE deployment_id = $1`, deployment))
			r := l.createAgain(offering, newerCode)
			require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
			newer := r.json(t)
			require.NotEqual(t, uid.String(), newer["uid"])
			require.Equal(t, script, newer["scriptName"], "the same script name")
			l.newerServes(offering, script, newer)

			// The re-check reads whose script it is: one of the old worker, due now, finds the newer
			// worker's and leaves it; one of the newer (standing) worker keeps its own.
			l.exec(`INSERT INTO late_write_rechecks (deployment_id, organization_id, installation, script_name, worker_uid, due_at)
				VALUES ($1, $2, 'cf', $3, $4, db_now()), ($5, $2, 'cf', $3, $6, db_now())`,
				uuid.New(), l.org.ID, script, uid, uuid.New(), newer["uid"])
			l.pass(time.Second)
			janitor.Sweep(context.Background())
			require.Equal(t, "others", l.status(`SELECT status FROM late_write_rechecks WHERE worker_uid = $1 AND deployment_id <> $2`, uid, deployment))
			require.Equal(t, "kept", l.status(`SELECT status FROM late_write_rechecks WHERE worker_uid = $1`, newer["uid"]))
			l.newerServes(offering, script, newer)
		})
	}
}

// TestARefusedCreateWhoseUploadGotNoAnswerIsRecheckedToo: a live Host's create whose upload call
// ends without an answer (its deadline) reads the script back absent and is refused; the upload
// Cloudflare still works on lands after that read. The refusal recorded the re-check, and the
// janitor takes the script down once it is due.
func TestARefusedCreateWhoseUploadGotNoAnswerIsRecheckedToo(t *testing.T) {
	t.Parallel()
	l := setupLateWrites(t)
	script := l.scriptNameOf("prod", "api")
	require.NoError(t, l.standin.Inject(cfstandin.Fault{Kind: cfstandin.FaultHold, Method: http.MethodPut, PathContains: "/scripts/" + script}))
	l.stopAt.Store(script)
	l.unanswered.Store(true)
	l.createAgain("cf-worker", lateCode).problem(t, http.StatusServiceUnavailable, "backend_unreachable")
	var uid, deployment uuid.UUID
	require.NoError(t, l.db.QueryRow(context.Background(), `SELECT worker_uid, deployment_id FROM late_write_rechecks WHERE status = 'pending'`).Scan(&uid, &deployment))
	require.Equal(t, "deleted", l.status(`SELECT status FROM workers WHERE uid = $1`, uid), "the refused create was abandoned")
	l.land("cf-worker", script, uid)

	janitor := l.sweeper()
	janitor.Sweep(context.Background())
	require.Equal(t, uid.String(), l.holder("cf-worker", script), "not before it is due")
	l.pass(resource.LateWriteDelay)
	janitor.Sweep(context.Background())
	require.Empty(t, l.holder("cf-worker", script))
	require.Equal(t, "removed", l.status(`SELECT status FROM late_write_rechecks WHERE deployment_id = $1`, deployment))
}
