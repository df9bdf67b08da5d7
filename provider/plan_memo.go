package provider

import "sync"

// planMemo holds what resources of this provider configuration derived in the plan for resources
// planned after them: the CLI plans a resource before those that refer to it (and plans both
// again, in that order, at apply time), so a resource can check or know at plan time what depends
// on another that does not exist yet. One is made per Configure: it lives as long as one plan or
// apply.
type planMemo struct {
	// origins is the canonical origin each planned reservation was derived to hold, by id: the
	// url of an endpoint created on it.
	origins *planned[string]
	// bindings is the binding names each planned runtime input seals, by reference: what a worker
	// consuming it must require.
	bindings *planned[[]string]
	// offerings are the Host's offerings, read by the first worker plan that checks its limits.
	offerings *offeringsMemo
	// workers is each worker's space/name by UID, as this configuration planned, read or created
	// it: what a binding to it is shown as.
	workers *planned[string]
}

// planned is one kind of value of a planMemo, by key. A nil one records nothing and finds nothing.
type planned[V any] struct{ m sync.Map }

func (p *planned[V]) record(key string, v V) {
	if p != nil {
		p.m.Store(key, v)
	}
}

func (p *planned[V]) lookup(key string) (V, bool) {
	var zero V
	if p == nil {
		return zero, false
	}
	v, ok := p.m.Load(key)
	if !ok {
		return zero, false
	}
	return v.(V), true
}

// memoOf is the planMemo of a resource's provider data (empty before Configure).
func memoOf(data any) planMemo {
	if pd, ok := data.(*providerData); ok {
		return pd.memo
	}
	return planMemo{}
}
