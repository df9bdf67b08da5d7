package server

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/resource"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// readOwned runs a read and adds the owning token of key. Reads take no lock and write nothing.
func (s *Server) readOwned(c echo.Context, kind, key string, read func(ctx context.Context, token string) ([]byte, error)) error {
	ctx := c.Request().Context()
	org := principal(c).Organization
	tokens, err := ownership.Tokens(ctx, s.cfg.DB, org.ID, kind, []string{key})
	if err != nil {
		return err
	}
	body, err := read(ctx, tokens[key])
	if err != nil {
		return err
	}
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, body)
}

func createdStatus(created bool) int {
	if created {
		return http.StatusCreated
	}
	return http.StatusOK
}

func (s *Server) getWorker(c echo.Context) error {
	space, name := c.Param("space"), c.Param("name")
	return s.readOwned(c, resource.WorkerKind, space+"/"+name, func(ctx context.Context, token string) ([]byte, error) {
		w, err := s.resources.GetWorker(ctx, s.cfg.DB, principal(c).Organization, space, name)
		return w.Project(token).JSON(), err
	})
}

func (s *Server) putWorker(c echo.Context) error {
	space, name := c.Param("space"), c.Param("name")
	org := principal(c).Organization
	var spec resource.WorkerSpec
	return s.ownedPut(c, resource.WorkerKind, space+"/"+name, resource.WorkerResourceType, &spec,
		func() *ownership.BrakeScope { return &ownership.BrakeScope{Space: space, Worker: name} },
		func(ctx context.Context, m *ownership.Mutation, _ string) (ownership.Response, error) {
			return s.resources.PutWorker(ctx, m, org, space, name, spec)
		})
}

func (s *Server) deleteWorker(c echo.Context) error {
	space, name := c.Param("space"), c.Param("name")
	org := principal(c).Organization
	return s.ownedDelete(c, resource.WorkerKind, space+"/"+name, resource.WorkerResourceType,
		&ownership.BrakeScope{Space: space, Worker: name},
		func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
			return s.resources.DeleteWorker(ctx, m, org, space, name)
		})
}

func (s *Server) getEndpoint(c echo.Context) error {
	space, name := c.Param("space"), c.Param("name")
	return s.readOwned(c, resource.EndpointKind, space+"/"+name, func(ctx context.Context, token string) ([]byte, error) {
		e, err := s.resources.GetEndpoint(ctx, s.cfg.DB, principal(c).Organization, space, name)
		return e.Project(token).JSON(), err
	})
}

func (s *Server) putEndpoint(c echo.Context) error {
	space, name := c.Param("space"), c.Param("name")
	org := principal(c).Organization
	var spec resource.EndpointSpec
	return s.ownedPut(c, resource.EndpointKind, space+"/"+name, resource.EndpointResourceType, &spec,
		func() *ownership.BrakeScope { return &ownership.BrakeScope{Space: space, Worker: spec.Worker} },
		func(ctx context.Context, m *ownership.Mutation, _ string) (ownership.Response, error) {
			return s.resources.PutEndpoint(ctx, m, org, space, name, spec)
		})
}

func (s *Server) deleteEndpoint(c echo.Context) error {
	space, name := c.Param("space"), c.Param("name")
	org := principal(c).Organization
	return s.ownedDelete(c, resource.EndpointKind, space+"/"+name, resource.EndpointResourceType, nil,
		func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
			return s.resources.DeleteEndpoint(ctx, m, org, space, name)
		})
}

// ActivationRequest is the body of PUT .../activation.
type ActivationRequest struct {
	EndpointUID string `json:"endpointUid"`
}

const (
	activationKind         = "worker-endpoint-activation"
	activationResourceType = "takoform_worker_endpoint_activation"
)

func (s *Server) putActivation(c echo.Context) error {
	id := c.Param("reservationId")
	if err := reservation.CheckID(id); err != nil {
		return err
	}
	org := principal(c).Organization
	var req ActivationRequest
	return s.ownedPut(c, activationKind, id, activationResourceType, &req, nil,
		func(ctx context.Context, m *ownership.Mutation, _ string) (ownership.Response, error) {
			endpointUID, err := uuid.Parse(req.EndpointUID)
			if err != nil {
				return ownership.Response{}, apierr.New(apierr.InvalidRequest, "endpointUid must be an endpoint's uid")
			}
			return s.resources.Activate(ctx, m, org, id, endpointUID)
		})
}

