package server_test

import (
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/takoform/terraform-provider-takoform/api"
	"github.com/takoform/terraform-provider-takoform/api/apitypes"
	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/resource"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeinput"
	"github.com/takoform/terraform-provider-takoform/server"
)

type openAPIDoc struct {
	Paths      map[string]map[string]any `yaml:"paths"`
	Components struct {
		Schemas map[string]struct {
			AdditionalProperties *bool          `yaml:"additionalProperties"`
			Properties           map[string]any `yaml:"properties"`
		} `yaml:"schemas"`
	} `yaml:"components"`
}

func loadOpenAPI(t *testing.T) openAPIDoc {
	t.Helper()
	var doc openAPIDoc
	require.NoError(t, yaml.Unmarshal(api.OpenAPI, &doc))
	return doc
}

var pathParam = regexp.MustCompile(`\{([A-Za-z]+)\}`)

// TestOpenAPIDescribesExactlyTheRouteTable: every route the server answers is in the document
// and every operation in the document is a route.
func TestOpenAPIDescribesExactlyTheRouteTable(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPI(t)
	var documented []string
	for path, item := range doc.Paths {
		for method := range item {
			if method == "parameters" {
				continue
			}
			documented = append(documented, strings.ToUpper(method)+" "+pathParam.ReplaceAllString(path, ":$1"))
		}
	}
	served := server.New(server.Config{}).Routes()
	sort.Strings(documented)
	sort.Strings(served)
	require.Equal(t, documented, served)
}

func jsonFields(v any) []string {
	var out []string
	typ := reflect.TypeOf(v)
	for i := range typ.NumField() {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" {
			// An embedded struct's fields are encoded inline.
			out = append(out, jsonFields(reflect.New(f.Type).Elem().Interface())...)
			continue
		}
		if name != "" && name != "-" {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// TestOpenAPISchemasMatchTheServerTypes: request and response schemas name exactly the fields the
// server decodes and encodes, and request bodies refuse unknown fields as the server does.
func TestOpenAPISchemasMatchTheServerTypes(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPI(t)
	for schema, v := range map[string]any{
		"ReservationRequest": reservation.Request{},
		"Reservation":        reservation.Projection{},
		"ObjectRef":          reservation.ObjectRef{},
		"Capabilities":       server.Capabilities{},
		"Offering":           server.OfferingView{},
		"WorkerSpec":         resource.WorkerSpec{},
		"Worker":             resource.WorkerProjection{},
		"EndpointSpec":       resource.EndpointSpec{},
		"Endpoint":           resource.EndpointProjection{},
		"Condition":          resource.Condition{},
		"ActivationRequest":  server.ActivationRequest{},
		"DerivationRequest":  server.DerivationRequest{},
		"Derivation":         reservation.Derivation{},
		"Attestation":        resource.Attestation{},
		"Operation":          resource.Operation{},
		"Effect":             resource.Effect{},
		"PreparationRequest": runtimeinput.Request{},
		"Preparation":        runtimeinput.Projection{},
		"LogLine":            apitypes.LogLine{},
	} {
		s, ok := doc.Components.Schemas[schema]
		require.True(t, ok, "schema %s is documented", schema)
		var props []string
		for p := range s.Properties {
			props = append(props, p)
		}
		sort.Strings(props)
		require.Equal(t, jsonFields(v), props, "schema %s", schema)
	}
	for _, request := range []string{"ReservationRequest", "WorkerSpec", "EndpointSpec", "ActivationRequest", "DerivationRequest", "PreparationRequest"} {
		require.NotNil(t, doc.Components.Schemas[request].AdditionalProperties, request)
		require.False(t, *doc.Components.Schemas[request].AdditionalProperties, request)
	}
}

// TestOpenAPIProblemCodesAndHeaders: the document's problem codes are exactly the server's, every
// owned mutation takes If-Match beside the ownership token, and under each status of a refusal
// that clears by itself the document promises Retry-After.
func TestOpenAPIProblemCodesAndHeaders(t *testing.T) {
	t.Parallel()
	type response struct {
		Ref     string         `yaml:"$ref"`
		Headers map[string]any `yaml:"headers"`
	}
	var doc struct {
		Paths      map[string]map[string]any `yaml:"paths"`
		Components struct {
			Responses map[string]response `yaml:"responses"`
			Schemas   struct {
				Problem struct {
					Properties struct {
						Code struct {
							Enum []string `yaml:"enum"`
						} `yaml:"code"`
					} `yaml:"properties"`
				} `yaml:"Problem"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	require.NoError(t, yaml.Unmarshal(api.OpenAPI, &doc))
	codes := server.ProblemCodes()
	var served []string
	for c := range codes {
		served = append(served, string(c))
	}
	documented := append([]string(nil), doc.Components.Schemas.Problem.Properties.Code.Enum...)
	sort.Strings(served)
	sort.Strings(documented)
	require.Equal(t, served, documented)

	retryable := map[string]bool{}
	for c, status := range codes {
		if apierr.Retryable(c) {
			retryable[strconv.Itoa(status)] = true
		}
	}
	for path, item := range doc.Paths {
		for method, op := range item {
			if method != "put" && method != "delete" {
				continue
			}
			raw, err := yaml.Marshal(op)
			require.NoError(t, err)
			if !strings.Contains(string(raw), "parameters/OwnershipToken") {
				continue
			}
			require.Contains(t, string(raw), "parameters/IfMatch", "%s %s", method, path)
			var parsed struct {
				Responses map[string]response `yaml:"responses"`
			}
			require.NoError(t, yaml.Unmarshal(raw, &parsed))
			for status := range retryable {
				r, ok := parsed.Responses[status]
				require.True(t, ok, "%s %s documents %s", method, path, status)
				if r.Ref != "" {
					r = doc.Components.Responses[strings.TrimPrefix(r.Ref, "#/components/responses/")]
				}
				require.Contains(t, r.Headers, "Retry-After", "%s %s answers %s with Retry-After", method, path, status)
			}
		}
	}
}
