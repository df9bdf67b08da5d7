package resource

import (
	"context"
	"errors"
	"fmt"
	"net/url"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/wire"
)

// EndpointSpec is the body of PUT /v1/spaces/{space}/worker-endpoints/{name}.
type EndpointSpec struct {
	Worker              string  `json:"worker"`
	OriginReservationID *string `json:"originReservationId,omitempty"`
	OfferingID          *string `json:"offeringId,omitempty"`
}

// Endpoint is one stored endpoint with its derived deployment state.
type Endpoint struct {
	UID                 uuid.UUID
	OrganizationID      string
	Space               string
	Name                string
	Generation          int64
	Revision            int64
	WorkerUID           uuid.UUID
	WorkerName          string
	OriginReservationID string
	HostMinted          bool
	CanonicalOrigin     string
	Hostname            string
	Placement           Placement
	Status              string
	OperationID         uuid.UUID
	// Present is resource_present: false for a row whose create was refused.
	Present          bool
	DeploymentStatus string
}

// Ready is readiness as derived now.
func (e Endpoint) Ready() bool { return e.Status == "live" && e.DeploymentStatus == "active" }

// WorkerRef names an endpoint's worker in its projection.
type WorkerRef struct {
	UID  string `json:"uid"`
	Name string `json:"name"`
}

// EndpointProjection is the public view of an endpoint.
type EndpointProjection struct {
	UID                 string      `json:"uid"`
	Space               string      `json:"space"`
	Name                string      `json:"name"`
	Generation          int64       `json:"generation"`
	Revision            int64       `json:"revision"`
	Worker              WorkerRef   `json:"worker"`
	OriginReservationID string      `json:"originReservationId"`
	HostMinted          bool        `json:"hostMinted"`
	Hostname            string      `json:"hostname"`
	URL                 string      `json:"url"`
	Ready               bool        `json:"ready"`
	Conditions          []Condition `json:"conditions"`
	OfferingID          string      `json:"offeringId"`
	OwnershipToken      *string     `json:"ownershipToken"`
}

// Project renders e with its ownership token.
func (e Endpoint) Project(token string) EndpointProjection {
	p := EndpointProjection{
		UID: e.UID.String(), Space: e.Space, Name: e.Name, Generation: e.Generation, Revision: e.Revision,
		Worker: WorkerRef{UID: e.WorkerUID.String(), Name: e.WorkerName}, OriginReservationID: e.OriginReservationID,
		HostMinted: e.HostMinted, Hostname: e.Hostname, URL: e.CanonicalOrigin + "/", Ready: e.Ready(),
		Conditions: readyCondition(e.Status, e.DeploymentStatus), OfferingID: e.Placement.OfferingID,
	}
	if token != "" {
		p.OwnershipToken = &token
	}
	return p
}

// JSON is the projection's bytes.
func (p EndpointProjection) JSON() []byte { return wire.JSON(p) }

func scanEndpoint(row pgx.Row) (Endpoint, error) {
	var e Endpoint
	err := row.Scan(&e.UID, &e.OrganizationID, &e.Space, &e.Name, &e.Generation, &e.Revision, &e.WorkerUID, &e.WorkerName,
		&e.OriginReservationID, &e.HostMinted, &e.CanonicalOrigin, &e.Hostname, &e.Placement.OfferingID,
		&e.Placement.OfferingDigest, &e.Placement.Pack, &e.Placement.Installation, &e.Status, &e.OperationID,
		&e.Present, &e.DeploymentStatus)
	return e, err
}

func loadEndpoint(ctx context.Context, tx pgx.Tx, org string, uid *uuid.UUID, space, name string) (Endpoint, error) {
	e, err := scanEndpoint(tx.QueryRow(ctx, store.Q("EndpointSelect"), pgx.NamedArgs{"organization_id": org, "uid": uid, "space": space, "name": name}))
	if errors.Is(err, pgx.ErrNoRows) {
		return Endpoint{}, apierr.New(apierr.NotFound, "no endpoint %s/%s", space, name)
	}
	if err != nil {
		return Endpoint{}, fmt.Errorf("resource: load endpoint: %w", err)
	}
	return e, nil
}

// GetEndpoint reads the present endpoint space/name.
func (s *Service) GetEndpoint(ctx context.Context, tx pgx.Tx, org auth.Organization, space, name string) (Endpoint, error) {
	e, err := loadEndpoint(ctx, tx, org.ID, nil, space, name)
	if err != nil {
		return Endpoint{}, err
	}
	if !e.Present {
		return Endpoint{}, apierr.New(apierr.NotFound, "no endpoint %s/%s", space, name)
	}
	return e, nil
}

