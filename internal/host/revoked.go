package host

import (
	"context"
	"errors"
	"fmt"
	"net/url"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/resource"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// letGoOfRevoked undoes what stands on revoked custom domains (SPEC 3.7: "a domain that changes
// hands is let go"): for each reservation holding a name on one, in the destroy order and each
// under its owner's token, as the owner's own destroy would, the activation, then the endpoint
// (its route removed under the normal fences), then the reservation, once its attestation closed.
// Each is an owned DELETE through the ownership protocol, so the owner's later destroy replays the
// answer, and a fence not met yet (a route still propagating) waits for a later pass. It counts
// the objects it let go.
func (h *Host) letGoOfRevoked(ctx context.Context) (int64, error) {
	holds, err := dbsqlc.New(h.DB).CustomDomainRevokedHolds(ctx)
	if err != nil {
		return 0, fmt.Errorf("revoked custom domains: %w", err)
	}
	var n int64
	var errs []error
	for _, r := range holds {
		org := auth.Organization{ID: r.OrganizationID, Name: r.OrganizationName}
		// A name the organization verified again (its exact name after the wildcard it stood under
		// was revoked) is still its own: the reservation is recorded under that claim and kept.
		claim, err := reservation.CoveringClaim(ctx, h.DB, org.ID, r.Hostname)
		if err != nil {
			errs = append(errs, fmt.Errorf("reservation %s: %w", r.ReservationID, err))
			continue
		}
		if claim != "" {
			if _, err := dbsqlc.New(h.DB).ReservationCustomDomainRepoint(ctx, dbsqlc.ReservationCustomDomainRepointParams{
				OrganizationID: org.ID, ID: r.ReservationID, CustomDomain: &claim}); err != nil {
				errs = append(errs, fmt.Errorf("reservation %s: %w", r.ReservationID, err))
			}
			continue
		}
		resPath := "/v1/worker-endpoint-origin-reservations/" + url.PathEscape(r.ReservationID)
		if r.ReservationStatus == dbsqlc.ReservationStatusActivated && r.ActivationToken != "" {
			in := h.revokedIntent(org, reservation.ActivationKind, r.ReservationID, r.ActivationToken, resPath+"/activation", "takoform_worker_endpoint_activation")
			if _, err := h.Owners.Delete(ctx, in, func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
				return h.Resources.Deactivate(ctx, m, org, r.ReservationID)
			}); err != nil {
				errs = append(errs, fmt.Errorf("deactivate reservation %s: %w", r.ReservationID, err))
				continue
			}
			n++
		}
		if r.EndpointSpace != nil && r.EndpointToken != "" {
			space, name := *r.EndpointSpace, *r.EndpointName
			in := h.revokedIntent(org, resource.EndpointKind, space+"/"+name, r.EndpointToken,
				"/v1/spaces/"+url.PathEscape(space)+"/worker-endpoints/"+url.PathEscape(name), resource.EndpointResourceType)
			if _, err := h.Owners.Delete(ctx, in, func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
				return h.Resources.DeleteEndpoint(ctx, m, org, space, name)
			}); err != nil {
				errs = append(errs, fmt.Errorf("delete endpoint %s/%s: %w", space, name, err))
				continue
			}
			n++
		}
		in := h.revokedIntent(org, reservation.Kind, r.ReservationID, r.ReservationToken, resPath, reservation.ResourceType)
		_, err = h.Owners.Delete(ctx, in, func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
			return h.Reservations.Delete(ctx, m, org, r.ReservationID)
		})
		var refusal *apierr.Error
		switch {
		case err == nil:
			n++
		case errors.As(err, &refusal) && refusal.Code == apierr.ReleaseFenced:
			// The endpoint's attestation is still open: a later pass releases it.
		default:
			errs = append(errs, fmt.Errorf("release reservation %s: %w", r.ReservationID, err))
		}
	}
	return n, errors.Join(errs...)
}

// revokedIntent is the owned DELETE the janitor sends on an owner's behalf.
func (h *Host) revokedIntent(org auth.Organization, kind, key, token, path, resourceType string) ownership.Intent {
	return ownership.Intent{OrganizationID: org.ID, Kind: kind, Key: key, Token: token, Method: "DELETE", Path: path,
		ResourceType: resourceType, ImportID: key}
}
