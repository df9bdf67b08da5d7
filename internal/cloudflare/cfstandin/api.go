package cfstandin

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// apiHandler is the API's one route table, under /client/v4 like Cloudflare's, plus the
// stand-in's own /__standin admin routes.
func (s *Server) apiHandler() http.Handler {
	mux := http.NewServeMux()
	const acct = "/client/v4/accounts/{account}"
	type handler = func(http.ResponseWriter, *http.Request) *failure
	route := func(pattern string, h handler) { mux.Handle(pattern, s.guard(h)) }
	scoped := func(ns func(*http.Request) string, h func(http.ResponseWriter, *http.Request, string, string) *failure) handler {
		return func(w http.ResponseWriter, r *http.Request) *failure { return h(w, r, ns(r), r.PathValue("script")) }
	}
	account := func(*http.Request) string { return "" }
	namespace := func(r *http.Request) string { return r.PathValue("namespace") }

	// Account Workers scripts.
	const scripts = acct + "/workers/scripts"
	route("GET "+scripts, func(w http.ResponseWriter, r *http.Request) *failure { return s.listScripts(w, r, "") })
	route("PUT "+scripts+"/{script}", scoped(account, s.putScript))
	route("GET "+scripts+"/{script}", scoped(account, s.getContent))
	route("DELETE "+scripts+"/{script}", scoped(account, s.deleteScript))
	route("GET "+scripts+"/{script}/content/v2", scoped(account, s.getContent))
	route("GET "+scripts+"/{script}/settings", scoped(account, s.getSettings))
	route("PUT "+scripts+"/{script}/secrets", scoped(account, s.putSecret))
	route("GET "+scripts+"/{script}/secrets", scoped(account, s.listSecrets))
	route("GET "+scripts+"/{script}/secrets/{secret}", scoped(account, s.getSecret))
	route("DELETE "+scripts+"/{script}/secrets/{secret}", scoped(account, s.deleteSecret))
	route("GET "+scripts+"/{script}/subdomain", func(w http.ResponseWriter, r *http.Request) *failure {
		return s.getScriptSubdomain(w, r, r.PathValue("script"))
	})
	route("POST "+scripts+"/{script}/subdomain", func(w http.ResponseWriter, r *http.Request) *failure {
		return s.setScriptSubdomain(w, r, r.PathValue("script"), false)
	})
	route("DELETE "+scripts+"/{script}/subdomain", func(w http.ResponseWriter, r *http.Request) *failure {
		return s.setScriptSubdomain(w, r, r.PathValue("script"), true)
	})
	route("PUT "+scripts+"/{script}/schedules", scoped(account, s.putSchedules))
	route("GET "+scripts+"/{script}/schedules", scoped(account, s.getSchedules))
	route("GET "+acct+"/workers/subdomain", s.getAccountSubdomain)

	// Workers for Platforms dispatch namespaces and their scripts.
	const namespaces = acct + "/workers/dispatch/namespaces"
	const nsScripts = namespaces + "/{namespace}/scripts"
	route("GET "+namespaces, s.listNamespaces)
	route("POST "+namespaces, s.createNamespace)
	route("GET "+namespaces+"/{namespace}", s.getNamespace)
	route("PUT "+nsScripts+"/{script}", scoped(namespace, s.putScript))
	route("GET "+nsScripts+"/{script}", scoped(namespace, s.getNamespaceScript))
	route("DELETE "+nsScripts+"/{script}", scoped(namespace, s.deleteScript))
	route("GET "+nsScripts+"/{script}/content", scoped(namespace, s.getContent))
	route("GET "+nsScripts+"/{script}/settings", scoped(namespace, s.getSettings))
	route("GET "+nsScripts+"/{script}/bindings", scoped(namespace, s.getBindings))
	route("PUT "+nsScripts+"/{script}/secrets", scoped(namespace, s.putSecret))
	route("GET "+nsScripts+"/{script}/secrets", scoped(namespace, s.listSecrets))
	route("GET "+nsScripts+"/{script}/secrets/{secret}", scoped(namespace, s.getSecret))
	route("DELETE "+nsScripts+"/{script}/secrets/{secret}", scoped(namespace, s.deleteSecret))

	// Workers KV values.
	const values = acct + "/storage/kv/namespaces/{namespace}/values/{key...}"
	route("PUT "+values, s.putKV)
	route("GET "+values, s.getKV)
	route("DELETE "+values, s.deleteKV)

	// Cloudflare for SaaS custom hostnames of the SaaS zone.
	const hostnames = "/client/v4/zones/{zone}/custom_hostnames"
	route("POST "+hostnames, s.createCustomHostname)
	route("GET "+hostnames, s.listCustomHostnames)
	route("GET "+hostnames+"/{id}", s.getCustomHostname)
	route("DELETE "+hostnames+"/{id}", s.deleteCustomHostname)

	mux.Handle("/__standin/", s.adminHandler())
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeFailure(w, fail(http.StatusNotFound, CodeNoRoute, "No route for that URI"))
	})
	return mux
}

