package edge

import (
	"net/http"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// The edge carries no CONNECT tunnel (HTTP/1.x nor HTTP/2): it is a reverse proxy to workers,
// which cannot answer one (workerd speaks HTTP/1.1 to the edge and has no tunnel to give), and a
// CONNECT that reached the node's network would make the edge an open proxy. 405 with the methods
// the edge carries, as RFC 9110 15.5.6 asks; an HTTP/1.x connection is closed after it, since what
// the client sends next is the tunnel's bytes, not a request.
var problemConnect = adminapi.NewProblem(http.StatusMethodNotAllowed, adminapi.CodeMethodNotAllowed, "Method Not Allowed",
	"the runtime node's edge carries no CONNECT tunnel")

// allowedMethods is the Allow header of the refusal: the common methods the edge carries (any
// other but CONNECT is passed to the worker too).
const allowedMethods = "GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH"

// refuseConnect answers a CONNECT request with problemConnect, counted by handler when it is the
// edge's (takoform_runtime_edge_requests_total).
func refuseConnect(w http.ResponseWriter, handler http.Handler) {
	w.Header().Set("Allow", allowedMethods)
	code := writeProblem(w, problemConnect)
	if h, ok := handler.(*Handler); ok {
		h.counter(code).Inc()
	}
}

// noConnect is handler with CONNECT refused: the HTTP/2 server's (net/http's server hands a
// CONNECT, extended or not, to its handler like any request).
func noConnect(handler http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodConnect {
			refuseConnect(w, handler)
			return
		}
		handler.ServeHTTP(w, r)
	})
}
