package provider

import (
	"context"
	"fmt"
	"strings"

	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

// settingsOf is the worker's vars, json_vars, compatibility_flags and crons as the Host takes them.
func settingsOf(ctx context.Context, m workerModel) (workerconf.Settings, error) {
	var s workerconf.Settings
	if d := m.Vars.ElementsAs(ctx, &s.Vars, false); d.HasError() {
		return s, fmt.Errorf("vars: %v", d)
	}
	if d := m.JSONVars.ElementsAs(ctx, &s.JSONVars, false); d.HasError() {
		return s, fmt.Errorf("json_vars: %v", d)
	}
	if d := m.CompatibilityFlags.ElementsAs(ctx, &s.CompatibilityFlags, false); d.HasError() {
		return s, fmt.Errorf("compatibility_flags: %v", d)
	}
	if d := m.Crons.ElementsAs(ctx, &s.Crons, false); d.HasError() {
		return s, fmt.Errorf("crons: %v", d)
	}
	return s.Normalize(), nil
}

// hclNames turns the Host API's field names in a settings error into the attributes' names.
var hclNames = strings.NewReplacer("jsonVars", "json_vars", "serviceBindings", "service_bindings", "compatibilityFlags", "compatibility_flags",
	"compatibility flag ", "compatibility_flags entry ", "a required sensitive var", "in required_sensitive_vars")

// validateSettings checks at plan time what the Host would refuse: the same rules, by HCL name.
func (r *workerResource) validateSettings(ctx context.Context, m workerModel, diags *diag.Diagnostics) {
	for _, v := range []attrValue{m.Vars, m.JSONVars, m.CompatibilityFlags, m.RequiredSensitiveVars, m.Crons} {
		if !fullyKnown(v) {
			return
		}
	}
	s, err := settingsOf(ctx, m)
	if err != nil {
		return
	}
	if !m.ServiceBindings.IsNull() && !m.ServiceBindings.IsUnknown() {
		// The names are checked here; the values (worker UIDs, often unknown until apply) by the Host.
		s.ServiceBindings = map[string]string{}
		for name := range m.ServiceBindings.Elements() {
			s.ServiceBindings[name] = "00000000-0000-0000-0000-000000000000"
		}
	}
	var secrets []string
	if !m.RequiredSensitiveVars.IsNull() {
		diags.Append(m.RequiredSensitiveVars.ElementsAs(ctx, &secrets, false)...)
	}
	if err := s.Validate(secrets); err != nil {
		msg := hclNames.Replace(err.Error())
		at := path.Root("vars")
		switch {
		case strings.HasPrefix(msg, "json_vars"):
			at = path.Root("json_vars")
		case strings.HasPrefix(msg, "compatibility_flags"):
			at = path.Root("compatibility_flags")
		case strings.HasPrefix(msg, "service_bindings"):
			at = path.Root("service_bindings")
		case strings.HasPrefix(msg, "cron"):
			diags.AddAttributeError(path.Root("crons"), "Invalid crons", msg+".")
			return
		}
		diags.AddAttributeError(at, "Invalid worker variables or flags", msg+".")
	}
}

// attrValue is what fullyKnown looks at.
type attrValue interface {
	IsUnknown() bool
	IsNull() bool
}

// fullyKnown reports a collection whose elements are all known (a null one is known).
func fullyKnown(v attrValue) bool {
	if v.IsUnknown() {
		return false
	}
	switch c := v.(type) {
	case types.Map:
		for _, e := range c.Elements() {
			if e.IsUnknown() {
				return false
			}
		}
	case types.Set:
		for _, e := range c.Elements() {
			if e.IsUnknown() {
				return false
			}
		}
	}
	return true
}

// mapOrNull is a read-back map for the state: null when the Host holds none and the configuration
// gave none (asNull), so that an omitted attribute never shows a diff against an empty map.
func mapOrNull(ctx context.Context, m map[string]string, asNull bool) types.Map {
	if len(m) == 0 && asNull {
		return types.MapNull(types.StringType)
	}
	v, _ := types.MapValueFrom(ctx, types.StringType, m)
	return v
}
