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
}

// Binding is the current owner of an object.
type Binding struct {
	Token       string
	RequestHash []byte
	UID         uuid.UUID
}

// Manager runs owned mutations against one database.
type Manager struct {
	DB *pgxpool.Pool
	// TombstoneRetention is how long tombstones are kept (30 days by default).
	TombstoneRetention time.Duration
	// LockWait bounds how long a request waits for another in-flight request on the same object
	// before answering intent_in_progress.
	LockWait time.Duration
}

// Effect performs the mutation inside the transaction that holds the object's lock. current is
// nil when no binding exists.
type Effect func(ctx context.Context, tx pgx.Tx, current *Binding) (Response, error)

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

func (m *Manager) begin(ctx context.Context, in Intent, fn func(tx pgx.Tx, hash []byte) (Response, error)) (Response, error) {
	if !ValidToken(in.Token) {
		return Response{}, apierr.New(apierr.InvalidRequest, "%s must be 16 to 128 characters of [A-Za-z0-9._~-]", TokenHeader)
	}
	hash, err := RequestHash(in.Method, in.Path, in.Body)
	if err != nil {
		return Response{}, apierr.New(apierr.BadRequest, "request body is not valid JSON")
	}
	wait := m.LockWait
	if wait <= 0 {
		wait = 10 * time.Second
	}
	var out Response
	err = store.WithTx(ctx, m.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", wait.Milliseconds())); err != nil {
			return fmt.Errorf("ownership: set lock timeout: %w", err)
		}
		lockKey := in.OrganizationID + "/" + in.Kind + "/" + in.Key
		if _, err := tx.Exec(ctx, store.Q("OwnershipLockKey"), pgx.NamedArgs{"lock_key": lockKey}); err != nil {
			if store.IsLockTimeout(err) {
				return apierr.New(apierr.IntentInProgress, "another request for this %s is still in progress; retry", in.Kind)
			}
			return fmt.Errorf("ownership: lock: %w", err)
		}
		out, err = fn(tx, hash)
		return err
	})
	return out, err
}

func (m *Manager) keyArgs(in Intent) pgx.NamedArgs {
	return pgx.NamedArgs{"organization_id": in.OrganizationID, "kind": in.Kind, "external_key": in.Key, "token": in.Token}
}

func (m *Manager) tombstone(ctx context.Context, tx pgx.Tx, in Intent) (*Response, error) {
	var r Response
	var hash []byte
	err := tx.QueryRow(ctx, store.Q("OwnershipTombstoneGet"), m.keyArgs(in)).Scan(&r.UID, &hash, &r.Status, &r.Body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ownership: read tombstone: %w", err)
	}
	r.Replayed = true
	return &r, nil
}

func (m *Manager) binding(ctx context.Context, tx pgx.Tx, in Intent) (*Binding, *Response, error) {
	var b Binding
	var stored Response
	err := tx.QueryRow(ctx, store.Q("OwnershipBindingGet"), m.keyArgs(in)).Scan(&b.Token, &b.RequestHash, &b.UID, &stored.Status, &stored.Body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("ownership: read binding: %w", err)
	}
	stored.UID = b.UID
	stored.Replayed = true
	return &b, &stored, nil
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

// Put runs an owned create-or-update. effect is called with the current binding (nil for a
// create); a success is bound to the token and stored for replay, a refusal changes nothing.
func (m *Manager) Put(ctx context.Context, in Intent, effect Effect) (Response, error) {
	return m.begin(ctx, in, func(tx pgx.Tx, hash []byte) (Response, error) {
		if tomb, err := m.tombstone(ctx, tx, in); err != nil {
			return Response{}, err
		} else if tomb != nil {
			// A late replay of a deleted object's request never resurrects it.
			return Response{}, apierr.New(apierr.Tombstoned, "this ownership token's %s was deleted; a new object needs a new token", in.Kind)
		}
		current, stored, err := m.binding(ctx, tx, in)
		if err != nil {
			return Response{}, err
		}
		if current != nil && current.Token != in.Token {
			return Response{}, conflict(in, current)
		}
		if current != nil && bytes.Equal(current.RequestHash, hash) {
			return *stored, nil
		}
		resp, err := effect(ctx, tx, current)
		if err != nil {
			return Response{}, err
		}
		if resp.Status < 200 || resp.Status > 299 {
			return Response{}, fmt.Errorf("ownership: effect returned status %d without an error", resp.Status)
		}
		args := m.keyArgs(in)
		args["request_hash"] = hash
		args["object_uid"] = resp.UID
		args["response_status"] = resp.Status
		args["response_body"] = resp.Body
		if _, err := tx.Exec(ctx, store.Q("OwnershipBindingUpsert"), args); err != nil {
			return Response{}, fmt.Errorf("ownership: bind: %w", err)
		}
		return resp, nil
	})
}

// Delete runs an owned delete. The token must own the object; the response is kept in a
// tombstone so a replayed DELETE answers as the first did.
func (m *Manager) Delete(ctx context.Context, in Intent, effect Effect) (Response, error) {
	return m.begin(ctx, in, func(tx pgx.Tx, hash []byte) (Response, error) {
		if tomb, err := m.tombstone(ctx, tx, in); err != nil {
			return Response{}, err
		} else if tomb != nil {
			return *tomb, nil
		}
		current, _, err := m.binding(ctx, tx, in)
		if err != nil {
			return Response{}, err
		}
		if current == nil {
			return Response{}, apierr.New(apierr.NotFound, "no %s %q", in.Kind, in.ImportID)
		}
		if current.Token != in.Token {
			return Response{}, conflict(in, current)
		}
		resp, err := effect(ctx, tx, current)
		if err != nil {
			return Response{}, err
		}
		retention := m.TombstoneRetention
		if retention <= 0 {
			retention = 30 * 24 * time.Hour
		}
		args := m.keyArgs(in)
		args["object_uid"] = current.UID
		args["request_hash"] = hash
		args["response_status"] = resp.Status
		args["response_body"] = resp.Body
		args["retention_seconds"] = int64(retention / time.Second)
		if _, err := tx.Exec(ctx, store.Q("OwnershipTombstoneCreate"), args); err != nil {
			return Response{}, fmt.Errorf("ownership: tombstone: %w", err)
		}
		if _, err := tx.Exec(ctx, store.Q("OwnershipBindingDelete"), m.keyArgs(in)); err != nil {
			return Response{}, fmt.Errorf("ownership: unbind: %w", err)
		}
		resp.UID = current.UID
		return resp, nil
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
