package desired

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

var now = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// fixture is a node holding two organizations' scripts: "app" (worker uid-a of org-1, generation
// 5, one delivery, admitted and serving) and "other" (uid-b of org-2, no secrets); "gone" was
// deleted at generation 7; one hostname is routed; one effect of each kind is remembered; two
// deliveries are refused (one for longer than RefusedFor); org-1 is braked.
func fixture() state.Desired {
	return state.Desired{
		Version: 1,
		Scripts: map[string]*state.Script{
			"app": {
				Name: "app", WorkerUID: "uid-a", DeploymentID: "dep-5", Generation: 5,
				Labels:  adminapi.Labels{Organization: "org-1", Space: "prod", Worker: "api"},
				Modules: state.NewCode(map[string]string{"index.js": "v5"}), MainModule: "index.js", CompatibilityDate: "2025-01-01",
				Settings:    workerconf.Settings{Vars: map[string]string{"MODE": "live"}},
				SecretNames: []string{"TOKEN"}, BundleDigest: "sha256:5",
				Delivery: &state.Delivery{DeliveryID: "d-1", WorkerUID: "uid-a", Names: []string{"TOKEN"}, ValuesMAC: "mac-v1"},
				Admitted: "inc-5", Serving: &state.Served{DeploymentID: "dep-5", Generation: 5, Modules: state.NewCode(map[string]string{"index.js": "v5"}), MainModule: "index.js", DeliveryID: "d-1"},
			},
			"other": {
				Name: "other", WorkerUID: "uid-b", DeploymentID: "dep-b", Generation: 3,
				Labels:  adminapi.Labels{Organization: "org-2", Space: "prod", Worker: "web"},
				Modules: state.NewCode(map[string]string{"index.js": "b"}), MainModule: "index.js", CompatibilityDate: "2025-01-01",
			},
		},
		Routes: map[string]*state.Route{
			"app.example": {Hostname: "app.example", ScriptName: "app", EndpointUID: "ep-a", DeploymentID: "dep-5"},
		},
		Brakes: []adminapi.BrakeScope{{Organization: "org-1"}},
		Effects: map[string]state.EffectEntry{
			"e-script": {Target: "script:app", RequestMAC: "mac-script", At: now.Add(-time.Hour)},
			"e-secret": {Target: "secrets:app", RequestMAC: "mac-secret", At: now.Add(-time.Hour)},
			"e-route":  {Target: "route:app.example", RequestMAC: "mac-route", At: now.Add(-time.Hour)},
		},
		Floors:  map[string]int64{"gone": 7},
		Refused: map[string]time.Time{"d-late": now.Add(-time.Hour), "d-old": now.Add(-RefusedFor - time.Minute)},
		OrgUIDs: map[string]int{"org-1": 100001, "org-2": 100002},
	}
}

// withApp6 is the fixture once generation 6 of "app" is desired while generation 5 serves.
func withApp6() state.Desired {
	d := fixture()
	a := *d.Scripts["app"]
	a.DeploymentID, a.Generation, a.Modules = "dep-6", 6, state.NewCode(map[string]string{"index.js": "v6"})
	d.Scripts["app"] = &a
	return d
}

// deploy is a put of script name for uid at generation gen, with the content the fixture's
// "app" has at generation 5 (but gen), under a new effect.
func deploy(name, uid string, gen int64, secrets ...string) PutScript {
	return PutScript{Effect: fresh("e-new"), Script: state.Script{
		Name: name, WorkerUID: uid, DeploymentID: fmt.Sprintf("dep-%d", gen), Generation: gen,
		Labels:  adminapi.Labels{Organization: "org-1", Space: "prod", Worker: "api"},
		Modules: state.NewCode(map[string]string{"index.js": fmt.Sprintf("v%d", gen)}), MainModule: "index.js", CompatibilityDate: "2025-01-01",
		Settings:    workerconf.Settings{Vars: map[string]string{"MODE": "live"}},
		SecretNames: secrets, BundleDigest: fmt.Sprintf("sha256:%d", gen),
	}}
}

func fresh(id string) Effect { return Effect{ID: id, RequestMAC: "mac-" + id, At: now} }

