package orgproc

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
)

// unitOf is the unit of loader id id placed in p, retired ones included ("", or another
// process's id, or a foreign one: nil).
func (p *Process) unitOf(id string) *unit {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.units[id]
}

// serveCode answers the router's request for one loader id's code: only for an incarnation placed
// in this process and not retired (SPEC 5: a retired or foreign id gets nothing). The values are
// read now, sent, and not kept.
func (p *Process) serveCode(w http.ResponseWriter, r *http.Request) {
	id, err := url.PathUnescape(strings.TrimPrefix(r.URL.EscapedPath(), "/"))
	u := p.unitOf(id)
	if err != nil || r.Method != http.MethodGet || u == nil || u.retired.Load() {
		http.Error(w, "no such incarnation in this process", http.StatusNotFound)
		return
	}
	if p.m.opts.BeforeCode != nil {
		p.m.opts.BeforeCode(id)
	}
	code, err := u.inc.spec.Code()
	if err != nil {
		// Logged without its values (the error names files and ids, never a value).
		u.inc.log.Error("the code of an incarnation cannot be given to its process", "error", err)
		http.Error(w, "the runtime node cannot give this incarnation's code now", http.StatusServiceUnavailable)
		return
	}
	u.loaded.Store(true)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(code)
}

// stamped is the unit whose loader id the router stamped a request with, and the request without
// any header of the runtime's: nil when the id is not one of this process's (the router never
// sends such a request, so it is refused).
func (p *Process) stamped(w http.ResponseWriter, r *http.Request) (*unit, *http.Request) {
	u := p.unitOf(r.Header.Get(workerd.HeaderLoader))
	if u == nil {
		http.Error(w, "no such incarnation in this process", http.StatusForbidden)
		return nil, nil
	}
	return u, r
}

// withoutOurs removes the runtime's own headers (Takoform-*) from h.
func withoutOurs(h http.Header) {
	for k := range h {
		if len(k) >= len("Takoform-") && strings.EqualFold(k[:len("Takoform-")], "Takoform-") {
			delete(h, k)
		}
	}
}

// serveEgress hands an isolate's subrequest to the node's egress (it may have retired since it
// began: its waitUntil work is still its own, and bounded there).
func (p *Process) serveEgress(w http.ResponseWriter, r *http.Request) {
	u, r := p.stamped(w, r)
	if u == nil {
		return
	}
	withoutOurs(r.Header)
	if p.m.opts.Egress == nil {
		http.Error(w, "this node has no egress", http.StatusServiceUnavailable)
		return
	}
	p.m.opts.Egress(w, r, u.inc)
}

// serveBinding hands an isolate's service binding call to the node: the call whole, to be carried
// to its callee; or, asked to admit it, only its admission, to be run in this process. Either may
// report the end of calls this process ran (the router's own requests, which no isolate can
// forge: the router removes every takoform-* header an isolate writes).
func (p *Process) serveBinding(w http.ResponseWriter, r *http.Request) {
	if v := r.Header.Get(workerd.HeaderEnded); v != "" {
		p.calls.ended(v)
		if r.Header.Get(workerd.HeaderLoader) == "" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
	u, r := p.stamped(w, r)
	if u == nil {
		return
	}
	binding := r.Header.Get(workerd.HeaderBinding)
	var local edge.Local
	if r.Header.Get(workerd.HeaderAdmit) != "" {
		local = p.local
	}
	withoutOurs(r.Header)
	if p.m.opts.Binding == nil {
		http.Error(w, "service bindings are not served on this node", http.StatusServiceUnavailable)
		return
	}
	p.m.opts.Binding(w, r, u.inc, binding, local)
}

// maxTailBody bounds one tail delivery the runtime reads.
const maxTailBody = 1 << 20

// serveTail takes an isolate's log events: within its organization's line budget, taken before
// anything is parsed, scrubbed of its values, into its worker's log.
func (p *Process) serveTail(w http.ResponseWriter, r *http.Request) {
	u, r := p.stamped(w, r)
	if u == nil {
		return
	}
	defer w.WriteHeader(http.StatusNoContent)
	inc := u.inc
	body, err := io.ReadAll(io.LimitReader(r.Body, maxTailBody+1))
	if err != nil || len(body) > maxTailBody || inc.spec.Log == nil || inc.spec.Lines == nil {
		return
	}
	if !inc.spec.Lines.Take() {
		// Not parsed: the organization's budget is spent. What it held is counted without
		// decoding it (a key that only the events' own JSON writes unescaped).
		inc.spec.Log.Drop(countLines(body))
		return
	}
	logTail(inc, body)
}
