package runtime

import (
	"net/http"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/desired"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// putRoute routes a hostname to a script for one endpoint UID (desired.PutRoute).
func (n *Node) putRoute(w http.ResponseWriter, r *http.Request) (any, error) {
	host, err := hostname(r)
	if err != nil {
		return nil, err
	}
	var req adminapi.RoutePut
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	if err := checkID("effectId", req.EffectID); err != nil {
		return nil, err
	}
	if !vocab.Name.MatchString(req.ScriptName) {
		return nil, invalid("scriptName %q does not match %s", req.ScriptName, vocab.NamePattern)
	}
	if err := checkID("endpointUid", req.EndpointUID); err != nil {
		return nil, err
	}
	if err := checkID("deploymentId", req.DeploymentID); err != nil {
		return nil, err
	}
	op := desired.PutRoute{Effect: n.effect(req.EffectID, req),
		Route: state.Route{Hostname: host, ScriptName: req.ScriptName, EndpointUID: req.EndpointUID, DeploymentID: req.DeploymentID}}
	n.mu.Lock()
	defer n.mu.Unlock()
	a, _, err := n.applyLocked(op, host, nil)
	if err != nil {
		return nil, err
	}
	if a.Replayed {
		replayed(w)
	} else {
		n.log.Info("route installed", "hostname", host, "script", req.ScriptName, "endpointUid", req.EndpointUID, "effectId", req.EffectID)
	}
	return n.routeStatusLocked(host), nil
}

// getRoute answers one hostname's route, present or not.
func (n *Node) getRoute(_ http.ResponseWriter, r *http.Request) (any, error) {
	host, err := hostname(r)
	if err != nil {
		return nil, err
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.routeStatusLocked(host), nil
}

// deleteRoute is compare-and-delete (SPEC 5; desired.DeleteRoute). The answer is what is there
// afterwards.
func (n *Node) deleteRoute(_ http.ResponseWriter, r *http.Request) (any, error) {
	host, err := hostname(r)
	if err != nil {
		return nil, err
	}
	q := r.URL.Query()
	script, endpoint := q.Get(adminapi.QueryScriptName), q.Get(adminapi.QueryEndpointUID)
	if script == "" || endpoint == "" {
		return nil, invalid("the delete names what it means: ?scriptName=&endpointUid=")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	a, _, err := n.applyLocked(desired.DeleteRoute{Hostname: host, ScriptName: script, EndpointUID: endpoint}, host, nil)
	if err != nil {
		return nil, err
	}
	if a.Changed {
		n.log.Info("route removed", "hostname", host, "script", script, "endpointUid", endpoint)
	}
	return n.routeStatusLocked(host), nil
}
