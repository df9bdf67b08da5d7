// Command zeroprovider is the floor make bench-provider measures the Takoform provider against: a
// terraform-plugin-framework provider whose five resources have the Takoform resources' shapes
// (attribute names, types and modes, identities and timeouts blocks) and do no work. Create and
// Update keep the plan and give every unknown value a made-up one, Read keeps the state, Delete
// forgets. Whatever time it takes is what any framework provider of these shapes pays the CLI.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"log"
	"math/big"
	"os"
	runtimedebug "runtime/debug"
	"strings"

	"github.com/hashicorp/terraform-plugin-framework-timeouts/resource/timeouts"
	"github.com/hashicorp/terraform-plugin-framework/attr"
	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/provider"
	"github.com/hashicorp/terraform-plugin-framework/providerserver"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/identityschema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/types"
	"github.com/hashicorp/terraform-plugin-go/tftypes"
)

// Address is where the bench's CLI configuration finds this provider (a dev override).
const Address = "registry.terraform.io/takoform/zerowork"

// mode is how a configuration may set an attribute.
type mode int

const (
	required mode = iota
	optional
	computed
	optionalComputed
)

// kind is an attribute's type.
type kind int

const (
	str kind = iota
	num
	boolean
	strSet
	strMap
	// limits is the worker's limits object: optional cpu_ms and memory_mb numbers.
	limits
	// records is a custom domain's DNS records: a list of {type, name, value, offering_id}.
	records
)

type attribute struct {
	name      string
	kind      kind
	mode      mode
	sensitive bool
	writeOnly bool
}

// shape is one resource: its name after the provider's, its attributes, the attributes its
// identity copies, and whether its timeouts block has update.
type shape struct {
	name     string
	attrs    []attribute
	identity []string
	update   bool
	// createOnly: the timeouts block has create alone.
	createOnly bool
}

// Shapes are the Takoform resources' shapes (shape_test.go holds them to the provider's schemas).
var Shapes = []shape{
	{
		name:     "worker_endpoint_origin_reservation",
		identity: []string{"id"},
		update:   true,
		attrs: []attribute{
			{name: "bound_worker_id", kind: str, mode: computed},
			{name: "canonical_origin", kind: str, mode: computed},
			{name: "endpoint_id", kind: str, mode: computed},
			{name: "expires_at", kind: str, mode: computed},
			{name: "id", kind: str, mode: optionalComputed},
			{name: "offering_id", kind: str, mode: optional},
			{name: "revision", kind: num, mode: computed},
			{name: "space", kind: str, mode: required},
			{name: "status", kind: str, mode: computed},
			{name: "hostname", kind: str, mode: optional},
			{name: "subdomain", kind: str, mode: optional},
			{name: "ttl", kind: str, mode: optionalComputed},
			{name: "worker_name", kind: str, mode: required},
		},
	},
	{
		name:     "worker_runtime_input",
		identity: []string{"operation_id"},
		update:   true,
		attrs: []attribute{
			{name: "binding_names", kind: strSet, mode: computed},
			{name: "bindings_wo", kind: strMap, mode: optional, sensitive: true, writeOnly: true},
			{name: "bindings_wo_version", kind: num, mode: optional},
			{name: "bundle_name", kind: str, mode: optionalComputed},
			{name: "canonical_public_origin", kind: str, mode: required},
			{name: "endpoint_name", kind: str, mode: required},
			{name: "expires_at", kind: str, mode: computed},
			{name: "id", kind: str, mode: computed},
			{name: "material_set_nonce", kind: str, mode: optionalComputed},
			{name: "operation_id", kind: str, mode: optionalComputed},
			{name: "origin_reservation_id", kind: str, mode: required},
			{name: "preparation_id", kind: str, mode: computed},
			{name: "reference", kind: str, mode: computed},
			{name: "space", kind: str, mode: required},
			{name: "status", kind: str, mode: computed},
			{name: "worker_name", kind: str, mode: required},
		},
	},
	{
		name:     "worker",
		identity: []string{"space", "name"},
		update:   true,
		attrs: []attribute{
			{name: "bundle_bytes", kind: num, mode: computed},
			{name: "compatibility_date", kind: str, mode: required},
			{name: "compatibility_flags", kind: strSet, mode: optional},
			{name: "crons", kind: strSet, mode: optional},
			{name: "generation", kind: num, mode: computed},
			{name: "id", kind: str, mode: computed},
			{name: "json_vars", kind: strMap, mode: optional},
			{name: "limits", kind: limits, mode: optional},
			{name: "logs_url", kind: str, mode: computed},
			{name: "main_module", kind: str, mode: required},
			{name: "module_files", kind: strMap, mode: optional},
			{name: "module_sha256", kind: strMap, mode: computed},
			{name: "modules", kind: strMap, mode: optional},
			{name: "name", kind: str, mode: required},
			{name: "offering_id", kind: str, mode: optionalComputed},
			{name: "ready", kind: boolean, mode: computed},
			{name: "required_sensitive_vars", kind: strSet, mode: optional},
			{name: "revision", kind: num, mode: computed},
			{name: "runtime_input_reference", kind: str, mode: optional},
			{name: "script_name", kind: str, mode: computed},
			{name: "service_binding_workers", kind: strMap, mode: computed},
			{name: "service_bindings", kind: strMap, mode: optional},
			{name: "space", kind: str, mode: required},
			{name: "vars", kind: strMap, mode: optional},
		},
	},
	{
		name:     "worker_endpoint",
		identity: []string{"space", "name"},
		update:   true,
		attrs: []attribute{
			{name: "host_minted", kind: boolean, mode: computed},
			{name: "hostname", kind: str, mode: computed},
			{name: "id", kind: str, mode: computed},
			{name: "name", kind: str, mode: required},
			{name: "offering_id", kind: str, mode: optionalComputed},
			{name: "origin_reservation_id", kind: str, mode: optionalComputed},
			{name: "space", kind: str, mode: required},
			{name: "url", kind: str, mode: computed},
			{name: "worker", kind: str, mode: required},
			{name: "worker_id", kind: str, mode: optionalComputed},
		},
	},
	{
		name:     "worker_endpoint_activation",
		identity: []string{"reservation_id"},
		attrs: []attribute{
			{name: "endpoint_id", kind: str, mode: required},
			{name: "id", kind: str, mode: computed},
			{name: "reservation_id", kind: str, mode: required},
			{name: "revision", kind: num, mode: computed},
			{name: "status", kind: str, mode: computed},
		},
	},
	{
		name:     "custom_domain",
		identity: []string{"hostname"},
		attrs: []attribute{
			{name: "dns_records", kind: records, mode: computed},
			{name: "hostname", kind: str, mode: required},
			{name: "id", kind: str, mode: computed},
			{name: "status", kind: str, mode: computed},
			{name: "txt_name", kind: str, mode: computed},
			{name: "txt_value", kind: str, mode: computed},
			{name: "verified_at", kind: str, mode: computed},
		},
	},
	{
		name:       "custom_domain_verification",
		createOnly: true,
		attrs: []attribute{
			{name: "hostname", kind: str, mode: required},
			{name: "id", kind: str, mode: computed},
			{name: "verified_at", kind: str, mode: computed},
		},
	},
}

