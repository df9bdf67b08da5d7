package runtime

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"maps"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/orgproc"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

// scriptRun is what runs for one script: the serving incarnation (admitted; the edge sends its
// requests there), a candidate being admitted beside it, and the last candidate that failed.
type scriptRun struct {
	serving   *running
	candidate *running
	failed    *running
	// problem explains why no candidate could even be built (a delivery that does not open).
	problem string
	// unstartable is the identity whose candidate could not be started, tried again only from
	// retryAt on (or when the Host asks again), the wait doubling up to maxStartBackoff: a script
	// that cannot start must not cost the node a start, and its log a line, on every nudge.
	unstartable string
	retryAt     time.Time
	backoff     time.Duration
	// workerUID is the worker UID the script's entry of n.byUID was made for.
	workerUID string
	// want is the identity of the desired script it was computed for: digesting a bundle costs
	// time by the byte, and reconciles and status reads ask for it far more often than the
	// desired script changes. Written only with n.mu held for writing.
	want wanted
	// reconciles and renders count the work this script cost the node (tests read them).
	reconciles int
	renders    atomic.Int64
}

// wanted is a desired script's identity, for that script value (the desired state is copied on
// write: a changed script is a new value).
type wanted struct {
	of  *state.Script
	id  desiredIdentity
	err error
}

// wantLocked is the identity s should run as (n.mu held). With n.mu held for writing it keeps what
// it computed; a reader (holding it for reading) only uses what is kept, which every reconcile of
// a changed script has just computed.
func (n *Node) wantLocked(r *scriptRun, s *state.Script, writing bool) (desiredIdentity, error) {
	if r.want.of == s {
		return r.want.id, r.want.err
	}
	r.renders.Add(1)
	id, err := identity(s, n.store.Modules)
	if writing && !unreadable(err) {
		r.want = wanted{of: s, id: id, err: err}
	}
	return id, err
}

// running is one incarnation and the deployment it was started for.
type running struct {
	inc Incarnation
	desiredIdentity
}

func (r *scriptRun) incarnations() []Incarnation {
	var out []Incarnation
	for _, x := range []*running{r.serving, r.candidate} {
		if x != nil {
			out = append(out, x.inc)
		}
	}
	return out
}

// desiredIdentity is a desired deployment's incarnation identity and what it reports.
type desiredIdentity struct {
	id           string
	deploymentID string
	generation   int64
	deliveryID   string
	secretNames  []string
}

// identityFormat names how identity digests a deployment: v2 is the isolate's (its code and
// bindings); v1, the process-per-incarnation model's, digested a whole workerd config, with the
// node's egress deny list in it.
const identityFormat = "takoform.runtime-incarnation.v2"