func (s *Server) deleteActivation(c echo.Context) error {
	id := c.Param("reservationId")
	if err := reservation.CheckID(id); err != nil {
		return err
	}
	org := principal(c).Organization
	return s.ownedDelete(c, activationKind, id, activationResourceType, nil,
		func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
			return s.resources.Deactivate(ctx, m, org, id)
		})
}

// AttestationView is the body of GET /v1/deletion-attestations/{uid}.
type AttestationView struct {
	UID          string  `json:"uid"`
	ResourceKind string  `json:"resourceKind"`
	Status       string  `json:"status"`
	OperationID  *string `json:"operationId"`
	OpenedAt     string  `json:"openedAt"`
	ClosedAt     *string `json:"closedAt"`
}

func (s *Server) getAttestation(c echo.Context) error {
	uid, err := uuid.Parse(c.Param("uid"))
	if err != nil {
		return apierr.New(apierr.NotFound, "no deletion attestation %q", c.Param("uid"))
	}
	row, err := dbsqlc.New(s.cfg.DB).AttestationGet(c.Request().Context(), dbsqlc.AttestationGetParams{UID: uid, OrganizationID: principal(c).Organization.ID})
	if errors.Is(err, pgx.ErrNoRows) {
		return apierr.New(apierr.NotFound, "no deletion attestation %s", uid)
	}
	if err != nil {
		return err
	}
	v := AttestationView{UID: row.UID.String(), ResourceKind: row.ResourceKind, Status: row.Status, OpenedAt: row.OpenedAt.UTC().Format(time.RFC3339)}
	if row.OperationID != nil {
		id := row.OperationID.String()
		v.OperationID = &id
	}
	// A route's attestation closes when its propagation window ends (SPEC 8), which the
	// janitor writes down later: until then the window's end is when it closed.
	if closed := row.ClosedAt; row.Status == "closed" && (closed != nil || row.ClosesAt != nil) {
		if closed == nil {
			closed = row.ClosesAt
		}
		t := closed.UTC().Format(time.RFC3339)
		v.ClosedAt = &t
	}
	return c.JSON(http.StatusOK, v)
}

// OperationView is the body of GET /v1/operations/{id}.
type OperationView struct {
	ID         string       `json:"id"`
	Kind       string       `json:"kind"`
	Key        string       `json:"key"`
	Method     string       `json:"method"`
	Status     string       `json:"status"`
	Code       *string      `json:"code"`
	Replayed   bool         `json:"replayed"`
	StartedAt  string       `json:"startedAt"`
	FinishedAt *string      `json:"finishedAt"`
	Effects    []EffectView `json:"effects"`
}

// EffectView is one backend effect of an operation.
type EffectView struct {
	ID           string  `json:"id"`
	DeploymentID string  `json:"deploymentId"`
	ResourceKind string  `json:"resourceKind"`
	ResourceUID  string  `json:"resourceUid"`
	Action       string  `json:"action"`
	Status       string  `json:"status"`
	Detail       *string `json:"detail"`
}

func (s *Server) getOperation(c echo.Context) error {
	ctx := c.Request().Context()
	id, err := uuid.Parse(c.Param("id"))
	if err != nil {
		return apierr.New(apierr.NotFound, "no operation %q", c.Param("id"))
	}
	q := dbsqlc.New(s.cfg.DB)
	row, err := q.OperationGet(ctx, dbsqlc.OperationGetParams{ID: id, OrganizationID: principal(c).Organization.ID})
	if errors.Is(err, pgx.ErrNoRows) {
		return apierr.New(apierr.NotFound, "no operation %s", id)
	}
	if err != nil {
		return err
	}
	v := OperationView{ID: row.ID.String(), Kind: row.Kind, Key: row.ExternalKey, Method: row.Method, Status: row.Status,
		Code: row.Code, Replayed: row.Replayed, StartedAt: row.StartedAt.UTC().Format(time.RFC3339Nano), Effects: []EffectView{}}
	if row.FinishedAt != nil {
		t := row.FinishedAt.UTC().Format(time.RFC3339Nano)
		v.FinishedAt = &t
	}
	effects, err := q.OperationEffects(ctx, id)
	if err != nil {
		return err
	}
	for _, e := range effects {
		v.Effects = append(v.Effects, EffectView{ID: e.ID.String(), DeploymentID: e.DeploymentID.String(), ResourceKind: e.ResourceKind,
			ResourceUID: e.ResourceUID.String(), Action: e.Action, Status: e.Status, Detail: e.Detail})
	}
	return c.JSON(http.StatusOK, v)
}
