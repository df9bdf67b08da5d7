package runtime

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// handlerFunc is an admin handler: it answers a value (written as JSON) or a problem.
type handlerFunc func(w http.ResponseWriter, r *http.Request) (any, error)

// adminHandler is the admin API's one route table.
func (n *Node) adminHandler() http.Handler {
	mux := http.NewServeMux()
	route := func(pattern string, h handlerFunc) { mux.Handle(pattern, n.authed(h)) }
	// A write gives the node something to serve or hold: a node that left its pool takes none
	// (deletes, reads and its membership still go through).
	write := func(pattern string, h handlerFunc) { route(pattern, n.inPool(h)) }
	write("PUT "+adminapi.PatternScript, n.putScript)
	route("GET "+adminapi.PatternScript, n.getScript)
	route("DELETE "+adminapi.PatternScript, n.deleteScript)
	write("PUT "+adminapi.PatternScriptSecrets, n.putSecrets)
	route("DELETE "+adminapi.PatternScriptSecrets, n.deleteSecrets)
	route("POST "+adminapi.PatternScriptReadback, n.readback)
	route("GET "+adminapi.PatternScriptLogs, n.getLogs)
	write("POST "+adminapi.PatternScriptScheduled, n.runScheduled)
	write("PUT "+adminapi.PatternRoute, n.putRoute)
	route("GET "+adminapi.PatternRoute, n.getRoute)
	route("DELETE "+adminapi.PatternRoute, n.deleteRoute)
	route("GET "+adminapi.PathStatus, n.status)
	route("GET "+adminapi.PathPool, n.poolKey)
	write("POST "+adminapi.PathPoolReseal, n.reseal)
	route("GET "+adminapi.PathMembership, n.getMembership)
	route("PUT "+adminapi.PathMembership, n.putMembership)
	route("GET "+adminapi.PathBrakes, n.getBrakes)
	route("POST "+adminapi.PathLifecycleBrake, n.setLifecycleBrake)
	mux.Handle("GET "+adminapi.PathBackup, n.withToken(http.HandlerFunc(n.backup)))
	// Metrics name every tenant's scripts: they need the token like every other route (SPEC 5.1).
	mux.Handle("GET "+adminapi.PathMetrics, n.withToken(promhttp.HandlerFor(n.reg, promhttp.HandlerOpts{})))
	mux.HandleFunc("GET "+adminapi.PathHealth, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		n.writeProblem(w, r, adminapi.NewProblem(http.StatusNotFound, adminapi.CodeNotFound, "Not Found", "no such admin route"))
	})
	return mux
}

// withToken lets a request through to next only with the admin bearer token (constant-time
// compare); any other gets a 401 problem.
func (n *Node) withToken(next http.Handler) http.Handler {
	want := []byte("Bearer " + n.store.Token())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="takoform-runtime"`)
			n.writeProblem(w, r, adminapi.NewProblem(http.StatusUnauthorized, adminapi.CodeUnauthorized, "Unauthorized",
				"send Authorization: Bearer <the token in the runtime's admin-token file>"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// authed checks the bearer token, then runs h and writes its answer.
func (n *Node) authed(h handlerFunc) http.Handler {
	return n.withToken(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		v, err := h(w, r)
		if err != nil {
			var p *adminapi.Problem
			if !errors.As(err, &p) {
				n.log.Error("admin request failed", "method", r.Method, "path", r.URL.Path, "error", err)
				p = adminapi.NewProblem(http.StatusInternalServerError, adminapi.CodeInternal, "Internal Server Error", "see the runtime node's log")
			}
			n.writeProblem(w, r, p)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}))
}

func (n *Node) writeProblem(w http.ResponseWriter, r *http.Request, p *adminapi.Problem) {
	if p.Status >= 500 {
		n.log.Warn("admin problem", "method", r.Method, "path", r.URL.Path, "status", p.Status, "code", p.Code)
	}
	w.Header().Set("Content-Type", adminapi.ProblemContentType)
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}