// identity derives the incarnation a script's desired state calls for (SPEC 5, admission): the
// exact bundle digest and config digest. The config is what the isolate is loaded with besides
// its modules: compatibility date and flags, variables, the names of its service bindings and of
// its secrets, and the values by their keyed digest (HMAC under the runtime's key, never a plain
// hash). Which worker a binding reaches, and limits, take effect in place and are not in it. A new
// deployment with the same code, config and secrets is the same incarnation, which simply keeps
// serving. The bundle is read (modules) and checked only on the first identity of its Code.
func identity(s *state.Script, modules func(state.Code) (map[string]string, error)) (desiredIdentity, error) {
	var names []string
	var valuesMAC, deliveryID string
	if s.Delivery != nil {
		names = append(names, s.Delivery.Names...)
		valuesMAC, deliveryID = s.Delivery.ValuesMAC, s.Delivery.DeliveryID
	}
	sort.Strings(names)
	if err := (workerd.Worker{MainModule: s.MainModule, CompatibilityDate: s.CompatibilityDate, Settings: s.Settings, Secrets: names}).ValidateConfig(); err != nil {
		return desiredIdentity{}, err
	}
	bundle, err := s.Modules.Digest(s.MainModule, func() ([32]byte, error) {
		m, err := modules(s.Modules)
		if err != nil {
			return [32]byte{}, &unreadableCode{err: err}
		}
		if err := workerd.CheckModules(m, s.MainModule); err != nil {
			return [32]byte{}, err
		}
		return sha256.Sum256(canonjson.Marshal(canonjson.Object{{Key: "mainModule", Value: s.MainModule}, {Key: "modules", Value: m}})), nil
	})
	if err != nil {
		return desiredIdentity{}, err
	}
	vars, jsonVars := s.Settings.Vars, s.Settings.JSONVars
	if vars == nil {
		vars = map[string]string{}
	}
	if jsonVars == nil {
		jsonVars = map[string]string{}
	}
	config := sha256.Sum256(canonjson.Marshal(canonjson.Object{
		{Key: "script", Value: s.Name},
		{Key: "compatibilityDate", Value: s.CompatibilityDate},
		{Key: "compatibilityFlags", Value: stringsOrEmpty(s.Settings.CompatibilityFlags)},
		{Key: "vars", Value: vars},
		{Key: "jsonVars", Value: jsonVars},
		{Key: "services", Value: slices.Sorted(maps.Keys(s.Settings.ServiceBindings))},
		{Key: "secrets", Value: stringsOrEmpty(names)},
		{Key: "secretsMac", Value: valuesMAC},
	}))
	id := sha256.Sum256(canonjson.Marshal(canonjson.Object{
		{Key: "format", Value: identityFormat},
		{Key: "bundle", Value: hex.EncodeToString(bundle[:])},
		{Key: "config", Value: hex.EncodeToString(config[:])},
	}))
	return desiredIdentity{
		id: "inc-" + hex.EncodeToString(id[:])[:32], deploymentID: s.DeploymentID, generation: s.Generation,
		deliveryID: deliveryID, secretNames: names,
	}, nil
}

// unreadableCode is an identity that could not be derived because the bundle could not be read
// from the node's store: unlike a bundle that does not pass its checks, it may be read the next
// time, so it is neither kept nor final.
type unreadableCode struct{ err error }

func (e *unreadableCode) Error() string {
	return "its code cannot be read from the node's store: " + e.err.Error()
}

func (e *unreadableCode) Unwrap() error { return e.err }

// unreadable reports whether err is an unreadableCode.
func unreadable(err error) bool {
	var u *unreadableCode
	return errors.As(err, &u)
}

func stringsOrEmpty(v []string) []string {
	if v == nil {
		return []string{}
	}
	return v
}

// code is what the router loads s's incarnation from, built when its process asks: its modules are
// read from the node's store then, and the delivered values from the sealed file; both are sent
// and not kept.
func (n *Node) code(s *state.Script) func() (*orgproc.Code, error) {
	return func() (*orgproc.Code, error) {
		modules, err := n.store.Modules(s.Modules)
		if err != nil {
			return nil, err
		}
		c := &orgproc.Code{
			CompatibilityDate: s.CompatibilityDate, CompatibilityFlags: stringsOrEmpty(s.Settings.CompatibilityFlags),
			MainModule: s.MainModule, Modules: make([]orgproc.Module, 0, len(modules)),
			Text: maps.Clone(s.Settings.Vars), JSON: maps.Clone(s.Settings.JSONVars),
			Services: slices.Sorted(maps.Keys(s.Settings.ServiceBindings)),
		}
		if c.Text == nil {
			c.Text = map[string]string{}
		}
		if c.JSON == nil {
			c.JSON = map[string]string{}
		}
		if c.Services == nil {
			c.Services = []string{}
		}
		for _, name := range s.Modules.Names() {
			if workerd.ModuleType(name) == workerconf.ModuleSourceMap {
				continue // kept beside its module for the log, never loaded
			}
			c.Modules = append(c.Modules, orgproc.Module{Name: name, Type: workerd.ModuleType(name), Value: modules[name]})
		}
		if s.Delivery != nil {
			values, err := n.store.OpenSecrets(s.Delivery.WorkerUID, s.Delivery.DeliveryID)
			if err != nil {
				return nil, err
			}
			for name, v := range values {
				c.Text[name] = v.Reveal()
			}
		}
		return c, nil
	}
}
