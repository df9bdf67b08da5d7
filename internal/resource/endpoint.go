package resource

import (
	"context"
	"errors"
	"fmt"
	"net/url"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/api/apitypes"
	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/quota"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
	"github.com/takoform/terraform-provider-takoform/internal/wire"
)

// EndpointSpec is the body of PUT /v1/spaces/{space}/worker-endpoints/{name}.
type EndpointSpec = apitypes.EndpointSpec

// Endpoint is one stored endpoint with its derived deployment state.
type Endpoint struct {
	dbsqlc.EndpointState
	Placement Placement
	// Live is how its backend routes it now, when a read asked (nil: not asked).
	Live *Liveness
}

func endpointOf(st dbsqlc.EndpointState) Endpoint {
	return Endpoint{EndpointState: st, Placement: Placement{OfferingID: st.OfferingID, OfferingDigest: st.OfferingDigest, Pack: st.Pack, Installation: st.Installation}}
}

// Ready is readiness as derived now: live, its route's deployment active, and (when asked) the
// backend routing it to a Ready incarnation of its worker now. It is the Ready condition.
func (e Endpoint) Ready() bool { return e.conditions()[0].Status == "True" }

func (e Endpoint) conditions() []Condition {
	c := Condition{Type: "Ready", Status: "False"}
	switch {
	case e.Status == dbsqlc.ResourceStatusDeleted:
		c.Reason, c.Message = "Deleted", "the endpoint was deleted"
	case e.Status == dbsqlc.ResourceStatusDeleting:
		c.Reason, c.Message = "Deleting", "the endpoint is being deleted"
	case e.DeploymentStatus == string(dbsqlc.DeploymentStatusFailed):
		c.Reason, c.Message = "DeploymentFailed", "the backend refused the route; apply again to retry"
	case e.DeploymentStatus != string(dbsqlc.DeploymentStatusActive) || e.Status != dbsqlc.ResourceStatusLive:
		c.Reason, c.Message = "DeploymentPending", "the route has no active deployment yet"
	case !e.Live.serves(e.DeploymentID):
		c.Reason, c.Message = e.Live.condition(e.DeploymentID)
	default:
		c.Status, c.Reason, c.Message = "True", "DeploymentActive", "the route is active and its worker serves"
	}
	return []Condition{c}
}

// WorkerRef names an endpoint's worker in its projection.
type WorkerRef = apitypes.WorkerRef

// EndpointProjection is the public view of an endpoint: the document's Endpoint (api/apitypes),
// with the bytes a response carries.
type EndpointProjection apitypes.Endpoint

// Project renders e with its ownership token.
func (e Endpoint) Project(token string) EndpointProjection {
	p := EndpointProjection{
		UID: e.UID.String(), Space: e.Space, Name: e.Name, Generation: e.Generation, Revision: e.Revision,
		Worker: WorkerRef{UID: e.WorkerUID.String(), Name: e.WorkerName}, OriginReservationID: e.OriginReservationID,
		HostMinted: e.HostMinted, Hostname: e.Hostname, URL: e.CanonicalOrigin + "/", Ready: e.Ready(),
		Conditions: e.conditions(), OfferingID: e.Placement.OfferingID,
	}
	if token != "" {
		p.OwnershipToken = &token
	}
	return p
}

// JSON is the projection's bytes.
func (p EndpointProjection) JSON() []byte { return wire.JSON(p) }

func lockEndpoint(ctx context.Context, q *dbsqlc.Queries, org string, uid *uuid.UUID, space, name string) (Endpoint, error) {
	st, err := q.EndpointLock(ctx, dbsqlc.EndpointLockParams{OrganizationID: org, UID: uid, Space: space, Name: name})
	if errors.Is(err, pgx.ErrNoRows) {
		return Endpoint{}, apierr.New(apierr.NotFound, "no endpoint %s/%s", space, name)
	}
	if err != nil {
		return Endpoint{}, fmt.Errorf("resource: lock endpoint: %w", err)
	}
	return endpointOf(st), nil
}

func readEndpoint(ctx context.Context, q *dbsqlc.Queries, org string, uid *uuid.UUID, space, name string) (Endpoint, error) {
	st, err := q.EndpointGet(ctx, dbsqlc.EndpointGetParams{OrganizationID: org, UID: uid, Space: space, Name: name})
	if errors.Is(err, pgx.ErrNoRows) {
		return Endpoint{}, apierr.New(apierr.NotFound, "no endpoint %s/%s", space, name)
	}
	if err != nil {
		return Endpoint{}, fmt.Errorf("resource: read endpoint: %w", err)
	}
	return endpointOf(st), nil
}

