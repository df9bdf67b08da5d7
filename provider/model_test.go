package provider

import (
	"context"
	"fmt"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/hashicorp/terraform-plugin-framework/attr"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/tfsdk"
	"github.com/hashicorp/terraform-plugin-framework/types"
	"github.com/hashicorp/terraform-plugin-framework/types/basetypes"
	"github.com/hashicorp/terraform-plugin-go/tftypes"
	"github.com/stretchr/testify/require"
)

// modelCase is one resource's schema with the model its code reads and writes.
type modelCase struct {
	name  string
	res   resource.Resource
	model func() any
}

func modelCases() []modelCase {
	return []modelCase{
		{"reservation", newReservationResource(), func() any { return &reservationModel{} }},
		{"runtime input", newRuntimeInputResource(), func() any { return &runtimeInputModel{} }},
		{"worker", newWorkerResource(), func() any { return &workerModel{} }},
		{"endpoint", newEndpointResource(), func() any { return &endpointModel{} }},
		{"activation", newActivationResource(), func() any { return &activationModel{} }},
	}
}

// randomValue answers a value of typ: null, unknown or known at random, known collections with
// zero to three elements, down to every nested attribute.
func randomValue(rng *rand.Rand, typ tftypes.Type) tftypes.Value {
	switch rng.IntN(5) {
	case 0:
		return tftypes.NewValue(typ, nil)
	case 1:
		return tftypes.NewValue(typ, tftypes.UnknownValue)
	}
	switch {
	case typ.Is(tftypes.String):
		return tftypes.NewValue(typ, fmt.Sprintf("v%d", rng.IntN(1000)))
	case typ.Is(tftypes.Number):
		return tftypes.NewValue(typ, big.NewFloat(float64(rng.IntN(1000))))
	case typ.Is(tftypes.Bool):
		return tftypes.NewValue(typ, rng.IntN(2) == 0)
	case typ.Is(tftypes.Map{}):
		elems := map[string]tftypes.Value{}
		for i := range rng.IntN(4) {
			elems[fmt.Sprintf("k%d", i)] = randomValue(rng, typ.(tftypes.Map).ElementType)
		}
		return tftypes.NewValue(typ, elems)
	case typ.Is(tftypes.Set{}):
		var elems []tftypes.Value
		for i := range rng.IntN(4) { // distinct known elements: a set holds no duplicates
			elems = append(elems, tftypes.NewValue(typ.(tftypes.Set).ElementType, fmt.Sprintf("e%d", i)))
		}
		return tftypes.NewValue(typ, elems)
	case typ.Is(tftypes.List{}):
		var elems []tftypes.Value
		for range rng.IntN(4) {
			elems = append(elems, randomValue(rng, typ.(tftypes.List).ElementType))
		}
		return tftypes.NewValue(typ, elems)
	case typ.Is(tftypes.Object{}):
		attrs := map[string]tftypes.Value{}
		for name, t := range typ.(tftypes.Object).AttributeTypes {
			attrs[name] = randomValue(rng, t)
		}
		return tftypes.NewValue(typ, attrs)
	}
	panic("no random value for " + typ.String())
}

// randomObject answers a known object of typ whose attributes are random values.
func randomObject(rng *rand.Rand, typ tftypes.Type) tftypes.Value {
	attrs := map[string]tftypes.Value{}
	for name, t := range typ.(tftypes.Object).AttributeTypes {
		attrs[name] = randomValue(rng, t)
	}
	return tftypes.NewValue(typ, attrs)
}

// The model helpers read and write every resource's model exactly as the framework's own Get and
// Set do, for values null, unknown and known at every depth.
func TestModelsConvertAsTheFrameworkConvertsThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	for _, c := range modelCases() {
		var sr resource.SchemaResponse
		c.res.Schema(ctx, resource.SchemaRequest{}, &sr)
		require.False(t, sr.Diagnostics.HasError(), c.name)
		typ := sr.Schema.Type().TerraformType(ctx)
		for range 200 {
			state := tfsdk.State{Schema: sr.Schema, Raw: randomObject(rng, typ)}

			theirs, ours := c.model(), c.model()
			require.False(t, state.Get(ctx, theirs).HasError(), c.name)
			require.False(t, getState(ctx, state, ours).HasError(), c.name)
			require.Equal(t, theirs, ours, "%s: read %s", c.name, state.Raw)
			require.True(t, decodeModel(ctx, sr.Schema.Type(), state.Raw, c.model()), "%s: the fast path did not take %s", c.name, state.Raw)

			plan := tfsdk.Plan{Schema: sr.Schema, Raw: state.Raw}
			fromPlan := c.model()
			require.False(t, getPlan(ctx, plan, fromPlan).HasError(), c.name)
			require.Equal(t, theirs, fromPlan, c.name)

			written, reference := tfsdk.State{Schema: sr.Schema}, tfsdk.State{Schema: sr.Schema}
			require.False(t, reference.Set(ctx, theirs).HasError(), c.name)
			require.False(t, setState(ctx, &written, ours).HasError(), c.name)
			require.True(t, reference.Raw.Equal(written.Raw), "%s: wrote %s, the framework %s", c.name, written.Raw, reference.Raw)
			_, fast := encodeModel(ctx, sr.Schema.Type(), ours)
			require.True(t, fast, "%s: the fast path did not write %s", c.name, state.Raw)
		}
	}
}

