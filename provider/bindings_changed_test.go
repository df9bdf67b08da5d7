package provider_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/testhost"
)

// TestAccBindingsChangedBetweenPlanAndApplyAreRefused: a saved plan promises the worker the
// reference computed from the values given at plan; an apply of that plan given other values (an
// ephemeral variable read again) is refused, naming the reference that moved and neither value, and
// nothing is sealed. Both CLIs plan again at apply and refuse the moved reference themselves
// ("inconsistent final plan"), before the provider's own check in Create could run.
func TestAccBindingsChangedBetweenPlanAndApplyAreRefused(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	config := `
terraform {
  required_providers {
    takoform = { source = "takoform/takoform" }
  }
}

provider "takoform" {}

variable "greeting" {
  type      = string
  sensitive = true
  ephemeral = true
}
` + graph("changed", "hello", "${var.greeting}", 1)
	w := newWorkspace(t, h.URL, h.Key, config)
	const atPlan, atApply = "plan-value-6d1f0a", "apply-value-77b2c9"
	out, err := w.run("plan", "-input=false", "-no-color", "-out=tfplan", "-var", "greeting="+atPlan)
	require.NoError(t, err, out)
	out, err = w.run("apply", "-input=false", "-no-color", "-var", "greeting="+atApply, "tfplan")
	require.Error(t, err, out)
	require.Regexp(t, `(?s)inconsistent final plan.*takoform_worker_runtime_input\.ri.*\.reference`, out)
	require.NotContains(t, out, atPlan)
	require.NotContains(t, out, atApply)
	var sealed int
	require.NoError(t, h.DB.QueryRow(ctx(t), `SELECT count(*) FROM runtime_input_preparations`).Scan(&sealed))
	require.Zero(t, sealed, "nothing was sealed")

	// Plan and apply together, the same values: it applies.
	out, err = w.run("apply", "-auto-approve", "-input=false", "-no-color", "-var", "greeting="+atApply)
	require.NoError(t, err, out)
	require.False(t, strings.Contains(out, atApply))
	out, err = w.run("destroy", "-auto-approve", "-input=false", "-no-color", "-var", "greeting="+atApply)
	require.NoError(t, err, out)
}