// GetEndpoint reads the present endpoint space/name and the owning token of its ownership key, in
// one round trip, taking no lock.
func (s *Service) GetEndpoint(ctx context.Context, db dbsqlc.DBTX, org auth.Organization, space, name string) (Endpoint, string, error) {
	row, err := dbsqlc.New(db).EndpointRead(ctx, dbsqlc.EndpointReadParams{
		OwnershipKind: EndpointKind, OwnershipKey: space + "/" + name, OrganizationID: org.ID, Space: space, Name: name})
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && !row.EndpointState.Present) {
		return Endpoint{}, "", apierr.New(apierr.NotFound, "no endpoint %s/%s", space, name)
	}
	if err != nil {
		return Endpoint{}, "", fmt.Errorf("resource: get endpoint: %w", err)
	}
	e := endpointOf(row.EndpointState)
	e.Live = s.observe(ctx, e.Placement, backend.NativeRoute, e.Hostname)
	return e, row.OwnershipToken, nil
}

func (e *Endpoint) setStatus(ctx context.Context, q *dbsqlc.Queries, operation uuid.UUID, status dbsqlc.ResourceStatus) error {
	revision, err := q.EndpointSetStatus(ctx, dbsqlc.EndpointSetStatusParams{UID: e.UID, Revision: e.Revision, Status: status, OperationID: operation})
	if errors.Is(err, pgx.ErrNoRows) {
		return apierr.New(apierr.IntentInProgress, "the endpoint changed during this request; retry")
	}
	if err != nil {
		return fmt.Errorf("resource: endpoint status: %w", err)
	}
	e.Status, e.Revision, e.OperationID = status, revision, operation
	return nil
}

func (e Endpoint) incarnation() reservation.EndpointIncarnation {
	return reservation.EndpointIncarnation{UID: e.UID, Revision: e.Revision, WorkerUID: e.WorkerUID, CanonicalOrigin: e.CanonicalOrigin, Placement: e.Placement}
}

func hostOf(origin string) string {
	u, err := url.Parse(origin)
	if err != nil {
		return origin
	}
	return u.Hostname()
}

func (e Endpoint) desired(org auth.Organization, scriptName string, cpuMs int64) backend.Desired {
	return backend.Desired{Kind: backend.NativeRoute, NativeName: e.Hostname, ResourceUID: e.UID, ScriptName: scriptName, CPUMs: cpuMs,
		Labels: backend.Labels{Organization: org.Name, Space: e.Space, Worker: e.WorkerName}}
}

// PutEndpoint creates an endpoint on its supplied reservation or on one the Host mints, or
// resumes one whose route is not active. An endpoint never changes in place: its worker, origin
// and placement are its identity. Its phases: plan (one transaction: prove the worker Ready, bind
// the reservation and record the endpoint on it as its witness, insert the endpoint, plan the
// route), apply (one backend call), commit (record the route, the endpoint live, a Host-minted
// reservation activated, the binding).
func (s *Service) PutEndpoint(ctx context.Context, m *ownership.Mutation, org auth.Organization, space, name string, spec EndpointSpec) (ownership.Response, error) {
	if !vocab.Name.MatchString(space) || !vocab.Name.MatchString(name) || !vocab.Name.MatchString(spec.Worker) {
		return ownership.Response{}, apierr.New(apierr.InvalidRequest, "space, name and worker must each match %s", vocab.NamePattern)
	}
	if spec.OriginReservationID != nil {
		if err := reservation.CheckID(*spec.OriginReservationID); err != nil {
			return ownership.Response{}, err
		}
	}
	offering, inst, err := s.endpointOffering(ctx, m, org, space, spec)
	if err != nil {
		return ownership.Response{}, err
	}
	placement := offering.Placement()
	mut, err := s.mutator(placement)
	if err != nil {
		return ownership.Response{}, err
	}
	if !backend.Supports(mut, backend.NativeRoute) {
		return ownership.Response{}, apierr.New(apierr.NotImplemented, "the %s backend pack cannot create endpoints yet; only derivation is available", inst.Pack)
	}
	b, err := backend.For(inst)
	if err != nil {
		return ownership.Response{}, err
	}
	run := s.putEffects(m, org.ID, dbsqlc.ResourceKindWorkerEndpoint, placement, mut)
	e, err := s.planEndpoint(ctx, m, run, org, space, name, spec, placement, b)
	if err != nil {
		return ownership.Response{}, err
	}
	if err := run.perform(ctx, backendFailed); err != nil {
		return ownership.Response{}, err
	}
	live := s.observe(ctx, placement, backend.NativeRoute, e.Hostname)
	// A route that landed for an endpoint that will not commit is taken down again.
	return run.commit(ctx, func(tx pgx.Tx) (ownership.Response, error) {
		return s.commitEndpoint(ctx, tx, m, org, e, live)
	})
}

