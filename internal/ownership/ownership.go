// Package ownership implements the takoform-ownership-v1 protocol (SPEC 3.2) once, for every
// mutating route. A route describes its request as an Intent and hands over the effect; this
// package answers replays from storage without taking anything, refuses conflicting tokens,
// serializes requests per object across every Host replica with database state only (a key lock
// that lives as long as one transaction, and a lease row for requests that span several), records
// the operation ledger, binds committed outcomes, and keeps tombstones.
package ownership

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// Protocol is the capability name the Host advertises.
const Protocol = "takoform-ownership-v1"

// TokenHeader carries the ownership token on every PUT and DELETE.
const TokenHeader = "Takoform-Ownership-Token"

// ReplayedHeader marks a response returned from storage.
const ReplayedHeader = "Takoform-Replayed"

var tokenShape = regexp.MustCompile(`^[A-Za-z0-9._~-]{16,128}$`)

// ValidToken reports whether token has the protocol's shape.
func ValidToken(token string) bool { return tokenShape.MatchString(token) }

// Intent is one owned mutation: who asks, for which object, with what request.
type Intent struct {
	OrganizationID string
	// Kind is the resource kind, such as "worker-endpoint-origin-reservation".
	Kind string
	// Key is the object's natural key within the organization.
	Key string
	// Token is the caller's ownership token.
	Token string
	// Method, Path, IfMatch and Body make the canonical request hash.
	Method string
	Path   string
	Body   []byte
	// IfMatch is the revision the caller last read (If-Match), when it sent one.
	IfMatch *int64
	// Brake, when set, names the worker the mutation changes: the lock step refuses it while a
	// deployment brake covers that worker (SPEC 3.6). Unset, the effect checks itself.
	Brake *BrakeScope
	// ResourceType and ImportID name the provider resource and import id in conflict details.
	ResourceType string
	ImportID     string
}

// BrakeScope names a worker of the intent's organization.
type BrakeScope struct {
	Space  string
	Worker string
}

// Response is what an effect produced: stored for replay when it is a committed success.
type Response struct {
	Status   int
	Body     []byte
	UID      uuid.UUID
	Replayed bool
	// Operation is the ledger entry of the request that produced this answer (none for a replay).
	Operation uuid.UUID
}

// Binding is the current owner of an object and the request that produced its state.
type Binding struct {
	Token       string
	RequestHash []byte
	UID         uuid.UUID
}

// Manager runs owned mutations against one database. Any number of Managers, in any number of
// processes, may share the database: everything that serializes them is in it.
type Manager struct {
	DB *pgxpool.Pool
	// Holder names this process in lease rows, for operators reading them.
	Holder string
	// TombstoneRetention is how long tombstones are kept (30 days by default).
	TombstoneRetention time.Duration
	// LeaseTTL is how long a multi-transaction request's lease lasts without renewal (60 s by
	// default); the holder renews it every third of that while it works.
	LeaseTTL time.Duration
	// BusyWait bounds how long a request waits for another in-flight request on the same object
	// before answering intent_in_progress (2 s by default).
	BusyWait time.Duration
	// Deadline bounds one mutation once it has begun (3 minutes by default). The caller going
	// away does not cancel it: an outcome is always recorded.
	Deadline time.Duration
	// Recover settles an operation whose Host stopped mid-request: it reads the backend back and
	// records what is there, ending with the operation refused. It is called, holding the key's
	// lease in the abandoned operation's name, before any new request on the key proceeds, and by
	// RecoverExpired.
	Recover func(ctx context.Context, r *Recovery) error
}

func (mgr *Manager) leaseTTL() time.Duration {
	if mgr.LeaseTTL > 0 {
		return mgr.LeaseTTL
	}
	return 60 * time.Second
}

func (mgr *Manager) busyWait() time.Duration {
	if mgr.BusyWait > 0 {
		return mgr.BusyWait
	}
	return 2 * time.Second
}

// lockWait bounds each wait on a key lock inside one transaction: other holders keep it for one
// transaction, milliseconds.
const lockWait = "2s"

// RetryAfterSeconds is what a retryable refusal tells the caller to wait.
const RetryAfterSeconds = 1

// Effect performs a mutation. It must do nothing visible before its first m.Tx or m.Commit, the
// phase that takes the key's lease; a refusal is an error. Nor may it wait on the database or a
// backend before that phase: the request's first read left its transaction open for it, holding
// the key's lock and a pool connection, so an effect that first asked the pool for another
// connection could wait on connections that all wait on it.
type Effect func(ctx context.Context, m *Mutation) (Response, error)

