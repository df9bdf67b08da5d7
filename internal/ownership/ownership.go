// Package ownership implements the takoform-ownership-v1 protocol (SPEC 3.2) once, for every
// mutating route. A route describes its request as an Intent and hands over the effect; this package
// serializes requests per object across all Host processes, replays stored responses, refuses
// conflicting tokens, and keeps tombstones.
package ownership

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
	"github.com/takoform/terraform-provider-takoform/internal/store"
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
	// Method, Path and Body make the canonical request hash.
	Method string
	Path   string
	Body   []byte
	// ResourceType and ImportID name the provider resource and import id in conflict details.
	ResourceType string
	ImportID     string
}

// Response is what an effect produced: stored for replay when it is a success.
type Response struct {
	Status   int
	Body     []byte
	UID      uuid.UUID
	Replayed bool
	// Operation is the ledger entry of the request that produced this answer.
	Operation uuid.UUID
}

// Binding is the current owner of an object.
type Binding struct {
	Token       string
	RequestHash []byte
	UID         uuid.UUID
	// Pending is true while the owner's first effect has not finished (the Host may have crashed
	// part-way); the owner's retry resumes it.
	Pending bool
}

// Manager runs owned mutations against one database.
type Manager struct {
	DB *pgxpool.Pool
	// TombstoneRetention is how long tombstones are kept (30 days by default).
	TombstoneRetention time.Duration
	// LockWait bounds how long a request waits for another in-flight request on the same object
	// before answering intent_in_progress.
	LockWait time.Duration
	// Recover settles an operation whose Host stopped mid-request (it reads the backend back and
	// marks the operation refused). It is called with the object's lock held, before a new request
	// on the object starts, and by RecoverStale.
	Recover func(ctx context.Context, begin func(context.Context) (pgx.Tx, error), op uuid.UUID) error
}

// Mutation is one owned request in progress: it holds the object's lock and its ledger entry.
// Every transaction of the effect runs on the connection that holds the lock.
type Mutation struct {
	// Operation is the request's ledger id.
	Operation uuid.UUID
	// Current is the binding before this request (nil when none).
	Current *Binding
	Intent  Intent
	hash    []byte
	conn    *pgxpool.Conn
}

// Tx runs fn in a transaction on the mutation's connection.
func (m *Mutation) Tx(ctx context.Context, fn func(pgx.Tx) error) error {
	tx, err := m.conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit transaction: %w", err)
	}
	return nil
}

// Bind records, in tx, that the request's token owns uid, before the effect has finished. Call it
// in the transaction that creates the object's rows, so that a crash after that commit leaves an
// object its owner's retry resumes instead of an orphan.
func (m *Mutation) Bind(ctx context.Context, tx pgx.Tx, uid uuid.UUID) error {
	args := keyArgs(m.Intent)
	args["request_hash"] = m.hash
	args["object_uid"] = uid
	tag, err := tx.Exec(ctx, store.Q("OwnershipBindingPending"), args)
	if err != nil {
		return fmt.Errorf("ownership: bind: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("ownership: bind: the key is bound to another token")
	}
	return nil
}

// Effect performs the mutation. It returns the response to store, or an error that refuses the
// request (and is recorded as the operation's refusal).
type Effect func(ctx context.Context, m *Mutation) (Response, error)

// RequestHash is SHA-256 over the method, the path and the canonical JSON of the body.
func RequestHash(method, path string, body []byte) ([]byte, error) {
	canon, err := CanonicalBody(body)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{0})
	h.Write([]byte(path))
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
	case float64:
		return canonjson.Number(fmt.Sprint(v))
	default:
		return v
	}
}

func keyArgs(in Intent) pgx.NamedArgs {
	return pgx.NamedArgs{"organization_id": in.OrganizationID, "kind": in.Kind, "external_key": in.Key, "token": in.Token}
}