func (e *Endpoint) setStatus(ctx context.Context, tx pgx.Tx, m *ownership.Mutation, status string) error {
	var revision int64
	err := tx.QueryRow(ctx, store.Q("EndpointSetStatus"), pgx.NamedArgs{"uid": e.UID, "revision": e.Revision, "status": status, "operation_id": m.Operation}).Scan(&revision)
	if errors.Is(err, pgx.ErrNoRows) {
		return apierr.New(apierr.IntentInProgress, "the endpoint changed during this request; retry")
	}
	if err != nil {
		return fmt.Errorf("resource: endpoint status: %w", err)
	}
	e.Status, e.Revision, e.OperationID = status, revision, m.Operation
	return nil
}

func (e Endpoint) incarnation() reservation.EndpointIncarnation {
	return reservation.EndpointIncarnation{UID: e.UID, Revision: e.Revision, WorkerUID: e.WorkerUID, CanonicalOrigin: e.CanonicalOrigin, Placement: e.Placement}
}

// readyWorker loads the worker named space/name, proves it Ready as derived now, and returns it
// with its active deployment's placement, for binding and minting.
func readyWorker(ctx context.Context, tx pgx.Tx, org, space, name string) (Worker, reservation.WorkerIncarnation, error) {
	w, err := loadWorker(ctx, tx, org, nil, space, name)
	if err != nil {
		return Worker{}, reservation.WorkerIncarnation{}, err
	}
	if !w.Ready() {
		return Worker{}, reservation.WorkerIncarnation{}, apierr.New(apierr.WorkerNotReady, "worker %s/%s is not Ready (%s); apply it first", space, name, readyCondition(w.Status, w.DeploymentStatus)[0].Reason)
	}
	inc := reservation.WorkerIncarnation{OrganizationID: org, UID: w.UID, Revision: w.Revision, Space: space, Name: name}
	err = tx.QueryRow(ctx, store.Q("DeploymentActivePlacement"), pgx.NamedArgs{"resource_uid": w.UID}).
		Scan(&inc.Placement.OfferingID, &inc.Placement.OfferingDigest, &inc.Placement.Pack, &inc.Placement.Installation)
	if errors.Is(err, pgx.ErrNoRows) {
		return Worker{}, reservation.WorkerIncarnation{}, apierr.New(apierr.WorkerNotReady, "worker %s/%s has no active deployment", space, name)
	}
	if err != nil {
		return Worker{}, reservation.WorkerIncarnation{}, fmt.Errorf("resource: worker placement: %w", err)
	}
	return w, inc, nil
}

func hostOf(origin string) string {
	u, err := url.Parse(origin)
	if err != nil {
		return origin
	}
	return u.Hostname()
}