// RequestHash is SHA-256 over the method, the path, the If-Match revision and the canonical JSON
// of the body.
func RequestHash(method, path string, ifMatch *int64, body []byte) ([]byte, error) {
	canon, err := CanonicalBody(body)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{0})
	h.Write([]byte(path))
	h.Write([]byte{0})
	if ifMatch != nil {
		h.Write([]byte("if-match:" + strconv.FormatInt(*ifMatch, 10)))
	}
	h.Write([]byte{0})
	h.Write(canon)
	return h.Sum(nil), nil
}

// CanonicalBody re-encodes a JSON body with sorted keys and no insignificant whitespace, so that
// formatting does not change a request's identity. An empty body stays empty.
func CanonicalBody(body []byte) ([]byte, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return canonjson.Marshal(normalize(v)), nil
}

func normalize(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = normalize(e)
		}
		return v
	case []any:
		for i, e := range v {
			v[i] = normalize(e)
		}
		return v
	case json.Number:
		return canonjson.Number(v.String())
	default:
		return v
	}
}

// record is what the database holds for a key: its binding and stored response, this token's
// tombstone, and a request in flight.
type record struct {
	binding       *Binding
	stored        *Response
	tomb          *Response
	intent        *uuid.UUID
	intentExpired bool
	intentHolder  string
	braked        bool
	busy          bool // another request held the key: only the binding and tombstone were read
}

func readRecord(rows []entry) record {
	var r record
	for _, e := range rows {
		switch e.Entry {
		case "binding":
			r.binding = &Binding{Token: e.Token, RequestHash: e.RequestHash, UID: e.UID}
			r.stored = &Response{Status: int(e.Status), Body: e.Body, UID: e.UID, Replayed: true}
		case "tombstone":
			r.tomb = &Response{Status: int(e.Status), Body: e.Body, UID: e.UID, Replayed: true}
		case "intent":
			op := e.UID
			r.intent, r.intentExpired, r.intentHolder = &op, e.Status == 1, e.Token
		case "brake":
			r.braked = true
		case "busy":
			r.busy = true
		}
	}
	return r
}

type entry = dbsqlc.OwnershipLockRow

// decide answers what the protocol says about a request given the key's record: a replay, a
// refusal, or nil to go ahead.
func decide(in Intent, hash []byte, deleting bool, r record) (*Response, error) {
	if deleting {
		switch {
		case r.tomb != nil:
			return r.tomb, nil // a replayed DELETE answers as the first did
		case r.binding == nil:
			return nil, apierr.New(apierr.NotFound, "no %s %q", in.Kind, in.ImportID)
		case r.binding.Token != in.Token:
			return nil, conflict(in, r.binding)
		}
		return nil, nil
	}
	switch {
	case r.tomb != nil:
		// A late replay of a deleted object's request never resurrects it.
		return nil, apierr.New(apierr.Tombstoned, "this ownership token's %s was deleted; a new object needs a new token", in.Kind)
	case r.binding != nil && r.binding.Token != in.Token:
		return nil, conflict(in, r.binding)
	case r.binding != nil && bytes.Equal(r.binding.RequestHash, hash):
		return r.stored, nil
	}
	return nil, nil
}

func conflict(in Intent, b *Binding) *apierr.Error {
	cmd := fmt.Sprintf("terraform import %s.<name> %s", in.ResourceType, in.ImportID)
	block := fmt.Sprintf("import {\n  to = %s.<name>\n  id = %q\n}", in.ResourceType, in.ImportID)
	return apierr.New(apierr.OwnershipConflict,
		"this %s is owned by another ownership token; adopt it with `%s` (or `tofu import`), or an import block with id %q",
		in.Kind, cmd, in.ImportID).
		With("conflict", map[string]any{
			"kind":          in.Kind,
			"id":            in.ImportID,
			"uid":           b.UID.String(),
			"importCommand": cmd,
			"importBlock":   block,
		})
}

// Put runs an owned create-or-update.
func (mgr *Manager) Put(ctx context.Context, in Intent, effect Effect) (Response, error) {
	return mgr.run(ctx, in, false, effect)
}

// Delete runs an owned delete: the token must own the object; the response is kept in a
// tombstone so that a replayed DELETE answers as the first did.
func (mgr *Manager) Delete(ctx context.Context, in Intent, effect Effect) (Response, error) {
	return mgr.run(ctx, in, true, effect)
}