// lock takes the object's session-level advisory lock, polling without holding a connection
// between tries, so waiters never starve the pool. It returns the connection holding the lock.
func (m *Manager) lock(ctx context.Context, in Intent) (*pgxpool.Conn, func(), error) {
	wait := m.LockWait
	if wait <= 0 {
		wait = 10 * time.Second
	}
	deadline := time.Now().Add(wait)
	args := pgx.NamedArgs{"lock_key": in.OrganizationID + "/" + in.Kind + "/" + in.Key}
	for pause := 5 * time.Millisecond; ; pause = min(pause*2, 100*time.Millisecond) {
		conn, err := m.DB.Acquire(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("ownership: acquire connection: %w", err)
		}
		var got bool
		if err := conn.QueryRow(ctx, store.Q("OwnershipTryLock"), args).Scan(&got); err != nil {
			conn.Release()
			return nil, nil, fmt.Errorf("ownership: lock: %w", err)
		}
		if got {
			unlock := func() {
				var released bool
				err := conn.QueryRow(context.Background(), store.Q("OwnershipUnlock"), args).Scan(&released)
				if err != nil || !released {
					// A session we cannot vouch for must not go back to the pool holding the lock.
					_ = conn.Conn().Close(context.Background())
				}
				conn.Release()
			}
			return conn, unlock, nil
		}
		conn.Release()
		if time.Now().Add(pause).After(deadline) {
			return nil, nil, apierr.New(apierr.IntentInProgress, "another request for this %s is still in progress; retry", in.Kind)
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(pause + time.Duration(rand.Int64N(int64(pause)))):
		}
	}
}

// run holds the object's lock and its ledger entry around body, recording the outcome.
func (m *Manager) run(ctx context.Context, in Intent, body func(mut *Mutation) (Response, error)) (Response, error) {
	if !ValidToken(in.Token) {
		return Response{}, apierr.New(apierr.InvalidRequest, "%s must be 16 to 128 characters of [A-Za-z0-9._~-]", TokenHeader)
	}
	hash, err := RequestHash(in.Method, in.Path, in.Body)
	if err != nil {
		return Response{}, apierr.New(apierr.BadRequest, "request body is not valid JSON")
	}
	conn, unlock, err := m.lock(ctx, in)
	if err != nil {
		return Response{}, err
	}
	defer unlock()
	if err := m.recoverKey(ctx, conn, in); err != nil {
		return Response{}, err
	}
	mut := &Mutation{Operation: uuid.New(), Intent: in, hash: hash, conn: conn}
	if _, err := conn.Exec(ctx, store.Q("OperationBegin"), pgx.NamedArgs{
		"id": mut.Operation, "organization_id": in.OrganizationID, "kind": in.Kind, "external_key": in.Key, "method": in.Method,
	}); err != nil {
		return Response{}, fmt.Errorf("ownership: begin operation: %w", err)
	}
	resp, err := body(mut)
	// The outcome is recorded even when the caller has gone away.
	finish := pgx.NamedArgs{"id": mut.Operation, "status": "committed", "code": nil, "replayed": resp.Replayed}
	if err != nil {
		code := string(apierr.Internal)
		if ae, ok := apierr.As(err); ok {
			code = string(ae.Code)
		}
		finish["status"], finish["code"] = "refused", code
	}
	if _, ferr := conn.Exec(context.WithoutCancel(ctx), store.Q("OperationFinish"), finish); ferr != nil && err == nil {
		err = fmt.Errorf("ownership: finish operation: %w", ferr)
	}
	resp.Operation = mut.Operation
	return resp, err
}

// recoverKey settles operations left running on the key by a Host that stopped mid-request. The
// caller holds the key's lock, so no live request can own them.
func (m *Manager) recoverKey(ctx context.Context, conn *pgxpool.Conn, in Intent) error {
	if m.Recover == nil {
		return nil
	}
	rows, err := conn.Query(ctx, store.Q("OperationsRunningForKey"), pgx.NamedArgs{
		"organization_id": in.OrganizationID, "kind": in.Kind, "external_key": in.Key, "id": uuid.Nil,
	})
	if err != nil {
		return fmt.Errorf("ownership: stale operations: %w", err)
	}
	stale, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return fmt.Errorf("ownership: stale operations: %w", err)
	}
	for _, op := range stale {
		if err := m.Recover(ctx, conn.Begin, op); err != nil {
			return fmt.Errorf("ownership: recover operation %s: %w", op, err)
		}
	}
	return nil
}

