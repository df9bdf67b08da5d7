package provider

import (
	"context"
	"reflect"
	"sync"

	"github.com/hashicorp/terraform-plugin-framework/attr"
	"github.com/hashicorp/terraform-plugin-framework/attr/xattr"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/tfsdk"
	"github.com/hashicorp/terraform-plugin-go/tftypes"
)

// The framework converts between a model struct and Terraform's value by reflection, looking the
// struct's tags up (and compiling a pattern per tag) on every call. A refresh or a plan converts
// each resource's state, plan and config, so a large configuration pays it hundreds of times.
// These helpers convert models whose every field is a framework value (types.String, types.Map,
// timeouts.Value, …) straight through the schema's attribute types, with the struct's layout
// looked up once per type; any other model, or any value the schema would not take as it is,
// goes through the framework's own Get and Set, which report the mismatch as they always have.

// modelField is one tagged field of a model struct.
type modelField struct {
	index int
	name  string
	typ   reflect.Type
}

var (
	attrValueType   = reflect.TypeFor[attr.Value]()
	validateableTyp = reflect.TypeFor[xattr.ValidateableAttribute]()
	modelLayouts    sync.Map // reflect.Type → []modelField, or nil where the fast path does not apply
)

// layoutOf answers the tagged fields of struct type t, or nil when a field is not a plain
// framework value (untagged, a Go type, or a value with validation of its own).
func layoutOf(t reflect.Type) []modelField {
	if cached, ok := modelLayouts.Load(t); ok {
		return cached.([]modelField)
	}
	var fields []modelField
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("tfsdk")
		if tag == "" || tag == "-" || !f.IsExported() || !f.Type.Implements(attrValueType) || f.Type.Implements(validateableTyp) {
			fields = nil
			break
		}
		fields = append(fields, modelField{index: i, name: tag, typ: f.Type})
	}
	modelLayouts.Store(t, fields)
	return fields
}

// objectTypes answers the attribute types of a schema's object type, or false when the schema
// type is not a plain object.
func objectTypes(typ attr.Type) (map[string]attr.Type, bool) {
	obj, ok := typ.(attr.TypeWithAttributeTypes)
	if !ok {
		return nil, false
	}
	types := obj.AttributeTypes()
	for _, t := range types {
		if t == nil {
			return nil, false
		}
	}
	return types, true
}

// validates answers whether v passes, without a diagnostic, the check the framework makes of an
// attribute's value of type t on its way in and out (types.Int64's: a whole number in range). A
// value with any diagnostic, warnings included, is left to the framework, which reports it.
func validates(ctx context.Context, t attr.Type, v tftypes.Value) bool {
	//nolint:staticcheck // the framework still calls this deprecated interface, so the same check runs here.
	if typed, ok := t.(xattr.TypeWithValidate); ok {
		return len(typed.Validate(ctx, v, path.Empty())) == 0
	}
	return true
}

// decodeModel fills the struct target points to from raw, answering false (target untouched)
// where the framework must do it instead.
func decodeModel(ctx context.Context, schemaType attr.Type, raw tftypes.Value, target any) bool {
	ptr := reflect.ValueOf(target)
	if ptr.Kind() != reflect.Pointer || ptr.IsNil() || ptr.Elem().Kind() != reflect.Struct {
		return false
	}
	fields := layoutOf(ptr.Elem().Type())
	types, ok := objectTypes(schemaType)
	if fields == nil || !ok || len(fields) != len(types) || !raw.IsKnown() || raw.IsNull() {
		return false
	}
	var values map[string]tftypes.Value
	if raw.As(&values) != nil || len(values) != len(fields) {
		return false
	}
	decoded := make([]reflect.Value, len(fields))
	for i, f := range fields {
		t, ok := types[f.name]
		v, present := values[f.name]
		if !ok || !present || !validates(ctx, t, v) {
			return false
		}
		value, err := t.ValueFromTerraform(ctx, v)
		if err != nil || value == nil {
			return false
		}
		rv := reflect.ValueOf(value)
		if !rv.Type().AssignableTo(f.typ) {
			return false
		}
		decoded[i] = rv
	}
	out := ptr.Elem()
	for i, f := range fields {
		out.Field(f.index).Set(decoded[i])
	}
	return true
}

