package runtimeinput

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
)

// A request is refused on its shape before anything is read: the format, the nonce, a reference
// that is neither rip1 nor rip2 (or whose preparation id is not its digest's prefix), names and
// sizes. rip1 and rip2 references of the right shape both pass.
func TestARequestIsRefusedOnItsShapeAlone(t *testing.T) {
	t.Parallel()
	h := strings.Repeat("ab", 32)
	rip1 := "rip1.prep-" + h[:32] + "." + h
	rip2 := "rip2.c20261203000000-0a1b2c3d.prep-" + h[:32] + "." + h
	good := func() Request {
		return Request{Format: PreparationFormat, MaterialSetNonce: "n-1", RuntimeInputReference: rip2,
			Target:   TargetRequest{Space: "prod", WorkerName: "api", BundleName: "main", EndpointName: "api", OriginReservationID: "res-api"},
			Bindings: map[string]string{"API_KEY": "v"}}
	}
	var s Service
	require.NoError(t, s.validate(inputOf(good())))
	legacy := good()
	legacy.RuntimeInputReference = rip1
	require.NoError(t, s.validate(inputOf(legacy)), "rip1 from older providers")

	for name, spoil := range map[string]func(*Request){
		"format":              func(r *Request) { r.Format = "other" },
		"empty nonce":         func(r *Request) { r.MaterialSetNonce = "" },
		"long nonce":          func(r *Request) { r.MaterialSetNonce = strings.Repeat("n", 257) },
		"rip3":                func(r *Request) { r.RuntimeInputReference = strings.Replace(rip2, "rip2", "rip3", 1) },
		"prep not the prefix": func(r *Request) { r.RuntimeInputReference = "rip1.prep-" + strings.Repeat("cd", 16) + "." + h },
		"rip2 without secret": func(r *Request) { r.RuntimeInputReference = "rip2.prep-" + h[:32] + "." + h },
		"space":               func(r *Request) { r.Target.Space = "Prod!" },
		"binding name":        func(r *Request) { r.Bindings = map[string]string{"api-key": "v"} },
		"binding size": func(r *Request) {
			r.Bindings = map[string]string{"API_KEY": strings.Repeat("x", maxValueBytes+1)}
		},
	} {
		r := good()
		spoil(&r)
		err := s.validate(inputOf(r))
		require.Error(t, err, name)
		require.True(t, apierr.Is(err, apierr.InvalidRequest), "%s: %v", name, err)
	}
}

// A request's values are wrapped once it reaches the package: printing the input shows no value.
// The caller's request keeps its values, so that a second run of Put on the same request (the
// ownership loop's retry after a busy key) seals the same values.
func TestARequestsValuesAreWrappedAndTheRequestCanBeTakenAgain(t *testing.T) {
	t.Parallel()
	req := Request{Format: PreparationFormat, Bindings: map[string]string{"API_KEY": "hunter2-canary"}}
	in := inputOf(req)
	require.Nil(t, in.Request.Bindings, "the input holds no plain copy")
	require.Equal(t, "hunter2-canary", in.Values["API_KEY"].Reveal())
	again := inputOf(req)
	require.Equal(t, "hunter2-canary", again.Values["API_KEY"].Reveal(), "taken again, the same values")
	require.NotContains(t, fmt.Sprintf("%v %+v %#v", in, in, in), "hunter2-canary")
}

// The ownership request hash is taken over the body with every value blanked, so that no digest
// of a secret is kept; the names and the reference stay in it.
func TestTheRequestHashBodyHoldsNoValue(t *testing.T) {
	t.Parallel()
	body := `{"format":"x","materialSetNonce":"n","runtimeInputReference":"rip2.r","target":{},"bindings":{"API_KEY":"hunter2","TOKEN":"s3cret"}}`
	got, err := HashBody([]byte(body))
	require.NoError(t, err)
	require.NotContains(t, string(got), "hunter2")
	require.NotContains(t, string(got), "s3cret")
	require.Contains(t, string(got), "API_KEY")
	require.Contains(t, string(got), "rip2.r")
	other, err := HashBody([]byte(strings.Replace(body, "hunter2", "other", 1)))
	require.NoError(t, err)
	require.Equal(t, string(got), string(other), "other values, the same hashed body")
}

// A sealed value is bound to its row: the additional data differs for another organization,
// preparation or reference.
func TestTheSealIsBoundToItsRow(t *testing.T) {
	t.Parallel()
	base := string(aad("org_a", "prep-1", "rip2.x"))
	for _, other := range []string{string(aad("org_b", "prep-1", "rip2.x")), string(aad("org_a", "prep-2", "rip2.x")), string(aad("org_a", "prep-1", "rip2.y"))} {
		require.NotEqual(t, base, other)
	}
}