// RecoverStale settles running operations older than olderThan whose key's lock is free (their
// Host is gone). It reports how many it settled.
func (m *Manager) RecoverStale(ctx context.Context, olderThan time.Duration) (int, error) {
	if m.Recover == nil {
		return 0, nil
	}
	rows, err := m.DB.Query(ctx, store.Q("OperationsStale"), pgx.NamedArgs{"older_than_seconds": olderThan.Seconds()})
	if err != nil {
		return 0, fmt.Errorf("ownership: stale operations: %w", err)
	}
	type staleOp struct {
		id  uuid.UUID
		key Intent
	}
	var ops []staleOp
	var op staleOp
	if _, err := pgx.ForEachRow(rows, []any{&op.id, &op.key.OrganizationID, &op.key.Kind, &op.key.Key}, func() error {
		ops = append(ops, op)
		return nil
	}); err != nil {
		return 0, fmt.Errorf("ownership: stale operations: %w", err)
	}
	settled := 0
	for _, op := range ops {
		conn, err := m.DB.Acquire(ctx)
		if err != nil {
			return settled, err
		}
		args := pgx.NamedArgs{"lock_key": op.key.OrganizationID + "/" + op.key.Kind + "/" + op.key.Key}
		var got bool
		if err := conn.QueryRow(ctx, store.Q("OwnershipTryLock"), args).Scan(&got); err != nil || !got {
			conn.Release()
			continue // a live request holds it: not stale
		}
		err = m.Recover(ctx, conn.Begin, op.id)
		var released bool
		if uerr := conn.QueryRow(context.Background(), store.Q("OwnershipUnlock"), args).Scan(&released); uerr != nil || !released {
			_ = conn.Conn().Close(context.Background())
		}
		conn.Release()
		if err != nil {
			return settled, fmt.Errorf("ownership: recover operation %s: %w", op.id, err)
		}
		settled++
	}
	return settled, nil
}

func (m *Manager) tombstone(ctx context.Context, q pgx.Tx, in Intent) (*Response, error) {
	var r Response
	var hash []byte
	err := q.QueryRow(ctx, store.Q("OwnershipTombstoneGet"), keyArgs(in)).Scan(&r.UID, &hash, &r.Status, &r.Body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ownership: read tombstone: %w", err)
	}
	r.Replayed = true
	return &r, nil
}

func (m *Manager) binding(ctx context.Context, q pgx.Tx, in Intent) (*Binding, *Response, error) {
	var b Binding
	var state string
	var status *int
	var body []byte
	err := q.QueryRow(ctx, store.Q("OwnershipBindingGet"), keyArgs(in)).Scan(&b.Token, &b.RequestHash, &b.UID, &state, &status, &body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("ownership: read binding: %w", err)
	}
	b.Pending = state == "pending"
	if b.Pending {
		return &b, nil, nil
	}
	return &b, &Response{Status: *status, Body: body, UID: b.UID, Replayed: true}, nil
}

// lookup reads the tombstone and binding of in's key.
func (m *Manager) lookup(ctx context.Context, mut *Mutation) (tomb *Response, current *Binding, stored *Response, err error) {
	err = mut.Tx(ctx, func(tx pgx.Tx) error {
		if tomb, err = m.tombstone(ctx, tx, mut.Intent); err != nil || tomb != nil {
			return err
		}
		current, stored, err = m.binding(ctx, tx, mut.Intent)
		return err
	})
	return tomb, current, stored, err
}

func conflict(in Intent, b *Binding) *apierr.Error {
	return apierr.New(apierr.OwnershipConflict,
		"this %s is owned by another ownership token; adopt it with `terraform import %s.<name> %s` (or `tofu import`)",
		in.Kind, in.ResourceType, in.ImportID).
		With("conflict", map[string]any{
			"kind":          in.Kind,
			"id":            in.ImportID,
			"uid":           b.UID.String(),
			"importCommand": fmt.Sprintf("terraform import %s.<name> %s", in.ResourceType, in.ImportID),
		})
}

