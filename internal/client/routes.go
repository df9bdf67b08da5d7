package client

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// One method per operation of api/openapi.yaml that the provider uses.

// Offerings lists the catalog visible to the key's organization.
func (c *Client) Offerings(ctx context.Context) ([]Offering, error) {
	var out struct {
		Offerings []Offering `json:"offerings"`
	}
	_, err := c.Do(ctx, Request{Method: http.MethodGet, Path: "/v1/offerings"}, &out)
	return out.Offerings, err
}

// OfferingKeepsLogs reports whether the workers of offering id keep a log on the Host: only
// those of a selfhost offering do (SPEC 4). The offerings are asked once per configuration (a
// failure is not remembered); ok is false when it cannot tell.
func (c *Client) OfferingKeepsLogs(ctx context.Context, id string) (keeps, ok bool) {
	o, ok := c.offering(ctx, id)
	return ok && o.Pack == "selfhost", ok
}

// OfferingCronDelivery is how offering id delivers cron ticks ("" when it runs none); ok is false
// when it cannot tell.
func (c *Client) OfferingCronDelivery(ctx context.Context, id string) (string, bool) {
	o, ok := c.offering(ctx, id)
	if !ok || o.CronDelivery == nil {
		return "", ok
	}
	return *o.CronDelivery, true
}

// OfferingBundleCeiling is the most a worker's bundle may hold on offering id, or on the one
// module-worker offering the organization is sold when id is empty (SPEC 3.6); ok is false when
// it cannot tell (the offerings cannot be read, or the Host names no ceiling).
func (c *Client) OfferingBundleCeiling(ctx context.Context, id string) (int64, bool) {
	o, ok := c.offering(ctx, id)
	if !ok || o.MaxBundleBytes == nil {
		return 0, false
	}
	return *o.MaxBundleBytes, true
}