func main() {
	var debug bool
	flag.BoolVar(&debug, "debug", false, "run the provider with support for debuggers like delve")
	flag.Parse()
	// The same process settings as the Takoform provider's main, so that the floor is the
	// framework's and the CLI's cost alone.
	if os.Getenv("GOGC") == "" {
		runtimedebug.SetGCPercent(400)
	}
	quietUnlessAsked()
	err := providerserver.Serve(context.Background(), func() provider.Provider { return zeroProvider{} }, providerserver.ServeOpts{
		Address:         Address,
		Debug:           debug,
		ProtocolVersion: 6,
	})
	if err != nil {
		log.Fatal(err.Error())
	}
}

// quietUnlessAsked turns the framework's logging off when no TF_LOG* variable asks for it, as the
// Takoform provider's main does.
func quietUnlessAsked() {
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "TF_LOG") || strings.HasPrefix(kv, "TF_ACC_LOG") {
			return
		}
	}
	for _, name := range []string{"TF_LOG_PROVIDER", "TF_LOG_PROVIDER_ZEROWORK", "TF_LOG_SDK", "TF_LOG_SDK_PROTO", "TF_LOG_SDK_FRAMEWORK"} {
		_ = os.Setenv(name, "OFF")
	}
}

type zeroProvider struct{}

func (zeroProvider) Metadata(_ context.Context, _ provider.MetadataRequest, resp *provider.MetadataResponse) {
	resp.TypeName = "zerowork"
}

func (zeroProvider) Schema(context.Context, provider.SchemaRequest, *provider.SchemaResponse) {}

func (zeroProvider) Configure(context.Context, provider.ConfigureRequest, *provider.ConfigureResponse) {
}

func (zeroProvider) Resources(context.Context) []func() resource.Resource {
	var out []func() resource.Resource
	for _, s := range Shapes {
		if len(s.identity) == 0 {
			out = append(out, func() resource.Resource { return plainResource{zeroResource{s}} })
			continue
		}
		out = append(out, func() resource.Resource { return zeroResource{s} })
	}
	return out
}

func (zeroProvider) DataSources(context.Context) []func() datasource.DataSource { return nil }

type zeroResource struct{ shape }

var (
	_ resource.Resource             = zeroResource{}
	_ resource.ResourceWithIdentity = zeroResource{}
)

func (r zeroResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_" + r.name
}