// PutEndpoint creates an endpoint (binding its supplied reservation, or minting one and
// activating it), resumes an interrupted create, or answers an unchanged one. An endpoint never
// changes in place: its worker, origin and placement are its identity.
func (s *Service) PutEndpoint(ctx context.Context, m *ownership.Mutation, org auth.Organization, space, name string, spec EndpointSpec) (Endpoint, bool, error) {
	if !namePattern.MatchString(space) || !namePattern.MatchString(name) || !namePattern.MatchString(spec.Worker) {
		return Endpoint{}, false, apierr.New(apierr.InvalidRequest, "space, name and worker must each match %s", namePattern)
	}
	if spec.OriginReservationID != nil {
		if err := reservation.CheckID(*spec.OriginReservationID); err != nil {
			return Endpoint{}, false, err
		}
	}
	offering, inst, err := s.selectOffering(org, catalog.KindEndpoint, spec.OfferingID)
	if err != nil {
		return Endpoint{}, false, err
	}
	placement := placementOf(offering)
	mut, err := s.mutator(placement)
	if err != nil {
		return Endpoint{}, false, err
	}
	b, err := backend.For(inst)
	if err != nil {
		return Endpoint{}, false, err
	}
	var e Endpoint
	var work *planned
	created := m.Current == nil || m.Current.Pending
	err = m.Tx(ctx, func(tx pgx.Tx) error {
		if err := brake(ctx, tx); err != nil {
			return err
		}
		if m.Current != nil {
			uid := m.Current.UID
			var err error
			if e, err = loadEndpoint(ctx, tx, org.ID, &uid, space, name); err != nil {
				return err
			}
			if e.Status == "deleting" || e.Status == "deleted" {
				return apierr.New(apierr.Conflict, "endpoint %s/%s is being deleted; finish the delete first", space, name)
			}
			wantReservation := e.OriginReservationID
			if spec.OriginReservationID != nil {
				wantReservation = *spec.OriginReservationID
			}
			if spec.Worker != e.WorkerName || wantReservation != e.OriginReservationID || (spec.OriginReservationID == nil) != e.HostMinted || placement != e.Placement {
				return apierr.New(apierr.Immutable, "endpoint %s/%s cannot change its worker, reservation or offering in place: replace it", space, name)
			}
			if e.Status == "creating" {
				// Resuming a create that did not finish: prove the worker again and re-take the
				// reservation, which may have aged out meanwhile (a minted one is revived).
				w, inc, err := readyWorker(ctx, tx, org.ID, space, spec.Worker)
				if err != nil {
					return err
				}
				if w.UID != e.WorkerUID {
					return apierr.New(apierr.Immutable, "worker %s/%s was replaced while endpoint %s/%s was being created: replace the endpoint", space, spec.Worker, space, name)
				}
				if e.HostMinted {
					_, err = s.Reservations.Mint(ctx, tx, inc, b)
				} else {
					_, err = s.Reservations.Bind(ctx, tx, e.OriginReservationID, inc)
				}
				if err != nil {
					return err
				}
			}
			if e.DeploymentStatus != "active" {
				var script string
				if err := tx.QueryRow(ctx, store.Q("WorkerScriptName"), pgx.NamedArgs{"uid": e.WorkerUID}).Scan(&script); err != nil {
					return fmt.Errorf("resource: endpoint's worker: %w", err)
				}
				pl, err := plan(ctx, tx, m, org.ID, "endpoint", e.UID, e.Generation, placement, e.desired(script))
				work = &pl
				return err
			}
			return nil
		}
		w, inc, err := readyWorker(ctx, tx, org.ID, space, spec.Worker)
		if err != nil {
			return err
		}
		if inc.Placement.Installation != placement.Installation {
			return apierr.New(apierr.PlacementDrift, "the endpoint offering runs on installation %s but worker %s/%s runs on %s", placement.Installation, space, spec.Worker, inc.Placement.Installation)
		}
		var r reservation.Reservation
		if spec.OriginReservationID != nil {
			r, err = s.Reservations.Bind(ctx, tx, *spec.OriginReservationID, inc)
		} else {
			r, err = s.Reservations.Mint(ctx, tx, inc, b)
		}
		if err != nil {
			return err
		}
		e = Endpoint{
			UID: uuid.New(), OrganizationID: org.ID, Space: space, Name: name, Generation: 1, Revision: 1,
			WorkerUID: w.UID, WorkerName: w.Name, OriginReservationID: r.ID, HostMinted: r.HostMinted,
			CanonicalOrigin: r.CanonicalOrigin, Hostname: hostOf(r.CanonicalOrigin), Placement: placement,
			Status: "creating", OperationID: m.Operation,
		}
		_, err = tx.Exec(ctx, store.Q("EndpointInsert"), pgx.NamedArgs{
			"uid": e.UID, "organization_id": org.ID, "space": space, "name": name, "worker_uid": w.UID, "worker_name": w.Name,
			"origin_reservation_id": r.ID, "host_minted": r.HostMinted, "canonical_origin": e.CanonicalOrigin, "hostname": e.Hostname,
			"offering_id": placement.OfferingID, "offering_digest": placement.OfferingDigest, "pack": placement.Pack,
			"installation": placement.Installation, "operation_id": m.Operation,
		})
		if store.IsUniqueViolation(err, "worker_endpoints_live_key") {
			return apierr.New(apierr.ResourceExists, "endpoint %s/%s already exists and is not owned by this token", space, name)
		}
		if err != nil {
			return fmt.Errorf("resource: create endpoint: %w", err)
		}
		if err := m.Bind(ctx, tx, e.UID); err != nil {
			return err
		}
		pl, err := plan(ctx, tx, m, org.ID, "endpoint", e.UID, e.Generation, placement, e.desired(w.ScriptName))
		work = &pl
		return err
	})
	if err != nil {
		return Endpoint{}, false, err
	}
	if work != nil {
		if err := s.dispatch(ctx, m, mut, *work); err != nil {
			return Endpoint{}, false, err
		}
	}
	err = m.Tx(ctx, func(tx pgx.Tx) error {
		uid := e.UID
		var err error
		if e, err = loadEndpoint(ctx, tx, org.ID, &uid, space, name); err != nil {
			return err
		}
		if e.Status == "creating" {
			if err := e.setStatus(ctx, tx, m, "live"); err != nil {
				return err
			}
		}
		if e.HostMinted {
			// mint -> bind -> create endpoint -> activate (SPEC 3.4).
			if _, err := s.Reservations.Activate(ctx, tx, org.ID, e.OriginReservationID, e.incarnation()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil && work != nil {
		// The create is refused after its route was applied: take the route down again so that
		// nothing is left answering for an endpoint that never existed.
		s.compensate(ctx, m, mut, e.UID)
	}
	return e, created, err
}

// compensate removes what a refused create left on the backend. Failure here is not fatal: the
// ledger records the refusal, and the next attempt or delete reconciles.
func (s *Service) compensate(ctx context.Context, m *ownership.Mutation, mut backend.Mutator, uid uuid.UUID) {
	ctx = context.WithoutCancel(ctx)
	var work []planned
	if err := m.Tx(ctx, func(tx pgx.Tx) error {
		var err error
		work, err = planDeletes(ctx, tx, m, backend.NativeRoute, uid)
		return err
	}); err != nil {
		return
	}
	for _, pl := range work {
		_ = s.dispatch(ctx, m, mut, pl)
	}
}

func (e Endpoint) desired(scriptName string) backend.Desired {
	return backend.Desired{Kind: backend.NativeRoute, NativeName: e.Hostname, ResourceUID: e.UID, ScriptName: scriptName, CanonicalOrigin: e.CanonicalOrigin}
}

// DeleteEndpoint deletes the endpoint the binding names. A supplied reservation still activated
// with it refuses the delete (destroy the activation first); a Host-minted one is deactivated
// first and keeps the endpoint as its witness.
func (s *Service) DeleteEndpoint(ctx context.Context, m *ownership.Mutation, org auth.Organization, space, name string) (Endpoint, error) {
	var e Endpoint
	var work []planned
	uid := m.Current.UID
	err := m.Tx(ctx, func(tx pgx.Tx) error {
		if err := brake(ctx, tx); err != nil {
			return err
		}
		var err error
		if e, err = loadEndpoint(ctx, tx, org.ID, &uid, space, name); err != nil {
			return err
		}
		if e.Status == "deleted" {
			return nil
		}
		r, err := s.Reservations.Get(ctx, tx, org, e.OriginReservationID)
		activatedHere := err == nil && r.Status == "activated" && r.EndpointUID != nil && *r.EndpointUID == e.UID
		if err != nil && !apierr.Is(err, apierr.NotFound) {
			return err
		}
		if activatedHere && !e.HostMinted {
			return apierr.New(apierr.EndpointActivated, "endpoint %s/%s is activated on reservation %q: destroy the activation first", space, name, r.ID).
				With("reservationId", r.ID)
		}
		if activatedHere {
			if _, err := s.Reservations.Deactivate(ctx, tx, org.ID, r.ID); err != nil {
				return err
			}
		}
		if e.Status != "deleting" {
			if err := e.setStatus(ctx, tx, m, "deleting"); err != nil {
				return err
			}
		}
		work, err = beginDelete(ctx, tx, m, org.ID, "endpoint", e.UID)
		return err
	})
	if err != nil || e.Status == "deleted" {
		return e, err
	}
	err = s.finishDelete(ctx, m, e.Placement, work, e.UID, func(tx pgx.Tx) error {
		var err error
		if e, err = loadEndpoint(ctx, tx, org.ID, &uid, space, name); err != nil {
			return err
		}
		return e.setStatus(ctx, tx, m, "deleted")
	})
	return e, err
}

// Activate activates a supplied reservation with the exact endpoint (SPEC 3.3, activation).
func (s *Service) Activate(ctx context.Context, m *ownership.Mutation, org auth.Organization, reservationID string, endpointUID uuid.UUID) (reservation.Reservation, error) {
	if err := reservation.CheckID(reservationID); err != nil {
		return reservation.Reservation{}, err
	}
	var r reservation.Reservation
	err := m.Tx(ctx, func(tx pgx.Tx) error {
		if err := brake(ctx, tx); err != nil {
			return err
		}
		e, err := loadEndpoint(ctx, tx, org.ID, &endpointUID, "", "")
		if err != nil {
			return apierr.New(apierr.NotFound, "no endpoint with uid %s", endpointUID)
		}
		if !e.Ready() {
			return apierr.New(apierr.ActivationMismatch, "endpoint %s/%s is not Ready (%s)", e.Space, e.Name, readyCondition(e.Status, e.DeploymentStatus)[0].Reason)
		}
		r, err = s.Reservations.Activate(ctx, tx, org.ID, reservationID, e.incarnation())
		return err
	})
	return r, err
}

// Deactivate ends a supplied reservation's activation, keeping the endpoint as its witness.
func (s *Service) Deactivate(ctx context.Context, m *ownership.Mutation, org auth.Organization, reservationID string) (reservation.Reservation, error) {
	if err := reservation.CheckID(reservationID); err != nil {
		return reservation.Reservation{}, err
	}
	var r reservation.Reservation
	err := m.Tx(ctx, func(tx pgx.Tx) error {
		if err := brake(ctx, tx); err != nil {
			return err
		}
		var err error
		r, err = s.Reservations.Deactivate(ctx, tx, org.ID, reservationID)
		return err
	})
	return r, err
}