// What the fast path cannot take goes through the framework, which reports it as it always has:
// a model missing an attribute, a map without an element type, a fractional revision, a null
// object.
func TestModelsTheFastPathCannotTakeGetTheFrameworksAnswer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var sr resource.SchemaResponse
	newActivationResource().Schema(ctx, resource.SchemaRequest{}, &sr)
	typ := sr.Schema.Type().TerraformType(ctx)

	type short struct {
		ID types.String `tfsdk:"id"`
	}
	state := tfsdk.State{Schema: sr.Schema, Raw: randomObject(rand.New(rand.NewPCG(1, 2)), typ)}
	var s short
	diags := getState(ctx, state, &s)
	require.True(t, diags.HasError())
	require.Contains(t, diags[0].Detail(), "Object defines fields not found in struct")
	require.True(t, setState(ctx, &state, s).HasError())

	// A zero types.Map has no element type: the framework refuses to write it, and so does this.
	var wsr resource.SchemaResponse
	newWorkerResource().Schema(ctx, resource.SchemaRequest{}, &wsr)
	_, fast := encodeModel(ctx, wsr.Schema.Type(), workerModel{})
	require.False(t, fast)
	worker := tfsdk.State{Schema: wsr.Schema}
	require.True(t, setState(ctx, &worker, workerModel{}).HasError())

	// A number that is not a whole one fails types.Int64's own check, on the way in and out.
	var rsr resource.SchemaResponse
	newReservationResource().Schema(ctx, resource.SchemaRequest{}, &rsr)
	rtyp := rsr.Schema.Type().TerraformType(ctx)
	attrs := map[string]tftypes.Value{}
	for name, at := range rtyp.(tftypes.Object).AttributeTypes {
		attrs[name] = tftypes.NewValue(at, nil)
	}
	attrs["revision"] = tftypes.NewValue(tftypes.Number, big.NewFloat(1.5))
	half := tfsdk.State{Schema: rsr.Schema, Raw: tftypes.NewValue(rtyp, attrs)}
	var r reservationModel
	diags = getState(ctx, half, &r)
	require.True(t, diags.HasError(), "a revision of 1.5 was read")
	require.Contains(t, diags[0].Detail(), "not an integer")

	null := tfsdk.State{Schema: sr.Schema, Raw: tftypes.NewValue(typ, nil)}
	var m activationModel
	require.True(t, getState(ctx, null, &m).HasError(), "a null state reads as the framework refuses it")
}

func BenchmarkReadingAWorkerState(b *testing.B) {
	ctx := context.Background()
	var sr resource.SchemaResponse
	newWorkerResource().Schema(ctx, resource.SchemaRequest{}, &sr)
	state := tfsdk.State{Schema: sr.Schema, Raw: randomObject(rand.New(rand.NewPCG(3, 4)), sr.Schema.Type().TerraformType(ctx))}
	b.Run("framework", func(b *testing.B) {
		for b.Loop() {
			var m workerModel
			_ = state.Get(ctx, &m)
		}
	})
	b.Run("model", func(b *testing.B) {
		for b.Loop() {
			var m workerModel
			_ = getState(ctx, state, &m)
		}
	})
}

// refusingString is a string type whose own check refuses "refused", as types.Int64's refuses a
// fraction: the framework runs such a check on a value's way in and out, and so does the fast path.
type refusingString struct{ basetypes.StringType }

func (refusingString) Validate(_ context.Context, v tftypes.Value, at path.Path) diag.Diagnostics {
	var s string
	if v.IsKnown() && !v.IsNull() && v.As(&s) == nil && s == "refused" {
		return diag.Diagnostics{diag.NewAttributeErrorDiagnostic(at, "Refused", "this value is refused")}
	}
	return nil
}

// A value its attribute type's check refuses is left to the framework both ways, which reports it.
func TestModelsLeaveAValueTheirTypeRefusesToTheFramework(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	typ := basetypes.ObjectType{AttrTypes: map[string]attr.Type{"name": refusingString{}}}
	type model struct {
		Name types.String `tfsdk:"name"`
	}
	raw := func(s string) tftypes.Value {
		return tftypes.NewValue(typ.TerraformType(ctx), map[string]tftypes.Value{"name": tftypes.NewValue(tftypes.String, s)})
	}
	var m model
	require.True(t, decodeModel(ctx, typ, raw("kept"), &m))
	require.Equal(t, "kept", m.Name.ValueString())
	require.False(t, decodeModel(ctx, typ, raw("refused"), &m), "a refused value was read past its type's check")
	_, fast := encodeModel(ctx, typ, model{Name: types.StringValue("kept")})
	require.True(t, fast)
	_, fast = encodeModel(ctx, typ, model{Name: types.StringValue("refused")})
	require.False(t, fast, "a refused value was written past its type's check")
}