// Schema is the shape's, built from the table: no validators, no plan modifiers.
func (r zeroResource) Schema(ctx context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	attrs := make(map[string]schema.Attribute, len(r.attrs))
	for _, a := range r.attrs {
		req, opt, comp := a.mode == required, a.mode == optional || a.mode == optionalComputed, a.mode == computed || a.mode == optionalComputed
		switch a.kind {
		case str:
			attrs[a.name] = schema.StringAttribute{Required: req, Optional: opt, Computed: comp, Sensitive: a.sensitive, WriteOnly: a.writeOnly}
		case num:
			attrs[a.name] = schema.Int64Attribute{Required: req, Optional: opt, Computed: comp, Sensitive: a.sensitive, WriteOnly: a.writeOnly}
		case boolean:
			attrs[a.name] = schema.BoolAttribute{Required: req, Optional: opt, Computed: comp, Sensitive: a.sensitive, WriteOnly: a.writeOnly}
		case strSet:
			attrs[a.name] = schema.SetAttribute{ElementType: types.StringType, Required: req, Optional: opt, Computed: comp, Sensitive: a.sensitive} // sets cannot be write-only
		case strMap:
			attrs[a.name] = schema.MapAttribute{ElementType: types.StringType, Required: req, Optional: opt, Computed: comp, Sensitive: a.sensitive, WriteOnly: a.writeOnly}
		case records:
			attrs[a.name] = schema.ListAttribute{Required: req, Optional: opt, Computed: comp, ElementType: types.ObjectType{AttrTypes: map[string]attr.Type{
				"type": types.StringType, "name": types.StringType, "value": types.StringType, "offering_id": types.StringType,
			}}}
		case limits:
			attrs[a.name] = schema.SingleNestedAttribute{Required: req, Optional: opt, Computed: comp, Attributes: map[string]schema.Attribute{
				"cpu_ms": schema.Int64Attribute{Optional: true}, "memory_mb": schema.Int64Attribute{Optional: true},
			}}
		}
	}
	resp.Schema = schema.Schema{
		Attributes: attrs,
		Blocks: map[string]schema.Block{
			"timeouts": timeouts.Block(ctx, timeouts.Opts{Create: true, Update: r.update, Delete: !r.createOnly}),
		},
	}
}

func (r zeroResource) IdentitySchema(_ context.Context, _ resource.IdentitySchemaRequest, resp *resource.IdentitySchemaResponse) {
	attrs := make(map[string]identityschema.Attribute, len(r.identity))
	for _, name := range r.identity {
		attrs[name] = identityschema.StringAttribute{RequiredForImport: true}
	}
	resp.IdentitySchema = identityschema.Schema{Attributes: attrs}
}

func (r zeroResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	resp.State.Raw = known(req.Plan.Raw)
	for _, name := range r.identity {
		var v types.String
		resp.Diagnostics.Append(resp.State.GetAttribute(ctx, path.Root(name), &v)...)
		resp.Diagnostics.Append(resp.Identity.SetAttribute(ctx, path.Root(name), v)...)
	}
}

func (zeroResource) Read(context.Context, resource.ReadRequest, *resource.ReadResponse) {}

func (zeroResource) Update(_ context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	resp.State.Raw = known(req.Plan.Raw)
}

func (zeroResource) Delete(context.Context, resource.DeleteRequest, *resource.DeleteResponse) {}

// plainResource is a zeroResource without an identity, for a Takoform resource that has none.
type plainResource struct{ r zeroResource }

func (p plainResource) Metadata(ctx context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	p.r.Metadata(ctx, req, resp)
}

func (p plainResource) Schema(ctx context.Context, req resource.SchemaRequest, resp *resource.SchemaResponse) {
	p.r.Schema(ctx, req, resp)
}

func (plainResource) Create(_ context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	resp.State.Raw = known(req.Plan.Raw)
}

func (plainResource) Read(context.Context, resource.ReadRequest, *resource.ReadResponse) {}

func (p plainResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	p.r.Update(ctx, req, resp)
}

func (plainResource) Delete(context.Context, resource.DeleteRequest, *resource.DeleteResponse) {}

// known gives every unknown value in a planned object a made-up value of its type: a fresh random
// string, 1, true, or an empty collection.
func known(planned tftypes.Value) tftypes.Value {
	out, err := tftypes.Transform(planned, func(_ *tftypes.AttributePath, v tftypes.Value) (tftypes.Value, error) {
		if v.IsKnown() {
			return v, nil
		}
		typ := v.Type()
		switch {
		case typ.Is(tftypes.String):
			var b [8]byte
			_, _ = rand.Read(b[:])
			return tftypes.NewValue(typ, "zero-"+hex.EncodeToString(b[:])), nil
		case typ.Is(tftypes.Number):
			return tftypes.NewValue(typ, big.NewFloat(1)), nil
		case typ.Is(tftypes.Bool):
			return tftypes.NewValue(typ, true), nil
		case typ.Is(tftypes.Set{}), typ.Is(tftypes.Map{}), typ.Is(tftypes.List{}):
			return tftypes.NewValue(typ, empty(typ)), nil
		}
		return v, nil
	})
	if err != nil {
		panic(err) // the transform above returns no error
	}
	return out
}

// empty is the value of an empty collection of typ.
func empty(typ tftypes.Type) any {
	if typ.Is(tftypes.Map{}) {
		return map[string]tftypes.Value{}
	}
	return []tftypes.Value{}
}
