package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/api"
	"github.com/takoform/terraform-provider-takoform/internal/client"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeref"
	"github.com/takoform/terraform-provider-takoform/internal/testhost"
	"github.com/takoform/terraform-provider-takoform/server"
)

// ndjsonDecoder checks every line of an NDJSON body against the schema (of one line), and hands
// the validator the last line (or, for an empty stream, nothing to check further).
func ndjsonDecoder(body io.Reader, _ http.Header, schema *openapi3.SchemaRef, _ openapi3filter.EncodingFn) (any, error) {
	raw, err := io.ReadAll(body)
	if err != nil {
		return nil, err
	}
	var last any = map[string]any{"time": "2026-01-01T00:00:00Z"}
	for _, line := range strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n") {
		if line == "" {
			continue
		}
		var v any
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			return nil, fmt.Errorf("an NDJSON line is not JSON: %w", err)
		}
		if err := schema.Value.VisitJSON(v); err != nil {
			return nil, fmt.Errorf("NDJSON line %s: %w", line, err)
		}
		last = v
	}
	return last, nil
}

// conformance validates every request and real response that passes through it against the
// OpenAPI document: the route, the parameters, the bodies, and that the status is documented.
type conformance struct {
	t      *testing.T
	router routers.Router
	base   http.RoundTripper
	mu     sync.Mutex
	seen   map[string]bool // "operationId status"
}

func newConformance(t *testing.T) *conformance {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(api.OpenAPI)
	require.NoError(t, err)
	require.NoError(t, doc.Validate(context.Background()))
	doc.Servers = nil // the document names the default listen address; the test Host listens elsewhere
	router, err := gorillamux.NewRouter(doc)
	require.NoError(t, err)
	openapi3filter.RegisterBodyDecoder("application/problem+json", openapi3filter.JSONBodyDecoder)
	openapi3filter.RegisterBodyDecoder(server.NDJSONContentType, ndjsonDecoder)
	return &conformance{t: t, router: router, base: http.DefaultTransport, seen: map[string]bool{}}
}

func (c *conformance) RoundTrip(req *http.Request) (*http.Response, error) {
	var reqBody []byte
	if req.Body != nil {
		reqBody, _ = io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(reqBody))
	}
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		c.t.Errorf("%s %s is not an operation of the document: %v", req.Method, req.URL.Path, err)
		return c.base.RoundTrip(req)
	}
	check := req.Clone(req.Context())
	check.Body = io.NopCloser(bytes.NewReader(reqBody))
	in := &openapi3filter.RequestValidationInput{Request: check, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true}}
	resp, err := c.base.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body = io.NopCloser(bytes.NewReader(body))
	// Requests that are wrong on purpose (to draw a 4xx) are not held to the document.
	if resp.StatusCode < 400 || resp.StatusCode == http.StatusConflict || resp.StatusCode == http.StatusNotFound {
		if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
			c.t.Errorf("request %s %s does not match the document: %v", req.Method, req.URL.Path, err)
		}
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true}}
	out.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		c.t.Errorf("response %d to %s %s does not match the document: %v\n%s", resp.StatusCode, req.Method, req.URL.Path, err, body)
	}
	c.mu.Lock()
	c.seen[fmt.Sprintf("%s %d", route.Operation.OperationID, resp.StatusCode)] = true
	c.mu.Unlock()
	return resp, nil
}

