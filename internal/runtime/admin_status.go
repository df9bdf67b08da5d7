package runtime

import (
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/desired"
)

func (n *Node) status(_ http.ResponseWriter, _ *http.Request) (any, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	out := adminapi.Status{Scripts: []adminapi.ScriptStatus{}, Routes: []adminapi.RouteStatus{}, Brakes: n.brakesLocked(), Sandbox: n.sandboxMode(), Boot: n.member.boot}
	for _, name := range slices.Sorted(maps.Keys(n.desired.Scripts)) {
		out.Scripts = append(out.Scripts, n.scriptStatusLocked(name))
		out.GenerationFloor = max(out.GenerationFloor, n.desired.Scripts[name].Generation)
	}
	for _, floor := range n.desired.Floors {
		out.GenerationFloor = max(out.GenerationFloor, floor)
	}
	for _, host := range slices.Sorted(maps.Keys(n.desired.Routes)) {
		out.Routes = append(out.Routes, n.routeStatusLocked(host))
	}
	return out, nil
}

func (n *Node) brakesLocked() adminapi.Brakes {
	return adminapi.Brakes{Lifecycle: append([]adminapi.BrakeScope{}, n.desired.Brakes...)}
}

func (n *Node) getBrakes(_ http.ResponseWriter, _ *http.Request) (any, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.brakesLocked(), nil
}

// setLifecycleBrake engages or releases the brake of exactly one scope (desired.SetBrake).
func (n *Node) setLifecycleBrake(_ http.ResponseWriter, r *http.Request) (any, error) {
	var req adminapi.BrakeSet
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	if !req.Scope.Valid() {
		return nil, invalid("a brake scope is global, an organization, or an organization's space and worker")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, _, err := n.applyLocked(desired.SetBrake{Scope: req.Scope, Engaged: req.Engaged}, "", nil); err != nil {
		return nil, err
	}
	n.log.Info("lifecycle brake", "engaged", req.Engaged, "scope", scopeText(req.Scope))
	return n.brakesLocked(), nil
}

func scopeText(s adminapi.BrakeScope) string {
	parts := []string{}
	for _, p := range []struct{ k, v string }{{"org", s.Organization}, {"space", s.Space}, {"worker", s.Worker}} {
		if p.v != "" {
			parts = append(parts, p.k+"="+p.v)
		}
	}
	if len(parts) == 0 {
		return "global"
	}
	return strings.Join(parts, " ")
}