// guard runs one API request through what Cloudflare does before and around a handler:
// authentication, the account check, the per-token rate limit, then any injected fault. The
// handler writes into a buffer, so that a lost answer can apply the request and answer nothing.
func (s *Server) guard(h func(http.ResponseWriter, *http.Request) *failure) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := Request{Method: r.Method, Path: strings.TrimPrefix(r.URL.RequestURI(), "/client/v4")}
		var once sync.Once
		record := func() {
			once.Do(func() {
				s.mu.Lock()
				s.requests = append(s.requests, rec)
				s.mu.Unlock()
			})
		}
		defer record()
		s.noteCredentials(r)
		if f := s.authenticate(r); f != nil {
			rec.Status = f.status
			writeFailure(w, f)
			return
		}
		if ok, retry := s.admit(); !ok {
			rec.Status = http.StatusTooManyRequests
			writeFailure(w, rateLimited(retry))
			return
		}
		fault := s.takeFault(r.Method, rec.Path)
		lost := false
		if fault != nil {
			rec.Fault = fault.Kind
			switch fault.Kind {
			case FaultSlow:
				select {
				case <-time.After(fault.Delay):
				case <-r.Context().Done():
					rec.Status = 499
					return
				}
			case FaultHold:
				// The whole request is read first (it reached Cloudflare), then held: it is applied
				// on Release even if its caller is gone by then.
				body, err := io.ReadAll(r.Body)
				if err != nil {
					rec.Status = 499
					return
				}
				r.Body = io.NopCloser(bytes.NewReader(body))
				gate := s.holdGate(false)
				s.held.Add(1)
				<-gate
				s.held.Add(-1)
				r = r.WithContext(context.WithoutCancel(r.Context()))
			case FaultServerError:
				status := fault.Status
				if status == 0 {
					status = http.StatusInternalServerError
				}
				rec.Status = status
				writeFailure(w, fail(status, CodeInternal, "An unknown error has occurred. If this error persists, please file a report."))
				return
			case FaultRateLimited:
				retry := fault.RetryAfter
				if retry == 0 {
					retry = time.Second
				}
				rec.Status = http.StatusTooManyRequests
				writeFailure(w, rateLimited(retrySeconds(retry)))
				return
			case FaultLostAnswer:
				lost = true
			}
		}
		buf := &bufferedResponse{header: http.Header{}}
		rec.Applied = true
		if f := h(buf, r); f != nil {
			writeFailure(buf, f)
		}
		rec.Status = buf.status
		if lost {
			// Recorded before the connection drops: the caller may look as soon as it sees it drop.
			record()
			if hj, ok := w.(http.Hijacker); ok {
				if conn, _, err := hj.Hijack(); err == nil {
					_ = conn.Close()
					return
				}
			}
			panic(http.ErrAbortHandler)
		}
		for k, v := range buf.header {
			w.Header()[k] = v
		}
		w.WriteHeader(buf.status)
		_, _ = w.Write(buf.body.Bytes())
	})
}

// authenticate accepts only "Authorization: Bearer <Token>" and the configured account.
func (s *Server) authenticate(r *http.Request) *failure {
	auth := r.Header.Get("Authorization")
	if auth == "" {
		if r.Header.Get("X-Auth-Key") != "" || r.Header.Get("X-Auth-User-Service-Key") != "" {
			return fail(http.StatusForbidden, CodeAuthentication, "Authentication error")
		}
		return fail(http.StatusBadRequest, CodeMissingCredentials, "Missing X-Auth-Key, X-Auth-Email or Authorization headers")
	}
	token, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(token), []byte(s.cfg.Token)) != 1 {
		return fail(http.StatusForbidden, CodeInvalidToken, "Invalid access token")
	}
	if account := r.PathValue("account"); account != "" && account != s.cfg.AccountID {
		return fail(http.StatusForbidden, CodeAuthentication, "Authentication error")
	}
	return nil
}

