package desired

import (
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
)

// PutRoute routes a hostname to a script for one endpoint UID (PUT /v1/routes/{hostname}).
type PutRoute struct {
	Effect Effect
	Route  state.Route
}

func (op PutRoute) apply(s *state.Desired) Answer {
	host := op.Route.Hostname
	at := target("route", host)
	if again, r := replay(s, op.Effect, at); r != nil {
		return refused(r)
	} else if again {
		return Answer{Replayed: true}
	}
	if cur := s.Routes[host]; cur != nil && cur.EndpointUID != op.Route.EndpointUID {
		// One endpoint per hostname: its holder leaves through its own (compare-and-)delete.
		return refused(refusal(adminapi.CodeRouteConflict, ShowsRoute, "hostname %s is routed for another endpoint", host))
	}
	route := op.Route
	s.SetRoute(&route)
	record(s, op.Effect, at)
	return Answer{Changed: true}
}

// DeleteRoute is compare-and-delete (SPEC 5; DELETE /v1/routes/{hostname}?scriptName=&endpointUid=):
// only a route that still maps the hostname to that script for that endpoint UID is removed, so a
// late delete never removes its successor; any other changes nothing.
type DeleteRoute struct {
	Hostname    string
	ScriptName  string
	EndpointUID string
}

func (op DeleteRoute) apply(s *state.Desired) Answer {
	cur := s.Routes[op.Hostname]
	if cur == nil || cur.ScriptName != op.ScriptName || cur.EndpointUID != op.EndpointUID {
		return Answer{}
	}
	s.DeleteRoute(op.Hostname)
	return Answer{Changed: true}
}
