package client

import (
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/takoform/terraform-provider-takoform/api"
)

// TestTypesMatchTheDocument: every wire type of the client names exactly the properties of its
// schema in api/openapi.yaml, so the client speaks the document (SPEC 2).
func TestTypesMatchTheDocument(t *testing.T) {
	t.Parallel()
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Properties map[string]any `yaml:"properties"`
				} `yaml:"properties"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	require.NoError(t, yaml.Unmarshal(api.OpenAPI, &doc))
	schemas := doc.Components.Schemas
	nested := func(schema, prop string) []string {
		var out []string
		for k := range schemas[schema].Properties[prop].Properties {
			out = append(out, k)
		}
		sort.Strings(out)
		return out
	}
	for name, v := range map[string]any{
		"Capabilities": Capabilities{}, "Offering": Offering{}, "ObjectRef": ObjectRef{}, "ReservationRequest": ReservationRequest{},
		"Reservation": Reservation{}, "ActivationRequest": ActivationRequest{}, "DerivationRequest": DerivationRequest{},
		"Derivation": Derivation{}, "WorkerSpec": WorkerSpec{}, "Condition": Condition{}, "Worker": Worker{},
		"EndpointSpec": EndpointSpec{}, "Endpoint": Endpoint{}, "PreparationRequest": PreparationRequest{},
		"Preparation": Preparation{}, "Attestation": Attestation{}, "CommitmentKey": CommitmentKey{}, "CommitmentKeyRequest": CommitmentKeyRequest{},
		"CustomDomain": CustomDomain{}, "DnsRecord": DNSRecord{}, "DomainCondition": DomainCondition{},
	} {
		s, ok := schemas[name]
		require.True(t, ok, "schema %s is in the document", name)
		var props []string
		for p := range s.Properties {
			props = append(props, p)
		}
		sort.Strings(props)
		require.Equal(t, props, jsonFields(v), "client type for schema %s", name)
	}
	require.Equal(t, nested("Preparation", "target"), jsonFields(PreparationTargetView{}))
	require.Equal(t, nested("PreparationRequest", "target"), jsonFields(PreparationTarget{}))
	require.Equal(t, nested("Endpoint", "worker"), jsonFields(WorkerRef{}))
	require.Equal(t, nested("Worker", "runtimeInputs"), jsonFields(RuntimeInputs{}))
}

func jsonFields(v any) []string {
	var out []string
	typ := reflect.TypeOf(v)
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}