// Put runs an owned create-or-update. The effect sees the current binding (nil for a create, or
// a pending one to resume); a success is bound to the token and stored for replay, a refusal
// changes no binding.
func (m *Manager) Put(ctx context.Context, in Intent, effect Effect) (Response, error) {
	return m.run(ctx, in, func(mut *Mutation) (Response, error) {
		tomb, current, stored, err := m.lookup(ctx, mut)
		switch {
		case err != nil:
			return Response{}, err
		case tomb != nil:
			// A late replay of a deleted object's request never resurrects it.
			return Response{}, apierr.New(apierr.Tombstoned, "this ownership token's %s was deleted; a new object needs a new token", in.Kind)
		case current != nil && current.Token != in.Token:
			return Response{}, conflict(in, current)
		case stored != nil && bytes.Equal(current.RequestHash, mut.hash):
			return *stored, nil
		}
		mut.Current = current
		resp, err := effect(ctx, mut)
		if err != nil {
			return Response{}, err
		}
		if resp.Status < 200 || resp.Status > 299 {
			return Response{}, fmt.Errorf("ownership: effect returned status %d without an error", resp.Status)
		}
		args := keyArgs(in)
		args["request_hash"] = mut.hash
		args["object_uid"] = resp.UID
		args["response_status"] = resp.Status
		args["response_body"] = resp.Body
		tag, err := mut.conn.Exec(ctx, store.Q("OwnershipBindingComplete"), args)
		if err != nil {
			return Response{}, fmt.Errorf("ownership: bind: %w", err)
		}
		if tag.RowsAffected() != 1 {
			return Response{}, fmt.Errorf("ownership: bind: the key is bound to another token")
		}
		return resp, nil
	})
}

// Delete runs an owned delete. The token must own the object; the response is kept in a
// tombstone so a replayed DELETE answers as the first did.
func (m *Manager) Delete(ctx context.Context, in Intent, effect Effect) (Response, error) {
	return m.run(ctx, in, func(mut *Mutation) (Response, error) {
		tomb, current, _, err := m.lookup(ctx, mut)
		switch {
		case err != nil:
			return Response{}, err
		case tomb != nil:
			return *tomb, nil
		case current == nil:
			return Response{}, apierr.New(apierr.NotFound, "no %s %q", in.Kind, in.ImportID)
		case current.Token != in.Token:
			return Response{}, conflict(in, current)
		}
		mut.Current = current
		resp, err := effect(ctx, mut)
		if err != nil {
			return Response{}, err
		}
		retention := m.TombstoneRetention
		if retention <= 0 {
			retention = 30 * 24 * time.Hour
		}
		resp.UID = current.UID
		err = mut.Tx(ctx, func(tx pgx.Tx) error {
			args := keyArgs(in)
			args["object_uid"] = current.UID
			args["request_hash"] = mut.hash
			args["response_status"] = resp.Status
			args["response_body"] = resp.Body
			args["retention_seconds"] = int64(retention / time.Second)
			if _, err := tx.Exec(ctx, store.Q("OwnershipTombstoneCreate"), args); err != nil {
				return fmt.Errorf("ownership: tombstone: %w", err)
			}
			if _, err := tx.Exec(ctx, store.Q("OwnershipBindingDelete"), keyArgs(in)); err != nil {
				return fmt.Errorf("ownership: unbind: %w", err)
			}
			return nil
		})
		return resp, err
	})
}

// Tokens returns the owning token of each key of kind in the organization.
func Tokens(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, organizationID, kind string, keys []string) (map[string]string, error) {
	rows, err := q.Query(ctx, store.Q("OwnershipBindingTokens"), pgx.NamedArgs{"organization_id": organizationID, "kind": kind, "external_keys": keys})
	if err != nil {
		return nil, fmt.Errorf("ownership: tokens: %w", err)
	}
	out := map[string]string{}
	var key, token string
	_, err = pgx.ForEachRow(rows, []any{&key, &token}, func() error { out[key] = token; return nil })
	if err != nil {
		return nil, fmt.Errorf("ownership: tokens: %w", err)
	}
	return out, nil
}

// PurgeTombstones deletes tombstones past their retention and reports how many went.
func (m *Manager) PurgeTombstones(ctx context.Context) (int64, error) {
	tag, err := m.DB.Exec(ctx, store.Q("OwnershipTombstonePurge"))
	if err != nil {
		return 0, fmt.Errorf("ownership: purge tombstones: %w", err)
	}
	return tag.RowsAffected(), nil
}