// encodeModel answers the Terraform value of model (a struct or a pointer to one) in the
// schema's object type, or false where the framework must convert it instead.
func encodeModel(ctx context.Context, schemaType attr.Type, model any) (tftypes.Value, bool) {
	rv := reflect.ValueOf(model)
	if rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return tftypes.Value{}, false
		}
		rv = rv.Elem()
	}
	if rv.Kind() != reflect.Struct {
		return tftypes.Value{}, false
	}
	fields := layoutOf(rv.Type())
	types, ok := objectTypes(schemaType)
	if fields == nil || !ok || len(fields) != len(types) {
		return tftypes.Value{}, false
	}
	values := make(map[string]tftypes.Value, len(fields))
	for _, f := range fields {
		t, ok := types[f.name]
		if !ok {
			return tftypes.Value{}, false
		}
		field := rv.Field(f.index).Interface().(attr.Value)
		want := t.TerraformType(ctx)
		if !field.Type(ctx).TerraformType(ctx).Equal(want) { // a zero types.Map, say, has no element type
			return tftypes.Value{}, false
		}
		value, err := field.ToTerraformValue(ctx)
		if err != nil || !value.Type().Equal(want) || !validates(ctx, t, value) {
			return tftypes.Value{}, false
		}
		values[f.name] = value
	}
	objType := schemaType.TerraformType(ctx)
	if tftypes.ValidateValue(objType, values) != nil {
		return tftypes.Value{}, false
	}
	return tftypes.NewValue(objType, values), true
}

// getState, getPlan and getConfig read a model as the framework's Get does.
func getState(ctx context.Context, s tfsdk.State, target any) diag.Diagnostics {
	if decodeModel(ctx, s.Schema.Type(), s.Raw, target) {
		return nil
	}
	return s.Get(ctx, target)
}

func getPlan(ctx context.Context, p tfsdk.Plan, target any) diag.Diagnostics {
	if decodeModel(ctx, p.Schema.Type(), p.Raw, target) {
		return nil
	}
	return p.Get(ctx, target)
}

func getConfig(ctx context.Context, c tfsdk.Config, target any) diag.Diagnostics {
	if decodeModel(ctx, c.Schema.Type(), c.Raw, target) {
		return nil
	}
	return c.Get(ctx, target)
}

// setState, setPlan and setIdentity write a model as the framework's Set does.
func setState(ctx context.Context, s *tfsdk.State, model any) diag.Diagnostics {
	if v, ok := encodeModel(ctx, s.Schema.Type(), model); ok {
		return s.Set(ctx, v)
	}
	return s.Set(ctx, model)
}

func setPlan(ctx context.Context, p *tfsdk.Plan, model any) diag.Diagnostics {
	if v, ok := encodeModel(ctx, p.Schema.Type(), model); ok {
		return p.Set(ctx, v)
	}
	return p.Set(ctx, model)
}

func setIdentity(ctx context.Context, id *tfsdk.ResourceIdentity, model any) diag.Diagnostics {
	if id == nil {
		return id.Set(ctx, model) // as the framework answers a client without identities
	}
	if v, ok := encodeModel(ctx, id.Schema.Type(), model); ok {
		return id.Set(ctx, v)
	}
	return id.Set(ctx, model)
}

func getIdentity(ctx context.Context, id tfsdk.ResourceIdentity, target any) diag.Diagnostics {
	if decodeModel(ctx, id.Schema.Type(), id.Raw, target) {
		return nil
	}
	return id.Get(ctx, target)
}