// deployed is what the state holds after deploy(...) was accepted onto cur (nil: a new script).
func deployed(op PutScript, cur *state.Script) *state.Script {
	s := op.Script
	if cur != nil {
		s.Delivery, s.Admitted, s.Serving = cur.Delivery, cur.Admitted, cur.Serving
	}
	return &s
}

func remember(d *state.Desired, e Effect, target string) {
	d.Effects[e.ID] = state.EffectEntry{Target: target, RequestMAC: e.RequestMAC, At: e.At}
}

type row struct {
	name string // the rule the row holds the node to
	// given is the state before (nil: the fixture).
	given func() state.Desired
	op    Op
	// refused is the code of the refusal expected ("" accepted) and shows what it may show;
	// omits are words its detail must not carry (the holder's identity).
	refused string
	shows   Subject
	omits   []string
	// answer is the decision expected (its Refused aside).
	answer Answer
	// after edits the given state into the one expected; nil: unchanged.
	after func(d *state.Desired)
}

func rows() []row {
	putApp6 := deploy("app", "uid-a", 6, "TOKEN")
	putApp6NoSecrets := deploy("app", "uid-a", 6)
	sameAgain := deploy("app", "uid-a", 5, "TOKEN")
	sameAgain.Script.DeploymentID = "dep-5"
	sameAgain.Script.Modules = state.NewCode(map[string]string{"index.js": "v5"})
	otherContent := deploy("app", "uid-a", 5, "TOKEN")
	otherContent.Script.Modules = state.NewCode(map[string]string{"index.js": "changed"})
	newScript := deploy("fresh", "uid-n", 1)
	aboveFloor := deploy("gone", "uid-z", 8)
	attack := deploy("app", "uid-x", 1_000_000, "TOKEN")
	attack.Script.Labels.Organization = "org-9"
	replayScript := attack // a replay is recognised before any fence: its content was judged then
	replayScript.Effect = Effect{ID: "e-script", RequestMAC: "mac-script", At: now}
	effectReusedElsewhere := deploy("other", "uid-b", 4)
	effectReusedElsewhere.Effect = Effect{ID: "e-script", RequestMAC: "mac-script", At: now}
	effectReusedChanged := deploy("app", "uid-a", 6, "TOKEN")
	effectReusedChanged.Effect = Effect{ID: "e-script", RequestMAC: "mac-another", At: now}

	delivery := func(name, uid, id string, names ...string) PutSecrets {
		return PutSecrets{Effect: fresh("e-deliver"), Name: name, Delivery: state.Delivery{DeliveryID: id, WorkerUID: uid, Names: names, ValuesMAC: "mac-" + id}}
	}
	newDelivery := delivery("app", "uid-a", "d-2", "TOKEN")
	replayDelivery := delivery("app", "uid-x", "d-late", "X")
	restoredLate := delivery("app", "uid-a", "d-late", "TOKEN")
	restoredLate.Restore = true
	replayDelivery.Effect = Effect{ID: "e-secret", RequestMAC: "mac-secret", At: now}
	conflictingDelivery := delivery("app", "uid-a", "d-2", "TOKEN")
	conflictingDelivery.Effect = Effect{ID: "e-secret", RequestMAC: "mac-another", At: now}

	route := func(host, script, endpoint string) PutRoute {
		return PutRoute{Effect: fresh("e-newroute"), Route: state.Route{Hostname: host, ScriptName: script, EndpointUID: endpoint, DeploymentID: "dep"}}
	}
	newRoute := route("new.example", "other", "ep-b")
	repointed := route("app.example", "other", "ep-a")
	replayRoute := route("app.example", "other", "ep-someone")
	replayRoute.Effect = Effect{ID: "e-route", RequestMAC: "mac-route", At: now}
	routeEffectElsewhere := route("new.example", "other", "ep-b")
	routeEffectElsewhere.Effect = Effect{ID: "e-route", RequestMAC: "mac-route", At: now}

	rs := []row{
		// PutScript.
		{name: "a new script name is deployed and reconciled", op: newScript,
			answer: Answer{Changed: true, RetryFailed: true, Reconcile: "fresh"},
			after: func(d *state.Desired) {
				d.Scripts["fresh"] = deployed(newScript, nil)
				remember(d, newScript.Effect, "script:fresh")
			}},
		{name: "a newer generation of the holder replaces its deployment and keeps its delivery and what it serves", op: putApp6,
			answer: Answer{Changed: true, RetryFailed: true, Reconcile: "app"},
			after: func(d *state.Desired) {
				d.Scripts["app"] = deployed(putApp6, d.Scripts["app"])
				remember(d, putApp6.Effect, "script:app")
			}},
		{name: "the same generation with the same content under a new effect id is accepted", op: sameAgain,
			answer: Answer{Changed: true, RetryFailed: true, Reconcile: "app"},
			after: func(d *state.Desired) {
				d.Scripts["app"] = deployed(sameAgain, d.Scripts["app"])
				remember(d, sameAgain.Effect, "script:app")
			}},
		{name: "a new revision that declares no secrets keeps no values: its delivery is dropped and erased", op: putApp6NoSecrets,
			answer: Answer{Changed: true, RetryFailed: true, Reconcile: "app", Erase: "uid-a"},
			after: func(d *state.Desired) {
				s := deployed(putApp6NoSecrets, d.Scripts["app"])
				s.Delivery = nil
				d.Scripts["app"] = s
				remember(d, putApp6NoSecrets.Effect, "script:app")
			}},
		{name: "an older generation of the holder is stale: a late copy never reverts a newer deployment", op: deploy("app", "uid-a", 4, "TOKEN"),
			refused: adminapi.CodeStaleGeneration, shows: ShowsScript},
		{name: "the same generation with other content is a generation conflict", op: otherContent,
			refused: adminapi.CodeGenerationConflict, shows: ShowsScript},
		{name: "another worker UID's put is refused as held whatever its generation, naming nobody", op: attack,
			refused: adminapi.CodeScriptHeld, shows: ShowsNothing, omits: []string{"uid-a", "org-1", "dep-5"}},
		{name: "a put at the floor of a deleted name never revives it", op: deploy("gone", "uid-g", 7),
			refused: adminapi.CodeStaleGeneration, shows: ShowsScript},
		{name: "a put below the floor of a deleted name never revives it, from any worker UID", op: deploy("gone", "uid-other", 3),
			refused: adminapi.CodeStaleGeneration, shows: ShowsScript},
		{name: "a put above the floor of a deleted name deploys it", op: aboveFloor,
			answer: Answer{Changed: true, RetryFailed: true, Reconcile: "gone"},
			after: func(d *state.Desired) {
				d.Scripts["gone"] = deployed(aboveFloor, nil)
				remember(d, aboveFloor.Effect, "script:gone")
			}},
		{name: "a replayed script put answers replayed before any fence and changes nothing", op: replayScript,
			answer: Answer{Replayed: true}},
		{name: "an effect id reused with another request is refused", op: effectReusedChanged,
			refused: adminapi.CodeEffectConflict, shows: ShowsNothing},
		{name: "an effect id reused on another script is refused", op: effectReusedElsewhere,
			refused: adminapi.CodeEffectConflict, shows: ShowsNothing},

		// DeleteScript.
		{name: "the holder's delete removes the script, keeps its generation as the floor, and its values and log go with it", op: DeleteScript{Name: "app", WorkerUID: "uid-a"},
			answer: Answer{Changed: true, Erase: "uid-a", DropLog: "uid-a", Reconcile: "app", AwaitStop: true},
			after: func(d *state.Desired) {
				delete(d.Scripts, "app")
				d.Floors["app"] = 5
			}},
		{name: "the delete of a script without a delivery erases nothing", op: DeleteScript{Name: "other", WorkerUID: "uid-b"},
			answer: Answer{Changed: true, DropLog: "uid-b", Reconcile: "other", AwaitStop: true},
			after: func(d *state.Desired) {
				delete(d.Scripts, "other")
				d.Floors["other"] = 3
			}},
		{name: "a delete never lowers a floor",
			given: func() state.Desired {
				d := fixture()
				d.Floors["app"] = 9
				return d
			},
			op:     DeleteScript{Name: "app", WorkerUID: "uid-a"},
			answer: Answer{Changed: true, Erase: "uid-a", DropLog: "uid-a", Reconcile: "app", AwaitStop: true},
			after:  func(d *state.Desired) { delete(d.Scripts, "app") }},
		{name: "a delete naming another worker UID (a successor's script) changes nothing", op: DeleteScript{Name: "app", WorkerUID: "uid-b"}},
		{name: "the delete of an absent script changes nothing", op: DeleteScript{Name: "gone", WorkerUID: "uid-g"}},

		// PutSecrets.
		{name: "a delivery for the holder naming exactly its declared secrets lands once sealed", op: newDelivery,
			answer: Answer{Changed: true, Seal: true, RetryFailed: true, Reconcile: "app"},
			after: func(d *state.Desired) {
				d.Scripts["app"].Delivery = &newDelivery.Delivery
				remember(d, newDelivery.Effect, "secrets:app")
			}},
		{name: "a delivery a readback concluded absent never lands", op: delivery("app", "uid-a", "d-late", "TOKEN"),
			refused: adminapi.CodeDeliveryRefused, shows: ShowsNothing},
		{name: "a delivery the Host restores (it settled) lands though a pool's readback refused it here", op: restoredLate,
			answer: Answer{Changed: true, Seal: true, RetryFailed: true, Reconcile: "app"},
			after: func(d *state.Desired) {
				delete(d.Refused, "d-late")
				d.Scripts["app"].Delivery = &restoredLate.Delivery
				remember(d, restoredLate.Effect, "secrets:app")
			}},
		{name: "a refused delivery is refused before the script is looked at", op: delivery("absent", "uid-x", "d-late", "X"),
			refused: adminapi.CodeDeliveryRefused, shows: ShowsNothing},
		{name: "a delivery to an absent script is refused", op: delivery("absent", "uid-a", "d-2", "TOKEN"),
			refused: adminapi.CodeScriptAbsent, shows: ShowsNothing},
		{name: "a delivery from another worker UID is refused, naming nobody", op: delivery("app", "uid-x", "d-x", "TOKEN"),
			refused: adminapi.CodeWorkerMismatch, shows: ShowsNothing, omits: []string{"uid-a", "org-1"}},
		{name: "a delivery naming other secrets than the script declares is refused", op: delivery("app", "uid-a", "d-2", "OTHER"),
			refused: adminapi.CodeSecretNames, shows: ShowsNothing},
		{name: "a delivery naming fewer secrets than the script declares is refused",
			given: func() state.Desired {
				d := fixture()
				d.Scripts["app"].SecretNames = []string{"KEY", "TOKEN"}
				return d
			},
			op: delivery("app", "uid-a", "d-2", "TOKEN"), refused: adminapi.CodeSecretNames, shows: ShowsNothing},
		{name: "a replayed delivery answers replayed before any fence and changes nothing", op: replayDelivery,
			answer: Answer{Replayed: true}},
		{name: "a delivery's effect id reused with other values is refused", op: conflictingDelivery,
			refused: adminapi.CodeEffectConflict, shows: ShowsNothing},

		// DeleteSecrets.
		{name: "the holder's secrets delete drops its delivery, erases the values and reconciles", op: DeleteSecrets{Name: "app", WorkerUID: "uid-a"},
			answer: Answer{Changed: true, Erase: "uid-a", Reconcile: "app"},
			after:  func(d *state.Desired) { d.Scripts["app"].Delivery = nil }},
		{name: "a secrets delete naming another worker UID changes nothing", op: DeleteSecrets{Name: "app", WorkerUID: "uid-b"}},
		{name: "a secrets delete of a script without a delivery changes nothing", op: DeleteSecrets{Name: "other", WorkerUID: "uid-b"}},
		{name: "a secrets delete of an absent script changes nothing", op: DeleteSecrets{Name: "gone", WorkerUID: "uid-g"}},

		// ConcludeAbsent.
		{name: "a readback concluding a delivery the script does not hold refuses it and forgets refusals past RefusedFor", op: ConcludeAbsent{Name: "app", DeliveryID: "d-9", At: now},
			answer: Answer{Changed: true},
			after: func(d *state.Desired) {
				delete(d.Refused, "d-old")
				d.Refused["d-9"] = now
			}},
		{name: "a readback concluding for an absent script refuses the delivery", op: ConcludeAbsent{Name: "gone", DeliveryID: "d-9", At: now},
			answer: Answer{Changed: true},
			after: func(d *state.Desired) {
				delete(d.Refused, "d-old")
				d.Refused["d-9"] = now
			}},
		{name: "a readback concluding the delivery the script holds refuses nothing", op: ConcludeAbsent{Name: "app", DeliveryID: "d-1", At: now}},
		{name: "a readback concluding a delivery refused already keeps its first time", op: ConcludeAbsent{Name: "app", DeliveryID: "d-late", At: now}},

		// PutRoute.
		{name: "a free hostname is routed", op: newRoute,
			answer: Answer{Changed: true},
			after: func(d *state.Desired) {
				d.Routes["new.example"] = &newRoute.Route
				remember(d, newRoute.Effect, "route:new.example")
			}},
		{name: "an endpoint's hostname moves to another script of the same endpoint", op: repointed,
			answer: Answer{Changed: true},
			after: func(d *state.Desired) {
				d.Routes["app.example"] = &repointed.Route
				remember(d, repointed.Effect, "route:app.example")
			}},
		{name: "a hostname routed for another endpoint is refused: no two endpoints, of any tenants, share one", op: route("app.example", "other", "ep-b"),
			refused: adminapi.CodeRouteConflict, shows: ShowsRoute},
		{name: "a replayed route put answers replayed before any fence and changes nothing", op: replayRoute,
			answer: Answer{Replayed: true}},
		{name: "a route's effect id reused on another hostname is refused", op: routeEffectElsewhere,
			refused: adminapi.CodeEffectConflict, shows: ShowsNothing},

		// DeleteRoute.
		{name: "a route delete naming what is there removes it", op: DeleteRoute{Hostname: "app.example", ScriptName: "app", EndpointUID: "ep-a"},
			answer: Answer{Changed: true},
			after:  func(d *state.Desired) { delete(d.Routes, "app.example") }},
		{name: "a route delete naming another script never removes its successor", op: DeleteRoute{Hostname: "app.example", ScriptName: "other", EndpointUID: "ep-a"}},
		{name: "a route delete naming another endpoint never removes its successor", op: DeleteRoute{Hostname: "app.example", ScriptName: "app", EndpointUID: "ep-b"}},
		{name: "the delete of an absent route changes nothing", op: DeleteRoute{Hostname: "none.example", ScriptName: "app", EndpointUID: "ep-a"}},

		// SetBrake.
		{name: "engaging a brake adds its scope and wakes held restarts", op: SetBrake{Scope: adminapi.BrakeScope{Organization: "org-2", Space: "prod", Worker: "web"}, Engaged: true},
			answer: Answer{Changed: true, WakeAll: true},
			after: func(d *state.Desired) {
				d.Brakes = append(d.Brakes, adminapi.BrakeScope{Organization: "org-2", Space: "prod", Worker: "web"})
			}},
		{name: "releasing a brake removes exactly its scope and wakes held restarts", op: SetBrake{Scope: adminapi.BrakeScope{Organization: "org-1"}},
			answer: Answer{Changed: true, WakeAll: true},
			after:  func(d *state.Desired) { d.Brakes = []adminapi.BrakeScope{} }},
		{name: "engaging an engaged brake changes nothing", op: SetBrake{Scope: adminapi.BrakeScope{Organization: "org-1"}, Engaged: true}},
		{name: "releasing a brake that is not engaged changes nothing", op: SetBrake{Scope: adminapi.BrakeScope{}}},

		// Admit.
		{name: "a newer deployment admitted is what the script serves from then on", given: withApp6,
			op:     Admit{Name: "app", Incarnation: "inc-6", DeliveryID: "d-1"},
			answer: Answer{Changed: true},
			after: func(d *state.Desired) {
				a := d.Scripts["app"]
				a.Admitted = "inc-6"
				a.Serving = &state.Served{DeploymentID: "dep-6", Generation: 6, Modules: a.Modules, MainModule: a.MainModule,
					CompatibilityDate: a.CompatibilityDate, Settings: a.Settings, DeliveryID: "d-1"}
			}},
		{name: "a new incarnation of the deployment served (a new delivery) is admitted", op: Admit{Name: "app", Incarnation: "inc-5b", DeliveryID: "d-2"},
			answer: Answer{Changed: true},
			after: func(d *state.Desired) {
				d.Scripts["app"].Admitted = "inc-5b"
				d.Scripts["app"].Serving.DeliveryID = "d-2"
				d.Scripts["app"].Serving.Settings = d.Scripts["app"].Settings
				d.Scripts["app"].Serving.CompatibilityDate = d.Scripts["app"].CompatibilityDate
			}},
		{name: "a new deployment of the same code is the same incarnation, which now serves that deployment",
			given: func() state.Desired {
				d := withApp6()
				d.Scripts["app"].Modules = state.NewCode(map[string]string{"index.js": "v5"})
				return d
			},
			op:     Admit{Name: "app", Incarnation: "inc-5", DeliveryID: "d-1"},
			answer: Answer{Changed: true},
			after: func(d *state.Desired) {
				a := d.Scripts["app"]
				a.Serving = &state.Served{DeploymentID: "dep-6", Generation: 6, Modules: a.Modules, MainModule: a.MainModule,
					CompatibilityDate: a.CompatibilityDate, Settings: a.Settings, DeliveryID: "d-1"}
			}},
		{name: "admitting the incarnation already admitted for the deployment changes nothing", op: Admit{Name: "app", Incarnation: "inc-5", DeliveryID: "d-1"}},
		{name: "admitting for a deleted script changes nothing", op: Admit{Name: "gone", Incarnation: "inc-g"}},

		// AssignOrgUID.
		{name: "an organization without a sandbox uid is given one", op: AssignOrgUID{Organization: "org-3", UID: 100003},
			answer: Answer{Changed: true},
			after:  func(d *state.Desired) { d.OrgUIDs["org-3"] = 100003 }},
		{name: "an organization keeps its sandbox uid for good", op: AssignOrgUID{Organization: "org-1", UID: 100009}},
		{name: "a sandbox uid never passes to another organization, and the refusal names none", op: AssignOrgUID{Organization: "org-3", UID: 100001},
			refused: CodeUIDHeld, shows: ShowsNothing, omits: []string{"org-1"}},
	}
	// A node that has never been written holds no maps at all: every operation starts from there.
	empty := func() state.Desired { return state.Desired{Version: 1} }
	first := deploy("first", "uid-f", 1)
	rs = append(rs,
		row{name: "a fresh node takes its first script", given: empty, op: first,
			answer: Answer{Changed: true, RetryFailed: true, Reconcile: "first"},
			after: func(d *state.Desired) {
				d.Scripts = map[string]*state.Script{"first": deployed(first, nil)}
				d.Effects = map[string]state.EffectEntry{}
				remember(d, first.Effect, "script:first")
			}},
		row{name: "a fresh node refuses its first concluded delivery", given: empty, op: ConcludeAbsent{Name: "app", DeliveryID: "d-9", At: now},
			answer: Answer{Changed: true},
			after:  func(d *state.Desired) { d.Refused = map[string]time.Time{"d-9": now} }},
		row{name: "a fresh node gives its first organization a uid", given: empty, op: AssignOrgUID{Organization: "org-1", UID: 100001},
			answer: Answer{Changed: true},
			after:  func(d *state.Desired) { d.OrgUIDs = map[string]int{"org-1": 100001} }},
		row{name: "a fresh node's delete changes nothing", given: empty, op: DeleteScript{Name: "app", WorkerUID: "uid-a"}},
		row{name: "a fresh node's route delete changes nothing", given: empty, op: DeleteRoute{Hostname: "app.example", ScriptName: "app", EndpointUID: "ep-a"}},
	)
	// One generation is one content: a put of the holder's generation that differs in anything
	// is a conflict, never an overwrite.
	for field, change := range map[string]func(s *state.Script){
		"deployment id":      func(s *state.Script) { s.DeploymentID = "dep-other" },
		"worker label":       func(s *state.Script) { s.Labels.Worker = "renamed" },
		"main module":        func(s *state.Script) { s.MainModule = "other.js" },
		"compatibility date": func(s *state.Script) { s.CompatibilityDate = "2025-06-01" },
		"bundle digest":      func(s *state.Script) { s.BundleDigest = "sha256:other" },
		"variable":           func(s *state.Script) { s.Settings.Vars = map[string]string{"MODE": "test"} },
		"secret name list":   func(s *state.Script) { s.SecretNames = []string{"KEY", "TOKEN"} },
	} {
		op := deploy("app", "uid-a", 5, "TOKEN")
		op.Script.DeploymentID, op.Script.Modules = "dep-5", state.NewCode(map[string]string{"index.js": "v5"})
		change(&op.Script)
		rs = append(rs, row{name: "the same generation with another " + field + " is a generation conflict", op: op,
			refused: adminapi.CodeGenerationConflict, shows: ShowsScript})
	}
	return rs
}