// raw sends one request through the validator, for the refusals the client never provokes.
func (c *conformance) raw(t *testing.T, method, url, key string, header map[string]string, body string) int {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Transport: c, Timeout: 30 * time.Second}).Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// TestOpenAPIConformsToAScriptedSession drives a real Host through the life of a full graph,
// replays, refusals and reads, and validates every request and response against the document.
func TestOpenAPIConformsToAScriptedSession(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	v := newConformance(t)
	c, err := client.New(client.Config{Endpoint: h.URL, APIKey: h.Key, OrganizationID: h.Organization.ID,
		HTTPClient: &http.Client{Transport: v, Timeout: 30 * time.Second}})
	require.NoError(t, err)
	ctx := context.Background()

	// Discovery.
	_, err = c.Capabilities(ctx)
	require.NoError(t, err)
	_, err = c.Offerings(ctx)
	require.NoError(t, err)
	resID := "res-conformance"
	d, err := c.Derive(ctx, client.DerivationRequest{Space: "prod", WorkerName: "api", OriginReservationID: &resID})
	require.NoError(t, err)
	require.True(t, d.Available)

	// The graph, with a replay of each create.
	res, _, err := c.PutReservation(ctx, resID, "token-reservation-0001", client.ReservationRequest{Space: "prod", WorkerName: "api"})
	require.NoError(t, err)
	_, replay, err := c.PutReservation(ctx, resID, "token-reservation-0001", client.ReservationRequest{Space: "prod", WorkerName: "api"})
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	target := runtimeref.Target{Space: "prod", WorkerName: "api", BundleName: "main", EndpointName: "api", OriginReservationID: resID, CanonicalPublicOrigin: res.CanonicalOrigin}
	id := runtimeref.Derive("nonce-1", target, map[string]string{"TOKEN": "value"})
	_, _, err = c.PutPreparation(ctx, "op-conformance", "token-preparation-0001", client.PreparationRequest{Format: client.PreparationFormat,
		MaterialSetNonce: "nonce-1", RuntimeInputReference: id.Reference, Bindings: map[string]string{"TOKEN": "value"},
		Target: client.PreparationTarget{Space: "prod", WorkerName: "api", BundleName: "main", EndpointName: "api", OriginReservationID: resID}})
	require.NoError(t, err)
	spec := client.WorkerSpec{Modules: map[string]string{"index.js": "export default {}"}, MainModule: "index.js", CompatibilityDate: "2025-01-01",
		RequiredSensitiveVars: []string{"TOKEN"}, RuntimeInputReference: &id.Reference}
	w, _, err := c.PutWorker(ctx, "prod", "api", "token-worker-00000001", 0, spec)
	require.NoError(t, err)
	spec.Modules["index.js"] = "export default { fetch() { return new Response('v2') } }"
	w, _, err = c.PutWorker(ctx, "prod", "api", "token-worker-00000001", w.Revision, spec)
	require.NoError(t, err)
	_, _, err = c.PutWorker(ctx, "prod", "api", "token-worker-00000001", 1, spec)
	require.True(t, client.IsCode(err, "revision_conflict"), "%v", err)
	e, _, err := c.PutEndpoint(ctx, "prod", "api", "token-endpoint-000001", 0, client.EndpointSpec{Worker: "api", OriginReservationID: &resID})
	require.NoError(t, err)
	_, _, err = c.PutActivation(ctx, resID, "token-activation-0001", e.UID)
	require.NoError(t, err)

	// Reads.
	_, err = c.GetReservation(ctx, resID)
	require.NoError(t, err)
	_, err = c.GetWorker(ctx, "prod", "api")
	require.NoError(t, err)
	_, err = c.GetEndpoint(ctx, "prod", "api")
	require.NoError(t, err)
	_, err = c.GetPreparation(ctx, "op-conformance")
	require.NoError(t, err)
	_, err = c.GetPreparationByReference(ctx, id.Reference)
	require.NoError(t, err)
	_, err = c.GetWorker(ctx, "prod", "missing")
	require.True(t, client.IsNotFound(err))
	require.Equal(t, http.StatusOK, v.raw(t, http.MethodGet, h.URL+"/v1/spaces/prod/workers/api/logs?since=1h", h.Key, nil, ""))
	require.Equal(t, http.StatusNotFound, v.raw(t, http.MethodGet, h.URL+"/v1/spaces/prod/workers/missing/logs", h.Key, nil, ""))
	require.Equal(t, http.StatusUnprocessableEntity, v.raw(t, http.MethodGet, h.URL+"/v1/spaces/prod/workers/api/logs?follow=maybe", h.Key, nil, ""))

	// Refusals.
	_, err = c.DeleteReservation(ctx, resID, "token-reservation-0001")
	require.True(t, client.IsCode(err, "release_fenced"), "%v", err)
	_, err = c.DeleteEndpoint(ctx, "prod", "api", "token-endpoint-000001")
	require.True(t, client.IsCode(err, "endpoint_activated"), "%v", err)
	_, _, err = c.PutWorker(ctx, "prod", "api", "another-token-0000001", 0, spec)
	require.True(t, client.IsCode(err, "ownership_conflict"), "%v", err)
	bad := "Not A Label"
	_, err = c.Derive(ctx, client.DerivationRequest{Space: "prod", WorkerName: "api", Subdomain: &bad})
	require.True(t, client.IsCode(err, "invalid_request"), "%v", err)

	// The destroy order, then a late replay of a deleted object's create.
	_, err = c.DeleteActivation(ctx, resID, "token-activation-0001")
	require.NoError(t, err)
	_, err = c.DeleteEndpoint(ctx, "prod", "api", "token-endpoint-000001")
	require.NoError(t, err)
	_, err = c.GetAttestation(ctx, e.UID)
	require.NoError(t, err)
	_, err = c.DeleteWorker(ctx, "prod", "api", "token-worker-00000001")
	require.NoError(t, err)
	_, err = c.DeletePreparation(ctx, "op-conformance", "token-preparation-0001")
	require.NoError(t, err)
	_, err = c.DeleteReservation(ctx, resID, "token-reservation-0001")
	require.NoError(t, err)
	_, _, err = c.PutReservation(ctx, resID, "token-reservation-0001", client.ReservationRequest{Space: "prod", WorkerName: "api"})
	require.True(t, client.IsCode(err, "tombstoned"), "%v", err)

	// What the client never sends.
	opURL := ""
	req, _ := http.NewRequest(http.MethodPut, h.URL+"/v1/worker-endpoint-origin-reservations/res-op", strings.NewReader(`{"space":"prod","workerName":"op"}`))
	req.Header.Set("Authorization", "Bearer "+h.Key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Takoform-Ownership-Token", "token-operation-00001")
	resp, err := (&http.Client{Transport: v}).Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	opURL = h.URL + "/v1/operations/" + resp.Header.Get("Takoform-Operation-Id")
	require.Equal(t, http.StatusOK, v.raw(t, http.MethodGet, opURL, h.Key, nil, ""))
	jsonType := map[string]string{"Content-Type": "application/json"}
	require.Equal(t, http.StatusUnauthorized, v.raw(t, http.MethodGet, h.URL+"/v1/capabilities", "tkf_"+strings.Repeat("a", 52), nil, ""))
	require.Equal(t, http.StatusPreconditionRequired, v.raw(t, http.MethodPut, h.URL+"/v1/worker-endpoint-origin-reservations/res-x", h.Key, jsonType, `{"space":"a","workerName":"b"}`))
	withToken := map[string]string{"Content-Type": "application/json", "Takoform-Ownership-Token": "token-raw-0000000001"}
	require.Equal(t, http.StatusForbidden, v.raw(t, http.MethodPut, h.URL+"/v1/worker-endpoint-origin-reservations/hostmint-"+strings.Repeat("0", 40), h.Key, withToken, `{"space":"a","workerName":"b"}`))
	require.Equal(t, http.StatusBadRequest, v.raw(t, http.MethodPut, h.URL+"/v1/worker-endpoint-origin-reservations/res-x", h.Key, withToken, `{"space":`))
	require.Equal(t, http.StatusUnsupportedMediaType, v.raw(t, http.MethodPut, h.URL+"/v1/worker-endpoint-origin-reservations/res-x", h.Key,
		map[string]string{"Content-Type": "text/plain", "Takoform-Ownership-Token": "token-raw-0000000001"}, `x`))
	require.Equal(t, http.StatusUnprocessableEntity, v.raw(t, http.MethodPut, h.URL+"/v1/worker-endpoint-origin-reservations/res-x", h.Key, withToken, `{"space":"Bad Space","workerName":"b"}`))
	require.Equal(t, http.StatusForbidden, v.raw(t, http.MethodGet, h.URL+"/v1/organizations/org_other/worker-runtime-input-preparations/op-x", h.Key, nil, ""))
	require.Equal(t, http.StatusNotFound, v.raw(t, http.MethodGet, h.URL+"/v1/deletion-attestations/"+"00000000-0000-0000-0000-000000000000", h.Key, nil, ""))
	reader := h.NewKey(t, "acme", "resources:read")
	require.Equal(t, http.StatusForbidden, v.raw(t, http.MethodPut, h.URL+"/v1/worker-endpoint-origin-reservations/res-y", reader, withToken, `{"space":"a","workerName":"b"}`))
	for _, probe := range []string{"/healthz", "/readyz", "/metrics"} {
		require.Equal(t, http.StatusOK, v.raw(t, http.MethodGet, h.URL+probe, "", nil, ""))
	}
	t.Logf("validated %d operation/status pairs", len(v.seen))
}