func (mgr *Manager) run(ctx context.Context, in Intent, deleting bool, effect Effect) (Response, error) {
	if !ValidToken(in.Token) {
		return Response{}, apierr.New(apierr.InvalidRequest, "%s must be 16 to 128 characters of [A-Za-z0-9._~-]", TokenHeader)
	}
	hash, err := RequestHash(in.Method, in.Path, in.IfMatch, in.Body)
	if err != nil {
		return Response{}, apierr.New(apierr.BadRequest, "request body is not valid JSON")
	}
	// The first read, one round trip: the key's lock when it is free, so that new work goes on
	// holding it; when another request holds it, the binding and tombstone read without it. Either
	// way a replay, a tombstone or a conflict is answered from it, never waiting on anything.
	first, rows, err := mgr.firstRead(ctx, in)
	if err != nil {
		return Response{}, err
	}
	rec := readRecord(rows)
	if resp, err := decide(in, hash, deleting, rec); resp != nil || err != nil {
		_ = first.Rollback(context.WithoutCancel(ctx))
		if resp != nil {
			return *resp, nil
		}
		return Response{}, err
	}
	if rec.busy {
		// New work waits for the request in flight, in the first phase's own lock step.
		_ = first.Rollback(context.WithoutCancel(ctx))
		first = nil
	}

	// From here the request runs to an outcome even if its caller goes away.
	deadline := mgr.Deadline
	if deadline <= 0 {
		deadline = 3 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deadline)
	defer cancel()
	busyUntil := time.Now().Add(mgr.busyWait())
	for pause := 20 * time.Millisecond; ; pause = min(pause*2, 250*time.Millisecond) {
		m := &Mutation{Operation: uuid.Must(uuid.NewV7()), Intent: in, mgr: mgr, hash: hash, deleting: deleting}
		if first != nil {
			m.opened = &openedTx{tx: first, rows: rows}
			first = nil
		}
		resp, err := runEffect(ctx, m, effect)
		var answered *answeredError
		switch {
		case errors.As(err, &answered):
			return answered.resp, answered.err
		case errors.Is(err, errBusy):
			if time.Now().Add(pause).After(busyUntil) {
				err := apierr.New(apierr.IntentInProgress, "another request for this %s is still in progress; retry", in.Kind)
				return Response{}, err
			}
			time.Sleep(pause)
			continue
		case errors.Is(err, errRecovered):
			continue // an abandoned operation was settled: decide afresh
		case err != nil:
			return Response{Operation: m.Operation}, m.refuse(ctx, err)
		}
		resp.Operation = m.Operation
		return resp, nil
	}
}

// runEffect runs effect and stops the lease's renewal however it ends, a panic included: a request
// that dies mid-way leaves its lease to expire like a stopped Host's, and recovery settles it.
// An effect that ends before its first phase leaves the first read's transaction: it ends here.
func runEffect(ctx context.Context, m *Mutation, effect Effect) (Response, error) {
	defer m.stopHeartbeat()
	defer m.dropOpened(ctx)
	return effect(ctx, m)
}

// firstRead begins the request's first transaction with the lock step in try mode.
func (mgr *Manager) firstRead(ctx context.Context, in Intent) (pgx.Tx, []entry, error) {
	tx, err := store.Begin(ctx, mgr.DB)
	if err != nil {
		return nil, nil, fmt.Errorf("ownership: lookup: %w", store.Classify(err))
	}
	rows, err := dbsqlc.New(tx).OwnershipLock(ctx, lockParams(in, true))
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, nil, fmt.Errorf("ownership: lookup: %w", store.Classify(err))
	}
	return tx, rows, nil
}

// lockParams are the lock step's for in: with try, the key's lock only if it is free.
func lockParams(in Intent, try bool) dbsqlc.OwnershipLockParams {
	p := dbsqlc.OwnershipLockParams{OrganizationID: in.OrganizationID, Kind: in.Kind, ExternalKey: in.Key, Token: in.Token,
		LockWait: lockWait, TryOnly: try}
	if in.Brake != nil {
		p.BrakeSpace, p.BrakeWorker = &in.Brake.Space, &in.Brake.Worker
	}
	return p
}

// errBusy means another request holds the key's lease.
var errBusy = errors.New("ownership: another request is in flight")

// errRecovered means the key's abandoned operation was just settled; the request starts over.
var errRecovered = errors.New("ownership: recovered an abandoned operation")

// errLeaseLost means the request's lease expired and was taken over while it worked.
var errLeaseLost = apierr.New(apierr.IntentInProgress, "this request ran past its lease and was taken over; retry")

// answeredError carries an answer decided under the key lock: a replay or a refusal that the
// first read did not see because another request finished in between.
type answeredError struct {
	resp Response
	err  error
}

func (e *answeredError) Error() string { return "ownership: answered under the key lock" }

// PurgeTombstones deletes tombstones past their retention and reports how many went.
func (mgr *Manager) PurgeTombstones(ctx context.Context) (int64, error) {
	n, err := dbsqlc.New(mgr.DB).OwnershipTombstonePurge(ctx)
	if err != nil {
		return 0, fmt.Errorf("ownership: purge tombstones: %w", store.Classify(err))
	}
	return n, nil
}