// TestApply holds every transition and fence of the node's desired state to one row: the
// decision, the state that results, and that the state given is never modified.
func TestApply(t *testing.T) {
	t.Parallel()
	for _, tc := range rows() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			given := fixture
			if tc.given != nil {
				given = tc.given
			}
			s := given()
			before := persisted(t, s)
			got, a := Apply(s, tc.op)
			require.JSONEq(t, before, persisted(t, s), "Apply modified the state it was given")

			if tc.refused != "" {
				require.NotNil(t, a.Refused, "want refused as %s", tc.refused)
				require.Equal(t, tc.refused, a.Refused.Code, a.Refused.Detail)
				require.Equal(t, tc.shows, a.Refused.Shows, "what the refusal shows")
				for _, w := range tc.omits {
					require.NotContains(t, a.Refused.Detail, w, "the refusal names nobody")
				}
			} else {
				require.Nil(t, a.Refused)
			}
			a.Refused = nil
			require.Equal(t, tc.answer, a)

			want := given()
			if tc.after != nil {
				tc.after(&want)
			}
			require.JSONEq(t, persisted(t, want), persisted(t, got))
		})
	}
}

// persisted is the state as the node writes it to desired.json.
func persisted(t *testing.T, d state.Desired) string {
	t.Helper()
	b, err := json.Marshal(d)
	require.NoError(t, err)
	return string(b)
}