func (s *Server) noteCredentials(r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		s.credentials[token] = true
	}
	for _, h := range []string{"X-Auth-Key", "X-Auth-Email", "X-Auth-User-Service-Key"} {
		if v := r.Header.Get(h); v != "" {
			s.credentials[v] = true
		}
	}
}

// bufferedResponse holds a handler's answer until guard decides whether to send it.
type bufferedResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *bufferedResponse) Header() http.Header { return b.header }

func (b *bufferedResponse) WriteHeader(status int) {
	if b.status == 0 {
		b.status = status
	}
}

func (b *bufferedResponse) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	return b.body.Write(p)
}

// The admin routes, for the tools/cfstandin command and tests in other processes: arm faults,
// start a rate-limit block, read the state (value-free: secret values are never shown). They take
// the same bearer token as the API.

type wireFault struct {
	Kind              FaultKind `json:"kind"`
	Method            string    `json:"method,omitempty"`
	PathContains      string    `json:"pathContains,omitempty"`
	Times             int       `json:"times,omitempty"`
	Status            int       `json:"status,omitempty"`
	RetryAfterSeconds int       `json:"retryAfterSeconds,omitempty"`
	DelayMillis       int       `json:"delayMillis,omitempty"`
}

func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /__standin/faults", func(w http.ResponseWriter, r *http.Request) {
		var wf wireFault
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&wf); err != nil {
			writeFailure(w, fail(http.StatusBadRequest, CodeBadRequestBody, "Could not parse request body: "+err.Error()))
			return
		}
		f := Fault{Kind: wf.Kind, Method: wf.Method, PathContains: wf.PathContains, Times: wf.Times, Status: wf.Status,
			RetryAfter: time.Duration(wf.RetryAfterSeconds) * time.Second, Delay: time.Duration(wf.DelayMillis) * time.Millisecond}
		if err := s.Inject(f); err != nil {
			writeFailure(w, validation(err.Error()))
			return
		}
		writeResult(w, wf)
	})
	mux.HandleFunc("DELETE /__standin/faults", func(w http.ResponseWriter, _ *http.Request) {
		s.ClearFaults()
		writeResult(w, nil)
	})
	mux.HandleFunc("POST /__standin/block", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Seconds int `json:"seconds"`
		}
		_ = json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&body)
		s.Block(time.Duration(body.Seconds) * time.Second)
		writeResult(w, nil)
	})
	mux.HandleFunc("GET /__standin/state", func(w http.ResponseWriter, _ *http.Request) {
		writeResult(w, s.stateView())
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(token), []byte(s.cfg.Token)) != 1 {
			writeFailure(w, fail(http.StatusForbidden, CodeInvalidToken, "Invalid access token"))
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// stateView is the state without secret values.
func (s *Server) stateView() map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]scriptKey, 0, len(s.scripts))
	for k := range s.scripts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Namespace != keys[j].Namespace {
			return keys[i].Namespace < keys[j].Namespace
		}
		return keys[i].Name < keys[j].Name
	})
	scripts := []any{}
	for _, k := range keys {
		sc := s.scripts[k]
		modules := []string{}
		for _, m := range sc.Current.Modules {
			modules = append(modules, m.Name)
		}
		scripts = append(scripts, map[string]any{
			"namespace": k.Namespace, "name": k.Name, "uploads": sc.Uploads, "version": sc.Current.ID,
			"main_module": sc.Current.MainModule, "modules": modules, "subdomain": sc.Subdomain,
			"settings": settingsResult(sc.Current),
		})
	}
	kv := map[string]any{}
	for ns, keys := range s.kv {
		live := map[string]string{}
		for key, k := range keys {
			if v, ok := k.latest(); ok {
				live[key] = string(v)
			}
		}
		kv[ns] = live
	}
	namespaces := []string{}
	for ns := range s.namespaces {
		namespaces = append(namespaces, ns)
	}
	sort.Strings(namespaces)
	return map[string]any{
		"account_id": s.cfg.AccountID, "account_subdomain": s.cfg.AccountSubdomain,
		"dispatch_namespaces": namespaces, "scripts": scripts, "kv": kv,
		"rate_limited_until": s.rate.blockedUntil,
	}
}