// offering is offering id (or, with id empty, the only module-worker offering), from the
// offerings asked once per configuration (a failure is not remembered).
func (c *Client) offering(ctx context.Context, id string) (Offering, bool) {
	c.offeringsMu.Lock()
	defer c.offeringsMu.Unlock()
	if c.offerings == nil {
		offerings, err := c.Offerings(ctx)
		if err != nil {
			return Offering{}, false
		}
		c.offerings = offerings
	}
	var found []Offering
	for _, o := range c.offerings {
		if o.ID == id || (id == "" && o.Kind == "module-worker") {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		return Offering{}, false
	}
	return found[0], true
}

// Derive asks what a reservation would hold and whether the origin is free; it writes nothing.
func (c *Client) Derive(ctx context.Context, req DerivationRequest) (Derivation, error) {
	var out Derivation
	_, err := c.Do(ctx, Request{Method: http.MethodPost, Path: "/v1/worker-endpoint-origin-derivations", Body: req}, &out)
	return out, err
}

func reservationPath(id string) string {
	return "/v1/worker-endpoint-origin-reservations/" + url.PathEscape(id)
}

// GetReservation reads a reservation (Host-minted ones too).
func (c *Client) GetReservation(ctx context.Context, id string) (Reservation, error) {
	var out Reservation
	_, err := c.Do(ctx, Request{Method: http.MethodGet, Path: reservationPath(id)}, &out)
	return out, err
}

// PutReservation creates a reservation under token.
func (c *Client) PutReservation(ctx context.Context, id, token string, req ReservationRequest) (Reservation, Response, error) {
	var out Reservation
	resp, err := c.Do(ctx, Request{Method: http.MethodPut, Path: reservationPath(id), Body: req, OwnershipToken: token}, &out)
	return out, resp, err
}

// DeleteReservation releases a reservation under the four fences.
func (c *Client) DeleteReservation(ctx context.Context, id, token string) (Reservation, error) {
	var out Reservation
	_, err := c.Do(ctx, Request{Method: http.MethodDelete, Path: reservationPath(id), OwnershipToken: token}, &out)
	return out, err
}

// customDomainPath is the path of one custom domain ("*" travels escaped).
func customDomainPath(hostname string) string {
	return "/v1/custom-domains/" + strings.ReplaceAll(url.PathEscape(hostname), "*", "%2A")
}

// GetCustomDomain reads a custom domain claim with its ownership token.
func (c *Client) GetCustomDomain(ctx context.Context, hostname string) (CustomDomain, error) {
	var out CustomDomain
	_, err := c.Do(ctx, Request{Method: http.MethodGet, Path: customDomainPath(hostname)}, &out)
	return out, err
}

// PutCustomDomain claims a custom domain under token; the Host looks its TXT record up at once.
func (c *Client) PutCustomDomain(ctx context.Context, hostname, token string) (CustomDomain, Response, error) {
	var out CustomDomain
	resp, err := c.Do(ctx, Request{Method: http.MethodPut, Path: customDomainPath(hostname), Body: map[string]any{}, OwnershipToken: token}, &out)
	return out, resp, err
}

// DeleteCustomDomain lets a claim go (refused while a reservation holds a name on it).
func (c *Client) DeleteCustomDomain(ctx context.Context, hostname, token string) (CustomDomain, error) {
	var out CustomDomain
	_, err := c.Do(ctx, Request{Method: http.MethodDelete, Path: customDomainPath(hostname), OwnershipToken: token}, &out)
	return out, err
}

// GetWorkerByUID reads the present worker with that UID (without its ownership token).
func (c *Client) GetWorkerByUID(ctx context.Context, uid string) (Worker, error) {
	var out Worker
	_, err := c.Do(ctx, Request{Method: http.MethodGet, Path: "/v1/workers/" + url.PathEscape(uid)}, &out)
	return out, err
}

// GetActivation reads an activated reservation with its activation's ownership token.
func (c *Client) GetActivation(ctx context.Context, reservationID string) (Reservation, error) {
	var out Reservation
	_, err := c.Do(ctx, Request{Method: http.MethodGet, Path: reservationPath(reservationID) + "/activation"}, &out)
	return out, err
}

// PutActivation activates a reservation with the endpoint recorded on it.
func (c *Client) PutActivation(ctx context.Context, reservationID, token, endpointUID string) (Reservation, Response, error) {
	var out Reservation
	resp, err := c.Do(ctx, Request{Method: http.MethodPut, Path: reservationPath(reservationID) + "/activation",
		Body: ActivationRequest{EndpointUID: endpointUID}, OwnershipToken: token}, &out)
	return out, resp, err
}

// DeleteActivation ends an activation; the endpoint stays the reservation's witness.
func (c *Client) DeleteActivation(ctx context.Context, reservationID, token string) (Reservation, error) {
	var out Reservation
	_, err := c.Do(ctx, Request{Method: http.MethodDelete, Path: reservationPath(reservationID) + "/activation", OwnershipToken: token}, &out)
	return out, err
}

func workerPath(space, name string) string {
	return "/v1/spaces/" + url.PathEscape(space) + "/workers/" + url.PathEscape(name)
}

// WorkerLogsURL is the address of a worker's log stream on the Host (GET, NDJSON; ?follow=true
// keeps it open), for a user's own HTTP client: it carries no credentials.
func (c *Client) WorkerLogsURL(space, name string) string {
	u := *c.base
	u.User = nil
	return u.JoinPath(workerPath(space, name), "logs").String()
}

// GetWorker reads a worker, readiness derived now.
// GetWorkerDigests reads a worker with its modules' digests and its bundle's size instead of its
// modules (a Host older than this release answers the modules, and no digests).
func (c *Client) GetWorkerDigests(ctx context.Context, space, name string) (Worker, error) {
	var out Worker
	_, err := c.Do(ctx, Request{Method: http.MethodGet, Path: workerPath(space, name), Query: url.Values{"modules": {"digests"}}}, &out)
	return out, err
}

func (c *Client) GetWorker(ctx context.Context, space, name string) (Worker, error) {
	var out Worker
	_, err := c.Do(ctx, Request{Method: http.MethodGet, Path: workerPath(space, name)}, &out)
	return out, err
}

// PutWorker creates a worker, or updates it at revision ifMatch (0 for a create).
func (c *Client) PutWorker(ctx context.Context, space, name, token string, ifMatch int64, spec WorkerSpec) (Worker, Response, error) {
	var out Worker
	resp, err := c.Do(ctx, Request{Method: http.MethodPut, Path: workerPath(space, name), Body: spec, OwnershipToken: token, IfMatch: ifMatch}, &out)
	return out, resp, err
}

// DeleteWorker deletes a worker.
func (c *Client) DeleteWorker(ctx context.Context, space, name, token string) (Worker, error) {
	var out Worker
	_, err := c.Do(ctx, Request{Method: http.MethodDelete, Path: workerPath(space, name), OwnershipToken: token}, &out)
	return out, err
}

func endpointPath(space, name string) string {
	return "/v1/spaces/" + url.PathEscape(space) + "/worker-endpoints/" + url.PathEscape(name)
}

// GetEndpoint reads an endpoint, readiness derived now.
func (c *Client) GetEndpoint(ctx context.Context, space, name string) (Endpoint, error) {
	var out Endpoint
	_, err := c.Do(ctx, Request{Method: http.MethodGet, Path: endpointPath(space, name)}, &out)
	return out, err
}

// PutEndpoint creates an endpoint (or resumes one whose route is not active).
func (c *Client) PutEndpoint(ctx context.Context, space, name, token string, ifMatch int64, spec EndpointSpec) (Endpoint, Response, error) {
	var out Endpoint
	resp, err := c.Do(ctx, Request{Method: http.MethodPut, Path: endpointPath(space, name), Body: spec, OwnershipToken: token, IfMatch: ifMatch}, &out)
	return out, resp, err
}

// DeleteEndpoint deletes an endpoint and confirms its route is gone.
func (c *Client) DeleteEndpoint(ctx context.Context, space, name, token string) (Endpoint, error) {
	var out Endpoint
	_, err := c.Do(ctx, Request{Method: http.MethodDelete, Path: endpointPath(space, name), OwnershipToken: token}, &out)
	return out, err
}

func preparationPath(orgID, operationID string) string {
	return "/v1/organizations/" + url.PathEscape(orgID) + "/worker-runtime-input-preparations/" + url.PathEscape(operationID)
}

// GetPreparation reads a runtime input by operation id.
func (c *Client) GetPreparation(ctx context.Context, operationID string) (Preparation, error) {
	org, err := c.OrganizationID(ctx)
	if err != nil {
		return Preparation{}, err
	}
	var out Preparation
	_, err = c.Do(ctx, Request{Method: http.MethodGet, Path: preparationPath(org, operationID)}, &out)
	return out, err
}

// PutPreparation seals a runtime input. The body carries the secret values.
func (c *Client) PutPreparation(ctx context.Context, operationID, token string, req PreparationRequest) (Preparation, Response, error) {
	org, err := c.OrganizationID(ctx)
	if err != nil {
		return Preparation{}, Response{}, err
	}
	var out Preparation
	resp, err := c.Do(ctx, Request{Method: http.MethodPut, Path: preparationPath(org, operationID), Body: req, OwnershipToken: token}, &out)
	return out, resp, err
}

// DeletePreparation aborts a runtime input (a settled one's values stay with its worker).
func (c *Client) DeletePreparation(ctx context.Context, operationID, token string) (Preparation, error) {
	org, err := c.OrganizationID(ctx)
	if err != nil {
		return Preparation{}, err
	}
	var out Preparation
	_, err = c.Do(ctx, Request{Method: http.MethodDelete, Path: preparationPath(org, operationID), OwnershipToken: token}, &out)
	return out, err
}

// GetPreparationByReference reads the runtime input a reference names, within the key's
// organization only.
func (c *Client) GetPreparationByReference(ctx context.Context, reference string) (Preparation, error) {
	var out Preparation
	_, err := c.Do(ctx, Request{Method: http.MethodGet, Path: "/v1/worker-runtime-input-references/" + url.PathEscape(reference)}, &out)
	return out, err
}

// GetAttestation reads the deletion attestation of a resource UID.
func (c *Client) GetAttestation(ctx context.Context, uid string) (Attestation, error) {
	var out Attestation
	_, err := c.Do(ctx, Request{Method: http.MethodGet, Path: "/v1/deletion-attestations/" + url.PathEscape(uid)}, &out)
	return out, err
}

// CommitmentKey asks for the rip2 commitment key of a material-set nonce (SPEC 3.5): the same
// every time, written nowhere, answered only to a write key. It is retried like a read. Keep what
// it returns in memory only, for as long as the reference is being computed.
func (c *Client) CommitmentKey(ctx context.Context, nonce string) (secretID string, key []byte, err error) {
	var out CommitmentKey
	if _, err := c.Do(ctx, Request{Method: http.MethodPost, Path: "/v1/runtime-input-commitment-keys", Body: CommitmentKeyRequest{MaterialSetNonce: nonce}}, &out); err != nil {
		return "", nil, err
	}
	key, err = hex.DecodeString(out.CommitmentKey)
	if err != nil || len(key) != 32 {
		return "", nil, fmt.Errorf("the Host answered a commitment key that is not 32 bytes of hex")
	}
	return out.CommitmentSecretID, key, nil
}
