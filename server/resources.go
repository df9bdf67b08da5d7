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
	"github.com/takoform/terraform-provider-takoform/internal/store"
)

// readOwned runs a read in a transaction and adds the owning token of key.
func (s *Server) readOwned(c echo.Context, kind, key string, read func(ctx context.Context, tx pgx.Tx, token string) ([]byte, error)) error {
	ctx := c.Request().Context()
	org := principal(c).Organization
	var body []byte
	err := store.WithTx(ctx, s.cfg.DB, func(tx pgx.Tx) error {
		tokens, err := ownership.Tokens(ctx, tx, org.ID, kind, []string{key})
		if err != nil {
			return err
		}
		body, err = read(ctx, tx, tokens[key])
		return err
	})
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
	return s.readOwned(c, resource.WorkerKind, space+"/"+name, func(ctx context.Context, tx pgx.Tx, token string) ([]byte, error) {
		w, err := s.resources.GetWorker(ctx, tx, principal(c).Organization, space, name)
		return w.Project(token).JSON(), err
	})
}

func (s *Server) putWorker(c echo.Context) error {
	space, name := c.Param("space"), c.Param("name")
	org := principal(c).Organization
	var spec resource.WorkerSpec
	return s.ownedPut(c, resource.WorkerKind, space+"/"+name, resource.WorkerResourceType, &spec,
		func(ctx context.Context, m *ownership.Mutation, token string) (ownership.Response, error) {
			w, created, err := s.resources.PutWorker(ctx, m, org, space, name, spec)
			if err != nil {
				return ownership.Response{}, err
			}
			return ownership.Response{Status: createdStatus(created), Body: w.Project(token).JSON(), UID: w.UID}, nil
		})
}

func (s *Server) deleteWorker(c echo.Context) error {
	space, name := c.Param("space"), c.Param("name")
	org := principal(c).Organization
	return s.ownedDelete(c, resource.WorkerKind, space+"/"+name, resource.WorkerResourceType,
		func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
			w, err := s.resources.DeleteWorker(ctx, m, org, space, name)
			if err != nil {
				return ownership.Response{}, err
			}
			return ownership.Response{Status: http.StatusOK, Body: w.Project("").JSON(), UID: w.UID}, nil
		})
}

func (s *Server) getEndpoint(c echo.Context) error {
	space, name := c.Param("space"), c.Param("name")
	return s.readOwned(c, resource.EndpointKind, space+"/"+name, func(ctx context.Context, tx pgx.Tx, token string) ([]byte, error) {
		e, err := s.resources.GetEndpoint(ctx, tx, principal(c).Organization, space, name)
		return e.Project(token).JSON(), err
	})
}

func (s *Server) putEndpoint(c echo.Context) error {
	space, name := c.Param("space"), c.Param("name")
	org := principal(c).Organization
	var spec resource.EndpointSpec
	return s.ownedPut(c, resource.EndpointKind, space+"/"+name, resource.EndpointResourceType, &spec,
		func(ctx context.Context, m *ownership.Mutation, token string) (ownership.Response, error) {
			e, created, err := s.resources.PutEndpoint(ctx, m, org, space, name, spec)
			if err != nil {
				return ownership.Response{}, err
			}
			return ownership.Response{Status: createdStatus(created), Body: e.Project(token).JSON(), UID: e.UID}, nil
		})
}

func (s *Server) deleteEndpoint(c echo.Context) error {
	space, name := c.Param("space"), c.Param("name")
	org := principal(c).Organization
	return s.ownedDelete(c, resource.EndpointKind, space+"/"+name, resource.EndpointResourceType,
		func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
			e, err := s.resources.DeleteEndpoint(ctx, m, org, space, name)
			if err != nil {
				return ownership.Response{}, err
			}
			return ownership.Response{Status: http.StatusOK, Body: e.Project("").JSON(), UID: e.UID}, nil
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
	return s.ownedPut(c, activationKind, id, activationResourceType, &req,
		func(ctx context.Context, m *ownership.Mutation, _ string) (ownership.Response, error) {
			endpointUID, err := uuid.Parse(req.EndpointUID)
			if err != nil {
				return ownership.Response{}, apierr.New(apierr.InvalidRequest, "endpointUid must be an endpoint's uid")
			}
			r, err := s.resources.Activate(ctx, m, org, id, endpointUID)
			if err != nil {
				return ownership.Response{}, err
			}
			return ownership.Response{Status: createdStatus(m.Current == nil || m.Current.Pending), Body: r.Project("").JSON(), UID: r.UID}, nil
		})
}

func (s *Server) deleteActivation(c echo.Context) error {
	id := c.Param("reservationId")
	if err := reservation.CheckID(id); err != nil {
		return err
	}
	org := principal(c).Organization
	return s.ownedDelete(c, activationKind, id, activationResourceType,
		func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
			r, err := s.resources.Deactivate(ctx, m, org, id)
			if err != nil {
				return ownership.Response{}, err
			}
			return ownership.Response{Status: http.StatusOK, Body: r.Project("").JSON(), UID: r.UID}, nil
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
	var v AttestationView
	var op *uuid.UUID
	var opened time.Time
	var closed *time.Time
	err = s.cfg.DB.QueryRow(c.Request().Context(), store.Q("AttestationGet"), pgx.NamedArgs{"uid": uid, "organization_id": principal(c).Organization.ID}).
		Scan(&v.UID, &v.ResourceKind, &v.Status, &op, &opened, &closed)
	if errors.Is(err, pgx.ErrNoRows) {
		return apierr.New(apierr.NotFound, "no deletion attestation %s", uid)
	}
	if err != nil {
		return err
	}
	v.OpenedAt = opened.UTC().Format(time.RFC3339)
	if op != nil {
		id := op.String()
		v.OperationID = &id
	}
	if closed != nil {
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
	var v OperationView
	var started time.Time
	var finished *time.Time
	err = s.cfg.DB.QueryRow(ctx, store.Q("OperationGet"), pgx.NamedArgs{"id": id, "organization_id": principal(c).Organization.ID}).
		Scan(&v.ID, &v.Kind, &v.Key, &v.Method, &v.Status, &v.Code, &v.Replayed, &started, &finished)
	if errors.Is(err, pgx.ErrNoRows) {
		return apierr.New(apierr.NotFound, "no operation %s", id)
	}
	if err != nil {
		return err
	}
	v.StartedAt = started.UTC().Format(time.RFC3339Nano)
	if finished != nil {
		t := finished.UTC().Format(time.RFC3339Nano)
		v.FinishedAt = &t
	}
	rows, err := s.cfg.DB.Query(ctx, store.Q("OperationEffects"), pgx.NamedArgs{"operation_id": id})
	if err != nil {
		return err
	}
	v.Effects = []EffectView{}
	var e EffectView
	if _, err := pgx.ForEachRow(rows, []any{&e.ID, &e.DeploymentID, &e.ResourceKind, &e.ResourceUID, &e.Action, &e.Status, &e.Detail}, func() error {
		v.Effects = append(v.Effects, e)
		return nil
	}); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, v)
}
