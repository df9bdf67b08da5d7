package provider

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/client"
)

// A new endpoint's url is planned from its reservation's origin while the reservation can still
// publish one; an expired or released reservation (or one without an origin) leaves it unknown.
func TestAnEndpointPlansItsURLFromALiveReservation(t *testing.T) {
	t.Parallel()
	const origin = "http://api-prod-0123.workers.localhost:8080"
	for status, want := range map[string]bool{"prepared": true, "bound": true, "activated": true, "expired": false, "released": false} {
		got, ok := plannedOrigin(client.Reservation{Status: status, CanonicalOrigin: origin})
		require.Equal(t, want, ok, status)
		if ok {
			require.Equal(t, origin, got)
		}
	}
	_, ok := plannedOrigin(client.Reservation{Status: "prepared"})
	require.False(t, ok, "no origin, nothing planned")
	require.Equal(t, "api-prod-0123.workers.localhost", hostnameOf(origin))
}