// commitEndpoint is the endpoint put's own part of its commit transaction, after the record: a
// Host-minted reservation activated, the endpoint live, its answer.
func (s *Service) commitEndpoint(ctx context.Context, tx pgx.Tx, m *ownership.Mutation, org auth.Organization, e Endpoint, live *Liveness) (ownership.Response, error) {
	q := dbsqlc.New(tx)
	if e.HostMinted {
		// mint -> bind -> create endpoint -> activate (SPEC 3.4). The reservation is locked
		// before the endpoint, in the documented order.
		cur, err := readEndpoint(ctx, q, org.ID, &e.UID, e.Space, e.Name)
		if err != nil {
			return ownership.Response{}, err
		}
		inc := cur.incarnation()
		inc.Revision = cur.Revision + boolInt(cur.Status == dbsqlc.ResourceStatusCreating)
		if _, err := s.Reservations.Activate(ctx, tx, org.ID, e.OriginReservationID, inc); err != nil {
			return ownership.Response{}, err
		}
	}
	cur, err := lockEndpoint(ctx, q, org.ID, &e.UID, e.Space, e.Name)
	if err != nil {
		return ownership.Response{}, err
	}
	if cur.Status == dbsqlc.ResourceStatusCreating {
		if err := cur.setStatus(ctx, q, m.Operation, dbsqlc.ResourceStatusLive); err != nil {
			return ownership.Response{}, err
		}
		if cur, err = readEndpoint(ctx, q, org.ID, &e.UID, e.Space, e.Name); err != nil {
			return ownership.Response{}, err
		}
	}
	cur.Live = live
	return ownership.Answer(m.Current == nil, cur.Project(m.Intent.Token).JSON(), cur.UID), nil
}

