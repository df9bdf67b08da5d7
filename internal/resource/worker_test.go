package resource

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

func goodWorker() WorkerSpec {
	ref := "rip2.ref"
	return WorkerSpec{Modules: map[string]string{"index.js": "export default {}", "data.json": "{}"}, MainModule: "index.js",
		CompatibilityDate: "2025-01-01", RequiredSensitiveVars: []string{"TOKEN", "API_KEY"}, RuntimeInputReference: &ref}
}

// A worker body is checked on its shape before anything is read, and given back normalized: the
// required vars sorted (a repeat refused), an empty reference as none, module file paths never null.
func TestAWorkerBodyIsCheckedAndNormalized(t *testing.T) {
	t.Parallel()
	spec, err := validateWorker("prod", "api", goodWorker())
	require.NoError(t, err)
	require.Equal(t, []string{"API_KEY", "TOKEN"}, spec.RequiredSensitiveVars)
	require.NotNil(t, spec.ModuleFiles)

	empty := ""
	for name, spoil := range map[string]func(*WorkerSpec){
		"no module":          func(w *WorkerSpec) { w.Modules = nil },
		"a module name":      func(w *WorkerSpec) { w.Modules["../up.js"] = "" },
		"main not a module":  func(w *WorkerSpec) { w.MainModule = "main.js" },
		"not a date":         func(w *WorkerSpec) { w.CompatibilityDate = "2025-13-01" },
		"a future date":      func(w *WorkerSpec) { w.CompatibilityDate = "2999-01-01" },
		"a var name":         func(w *WorkerSpec) { w.RequiredSensitiveVars = []string{"api-key"} },
		"a var named twice":  func(w *WorkerSpec) { w.RequiredSensitiveVars = []string{"TOKEN", "TOKEN"} },
		"secrets, no input":  func(w *WorkerSpec) { w.RuntimeInputReference = &empty },
		"files, one missing": func(w *WorkerSpec) { w.ModuleFiles = map[string]string{"index.js": "./index.js"} },
		"files, another":     func(w *WorkerSpec) { w.ModuleFiles = map[string]string{"index.js": "a", "data.json": "b", "x.js": "c"} },
		"files, a control":   func(w *WorkerSpec) { w.ModuleFiles = map[string]string{"index.js": "a\tb", "data.json": "b"} },
		"files, too long": func(w *WorkerSpec) {
			w.ModuleFiles = map[string]string{"index.js": strings.Repeat("a", 1025), "data.json": "b"}
		},
		"a var beside secrets": func(w *WorkerSpec) { w.Vars = map[string]string{"TOKEN": "plain"} },
		"wasm not base64":      func(w *WorkerSpec) { w.Modules["add.wasm"] = "\x00asm" },
		"data not base64":      func(w *WorkerSpec) { w.Modules["blob.bin"] = "%%%" },
		"main is wasm":         func(w *WorkerSpec) { w.Modules["add.wasm"] = "AGFzbQEAAAA="; w.MainModule = "add.wasm" },
	} {
		w := goodWorker()
		spoil(&w)
		_, err := validateWorker("prod", "api", w)
		require.Error(t, err, name)
		require.True(t, apierr.Is(err, apierr.InvalidRequest), "%s: %v", name, err)
	}
	_, err = validateWorker("Prod!", "api", goodWorker())
	require.True(t, apierr.Is(err, apierr.InvalidRequest))
}

// What deploys is the code, its settings, its secrets and its reference; module file paths are
// not part of it (they move the revision alone).
func TestSameSpecIsWhatDeploys(t *testing.T) {
	t.Parallel()
	spec, err := validateWorker("prod", "api", goodWorker())
	require.NoError(t, err)
	w := Worker{Modules: spec.Modules, ModuleFiles: map[string]string{}, Settings: spec.Settings}
	w.MainModule, w.CompatibilityDate, w.RequiredSensitiveVars, w.RuntimeInputReference = spec.MainModule, spec.CompatibilityDate, spec.RequiredSensitiveVars, spec.RuntimeInputReference
	require.True(t, sameSpec(w, spec))

	moved := spec
	moved.ModuleFiles = map[string]string{"index.js": "./src/index.js", "data.json": "./src/data.json"}
	require.True(t, sameSpec(w, moved), "paths alone deploy nothing")

	for name, change := range map[string]func(*workerPut){
		"code": func(s *workerPut) {
			s.Modules = map[string]string{"index.js": "export default { v: 2 }", "data.json": "{}"}
		},
		"date":      func(s *workerPut) { s.CompatibilityDate = "2025-02-01" },
		"secrets":   func(s *workerPut) { s.RequiredSensitiveVars = []string{"API_KEY"} },
		"reference": func(s *workerPut) { other := "rip2.other"; s.RuntimeInputReference = &other },
		"vars":      func(s *workerPut) { s.Settings.Vars = map[string]string{"LEVEL": "debug"} },
	} {
		c := spec
		change(&c)
		require.False(t, sameSpec(w, c), name)
	}
}

// Ready is derived, in the order the conditions are checked: a deleted, deleting, failed or
// pending worker is not Ready whatever else holds, and a worker whose input is not delivered is
// not Ready though its deployment is active.
func TestReadinessIsDerivedInItsOrder(t *testing.T) {
	t.Parallel()
	settled := dbsqlc.RuntimeInputStatusSettled
	ref := "rip2.ref"
	live := func() Worker {
		w := Worker{}
		w.Status, w.DeploymentStatus = dbsqlc.ResourceStatusLive, string(dbsqlc.DeploymentStatusActive)
		return w
	}
	require.Equal(t, "DeploymentActive", live().conditions()[0].Reason)
	require.True(t, live().Ready())
	for reason, w := range map[string]func(*Worker){
		"Deleted":             func(w *Worker) { w.Status = dbsqlc.ResourceStatusDeleted },
		"Deleting":            func(w *Worker) { w.Status = dbsqlc.ResourceStatusDeleting },
		"ScriptNameCollision": func(w *Worker) { w.ScriptCollision = true },
		"DeploymentFailed":    func(w *Worker) { w.DeploymentStatus = string(dbsqlc.DeploymentStatusFailed) },
		"DeploymentPending":   func(w *Worker) { w.Status = dbsqlc.ResourceStatusCreating },
		"RuntimeInputPending": func(w *Worker) { w.RuntimeInputReference, w.RuntimeInputStatus = &ref, &settled },
	} {
		x := live()
		w(&x)
		c := x.conditions()[0]
		require.Equal(t, reason, c.Reason)
		require.Equal(t, "False", c.Status, reason)
		require.False(t, x.Ready(), reason)
	}
}