// TestTheOldestEffectsAreForgottenBeyondMaxEffects: the remembered effect ids are bounded, and
// the ones forgotten are the oldest (ties by id, so two nodes forget the same).
func TestTheOldestEffectsAreForgottenBeyondMaxEffects(t *testing.T) {
	t.Parallel()
	s := fixture()
	s.Effects = map[string]state.EffectEntry{}
	for i := range MaxEffects {
		s.Effects[fmt.Sprintf("e-%05d", i)] = state.EffectEntry{Target: "route:x", RequestMAC: "m", At: now.Add(time.Duration(i%(MaxEffects/2)) * time.Second)}
	}
	newest := fresh("e-newest")
	newest.At = now.Add(MaxEffects * time.Second)
	op := PutRoute{Effect: newest, Route: state.Route{Hostname: "new.example", ScriptName: "app", EndpointUID: "ep-n"}}
	got, a := Apply(s, op)
	require.True(t, a.Changed)
	require.Len(t, got.Effects, keptEffects, "past the bound, the oldest tenth goes at once")
	require.Contains(t, got.Effects, "e-newest")
	require.NotContains(t, got.Effects, "e-00000", "the oldest is forgotten")
	// Pairs of one arrival (e-i and e-(i+5000)) go oldest first: 500 pairs, and of the 501st, the
	// first by id.
	require.NotContains(t, got.Effects, "e-00500")
	require.Contains(t, got.Effects, "e-05500", "of two as old, the first by id goes")
	require.Contains(t, got.Effects, "e-00501")
	require.Len(t, s.Effects, MaxEffects, "the state given keeps its effects")
}

// An effect recorded before a sealing-key rotation is recognised as a replay by its digest under
// the previous key; another request under the same id is still refused.
func TestAnEffectFromBeforeARotationIsStillAReplay(t *testing.T) {
	t.Parallel()
	e := Effect{ID: "e-route", RequestMAC: "mac-under-the-new-key", PreviousMAC: "mac-route", At: now}
	s := fixture()
	replayed, refused := replay(&s, e, "route:app.example")
	require.Nil(t, refused)
	require.True(t, replayed)
	e.PreviousMAC = "mac-of-another-request"
	_, refused = replay(&s, e, "route:app.example")
	require.NotNil(t, refused)
	require.Equal(t, adminapi.CodeEffectConflict, refused.Code)
}