// endpointOffering resolves the endpoint's offering: the one named, or, when none is named and
// the organization is sold several, the only endpoint offering on its worker's installation (an
// endpoint only ever runs where its worker does, so that one is the eligible one).
func (s *Service) endpointOffering(ctx context.Context, m *ownership.Mutation, org auth.Organization, space string, spec EndpointSpec) (catalog.Offering, catalog.Installation, error) {
	o, inst, err := s.selectOffering(org, catalog.KindEndpoint, spec.OfferingID)
	if spec.OfferingID != nil || !apierr.Is(err, apierr.OfferingAmbiguous) {
		return o, inst, err
	}
	// A hint only: the plan's own transaction reads the worker again, under its lock, and refuses
	// an endpoint placed elsewhere than its worker.
	var installation string
	if terr := m.Tx(ctx, func(tx pgx.Tx) error {
		w, err := dbsqlc.New(tx).WorkerGet(ctx, dbsqlc.WorkerGetParams{OrganizationID: org.ID, Space: space, Name: spec.Worker})
		if err == nil {
			installation = w.Installation
		} else if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		return nil
	}); terr != nil {
		return catalog.Offering{}, catalog.Installation{}, terr
	}
	if o, inst, ok := s.Catalog.SelectOn(catalog.Organization{ID: org.ID, Name: org.Name}, catalog.KindEndpoint, installation); ok {
		return o, inst, nil
	}
	return o, inst, err
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// planEndpoint is the first phase. For a create it proves the worker Ready, takes the supplied
// reservation or mints one, and in the same transaction records the new endpoint on it as its
// witness (SPEC 3.3: from this moment release is fenced and expiry keeps the origin held), inserts
// the endpoint, and plans its route. For an existing endpoint it checks nothing changed and
// re-plans a route that is not active.
func (s *Service) planEndpoint(ctx context.Context, m *ownership.Mutation, run *effects, org auth.Organization, space, name string, spec EndpointSpec, placement Placement, b backend.Backend) (Endpoint, error) {
	var e Endpoint
	err := m.Tx(ctx, func(tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		// The deployment brake was checked in the lock step (the intent names the worker).
		if m.Current != nil {
			var err error
			if e, err = lockEndpoint(ctx, q, org.ID, &m.Current.UID, space, name); err != nil {
				return err
			}
			if err := m.CheckRevisionAfter(ctx, tx, e.Revision, e.OperationID); err != nil {
				return err
			}
			if e.Status == dbsqlc.ResourceStatusDeleting || e.Status == dbsqlc.ResourceStatusDeleted {
				return apierr.New(apierr.Conflict, "endpoint %s/%s is being deleted; finish the delete first", space, name)
			}
			wantReservation := e.OriginReservationID
			if spec.OriginReservationID != nil {
				wantReservation = *spec.OriginReservationID
			}
			if spec.Worker != e.WorkerName || wantReservation != e.OriginReservationID || (spec.OriginReservationID == nil) != e.HostMinted || placement != e.Placement {
				return apierr.New(apierr.Immutable, "endpoint %s/%s cannot change its worker, reservation or offering in place: replace it", space, name)
			}
			if e.DeploymentStatus == string(dbsqlc.DeploymentStatusActive) {
				return nil
			}
			st, err := q.WorkerGet(ctx, dbsqlc.WorkerGetParams{OrganizationID: org.ID, UID: &e.WorkerUID})
			if err != nil {
				return fmt.Errorf("resource: endpoint's worker: %w", err)
			}
			ew, err := workerOf(st)
			if err != nil {
				return fmt.Errorf("resource: endpoint's worker: %w", err)
			}
			return run.apply(ctx, q, e.UID, e.Generation, e.desired(org, ew.ScriptName, ew.Settings.LimitsOrZero().CPUMs))
		}
		// The ceilings (SPEC 5.1) come first, before any other row lock: the endpoint's, and, when
		// the Host will mint the reservation, the reservations' row too (counted by the mint, which
		// may find the row it needs already standing).
		if spec.OriginReservationID == nil {
			if err := quota.Hold(ctx, tx, org.ID, quota.Endpoints, quota.Reservations); err != nil {
				return err
			}
		}
		if err := quota.Check(ctx, tx, s.Catalog.Quotas, org.ID, quota.Endpoints); err != nil {
			return err
		}
		w, inc, err := readyWorker(ctx, q, org.ID, space, spec.Worker, uuid.Nil, true)
		if err != nil {
			return err
		}
		if inc.Placement.Installation != placement.Installation {
			return apierr.New(apierr.PlacementDrift, "the endpoint offering runs on installation %s but worker %s/%s runs on %s", placement.Installation, space, spec.Worker, inc.Placement.Installation)
		}
		uid := uuid.New()
		witness := &reservation.EndpointWitness{UID: uid, Revision: 1}
		reservationID := ""
		if spec.OriginReservationID != nil {
			reservationID = *spec.OriginReservationID
		} else {
			minted, err := s.Reservations.Mint(ctx, tx, inc, b)
			if err != nil {
				return err
			}
			reservationID = minted.ID
		}
		r, err := s.Reservations.Bind(ctx, tx, reservationID, inc, witness)
		if err == nil {
			err = reservation.CheckServable(ctx, tx, r)
		}
		if err != nil {
			return err
		}
		e = Endpoint{Placement: placement}
		e.UID, e.OrganizationID, e.Space, e.Name, e.Generation, e.Revision = uid, org.ID, space, name, 1, 1
		e.WorkerUID, e.WorkerName, e.OriginReservationID, e.HostMinted = w.UID, w.Name, r.ID, r.HostMinted
		e.CanonicalOrigin, e.Hostname, e.Status, e.OperationID = r.CanonicalOrigin, hostOf(r.CanonicalOrigin), dbsqlc.ResourceStatusCreating, m.Operation
		err = q.EndpointInsert(ctx, dbsqlc.EndpointInsertParams{
			UID: e.UID, OrganizationID: org.ID, Space: space, Name: name, WorkerUID: w.UID, WorkerName: w.Name,
			OriginReservationID: r.ID, HostMinted: r.HostMinted, CanonicalOrigin: e.CanonicalOrigin, Hostname: e.Hostname,
			OfferingID: placement.OfferingID, OfferingDigest: placement.OfferingDigest, Pack: placement.Pack,
			Installation: placement.Installation, OperationID: m.Operation,
		})
		switch {
		case store.IsUniqueViolation(err, "worker_endpoints_live_key"):
			return apierr.New(apierr.ResourceExists, "endpoint %s/%s already exists and is owned by another token; import it to adopt it", space, name)
		case store.IsUniqueViolation(err, "worker_endpoints_origin_key"):
			return apierr.New(apierr.BoundElsewhere, "another endpoint already stands on %s; one origin publishes one endpoint", e.CanonicalOrigin)
		case err != nil:
			return fmt.Errorf("resource: create endpoint: %w", err)
		}
		return run.apply(ctx, q, e.UID, e.Generation, e.desired(org, w.ScriptName, w.Settings.LimitsOrZero().CPUMs))
	})
	return e, err
}

// DeleteEndpoint deletes the endpoint the binding names. A supplied reservation still activated
// with it refuses the delete (destroy the activation first); a Host-minted one is deactivated and
// keeps the endpoint as its witness. Its phases: mark deleting and plan (one transaction), delete
// the route and confirm its absence (backend calls), commit (close the attestation).
func (s *Service) DeleteEndpoint(ctx context.Context, m *ownership.Mutation, org auth.Organization, space, name string) (ownership.Response, error) {
	var e Endpoint
	var run *effects
	err := m.Tx(ctx, func(tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		uid := m.Current.UID
		var err error
		// Read first to learn the reservation, then lock in the documented order: the
		// reservation, then the endpoint.
		if e, err = readEndpoint(ctx, q, org.ID, &uid, space, name); err != nil {
			return err
		}
		run = s.deleteEffects(m, org.ID, dbsqlc.ResourceKindWorkerEndpoint, e.UID, e.Placement)
		if err := ownership.CheckBrake(ctx, tx, org.ID, space, e.WorkerName); err != nil {
			return err
		}
		if e.Status == dbsqlc.ResourceStatusDeleted {
			return nil
		}
		if e, err = s.markEndpointDeleting(ctx, tx, m, org, e); err != nil {
			return err
		}
		return run.remove(ctx, q)
	})
	if err != nil {
		return ownership.Response{}, err
	}
	if err := run.perform(ctx, deleteUnconfirmed); err != nil {
		return ownership.Response{}, err
	}
	return run.commit(ctx, func(tx pgx.Tx) (ownership.Response, error) {
		return tombstoneEndpoint(ctx, dbsqlc.New(tx), m, org, e)
	})
}

// markEndpointDeleting is the endpoint delete's own part of its plan transaction: a supplied
// reservation still activated with the endpoint refuses the delete; a Host-minted one is
// deactivated; then the endpoint, locked after the reservation in the documented order, is
// marked deleting.
func (s *Service) markEndpointDeleting(ctx context.Context, tx pgx.Tx, m *ownership.Mutation, org auth.Organization, e Endpoint) (Endpoint, error) {
	q := dbsqlc.New(tx)
	r, _, err := s.Reservations.Get(ctx, tx, org, e.OriginReservationID)
	if err != nil && !apierr.Is(err, apierr.NotFound) {
		return Endpoint{}, err
	}
	activatedHere := err == nil && r.Status == dbsqlc.ReservationStatusActivated && r.EndpointUID != nil && *r.EndpointUID == e.UID
	if activatedHere && !e.HostMinted {
		return Endpoint{}, apierr.New(apierr.EndpointActivated, "endpoint %s/%s is activated on reservation %q: destroy the activation (takoform_worker_endpoint_activation) first", e.Space, e.Name, r.ID).
			With("reservationId", r.ID)
	}
	if activatedHere {
		if _, err := s.Reservations.Deactivate(ctx, tx, org.ID, r.ID); err != nil {
			return Endpoint{}, err
		}
	}
	e, err = lockEndpoint(ctx, q, org.ID, &e.UID, e.Space, e.Name)
	if err != nil {
		return Endpoint{}, err
	}
	if e.Status != dbsqlc.ResourceStatusDeleting {
		if err := e.setStatus(ctx, q, m.Operation, dbsqlc.ResourceStatusDeleting); err != nil {
			return Endpoint{}, err
		}
	}
	return e, nil
}

// tombstoneEndpoint is the endpoint delete's own part of its commit transaction, after the
// record: the endpoint deleted.
func tombstoneEndpoint(ctx context.Context, q *dbsqlc.Queries, m *ownership.Mutation, org auth.Organization, e Endpoint) (ownership.Response, error) {
	cur, err := lockEndpoint(ctx, q, org.ID, &e.UID, e.Space, e.Name)
	if err != nil {
		return ownership.Response{}, err
	}
	if cur.Status != dbsqlc.ResourceStatusDeleted {
		if err := cur.setStatus(ctx, q, m.Operation, dbsqlc.ResourceStatusDeleted); err != nil {
			return ownership.Response{}, err
		}
		if cur, err = readEndpoint(ctx, q, org.ID, &e.UID, e.Space, e.Name); err != nil {
			return ownership.Response{}, err
		}
	}
	return ownership.Answer(false, cur.Project("").JSON(), uuid.Nil), nil
}
