// Package cfstandin is a stand-in for the subset of Cloudflare's API v4 that the `workers-dev` and
// `wfp-managed` backend packs call (SPEC 8), for tests and demos that must not need the internet.
//
// It answers on a loopback listener under /client/v4/, as api.cloudflare.com does, with
// Cloudflare's envelope (`success`, `errors[{code,message}]`, `messages`, `result`,
// `result_info`), status codes and error codes: account Workers scripts (multipart module upload
// with plain_text, secret_text, json, service and inherit bindings; content, settings and
// secrets readback; delete; list), the account's workers.dev subdomain and each script's
// subdomain route, Workers for Platforms dispatch namespaces and the scripts in them, and Workers
// KV values. It authenticates one bearer token, enforces Cloudflare's per-token rate limit (1,200
// requests per 5 minutes, then a 5-minute block answered 429 with Retry-After), and takes injected
// faults: 5xx answers, 429s, answers lost after the change was made, slow answers.
//
// Uploaded scripts really run: every upload is started in workerd before it is accepted (a script
// that does not start is refused with Cloudflare's validation error and workerd's message), and the
// stand-in's edge serves `<script>.<accountSubdomain>.workers.dev` for scripts whose workers.dev
// route is enabled and `<label>.<baseDomain>` through the product's own `wfp-managed` dispatch
// worker (package dispatch), run in workerd with its routing KV binding served from the edge's
// (possibly stale) view of the routing namespace and its dispatch-namespace binding shimmed onto
// the stand-in's namespace scripts. The edge answers plain HTTP and TLS (with a
// certificate from the stand-in's own CA) on one address: tests resolve worker hostnames to it with
// EdgeClient's dialer.
//
// State is kept in memory and can be read from tests (Script, NamespaceScript, KVValue, …).
package cfstandin

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare/dispatch"
)

// Config describes the one account the stand-in serves.
type Config struct {
	// Token is the one API token it accepts (Authorization: Bearer <Token>).
	Token string
	// AccountID is the account's identifier; any other account is refused as Cloudflare refuses
	// an account the token cannot reach.
	AccountID string
	// AccountSubdomain is the account's workers.dev subdomain; empty means none is set up
	// (GET /accounts/{id}/workers/subdomain answers 10007).
	AccountSubdomain string
	// DispatchNamespaces exist from the start (more can be created through the API).
	DispatchNamespaces []string
	// KVNamespaces are the ids of the KV namespaces that exist.
	KVNamespaces []string
	// BaseDomain, RoutingKVNamespace and RoutingDispatchNamespace make the edge serve
	// `<label>.<BaseDomain>` as the wfp-managed dispatch worker would: the hostname is looked up in
	// the routing KV namespace (a JSON value naming scriptName) and the script of that name in the
	// dispatch namespace runs.
	BaseDomain               string
	RoutingKVNamespace       string
	RoutingDispatchNamespace string
	// KVStale is how long after a write or delete edge reads of a KV key keep returning the old
	// value (KV is eventually consistent; cached values live 60 s or more). API reads see the
	// write at once unless StaleAPIReads.
	KVStale       time.Duration
	StaleAPIReads bool
	// RateLimit requests per RateWindow per token (default 1,200 per 5 minutes), then every call
	// is answered 429 for RateBlock (default 5 minutes).
	RateLimit  int
	RateWindow time.Duration
	RateBlock  time.Duration
	// MaxScripts is the account's script ceiling (default 500, a paid plan's); MaxScriptSize the
	// largest upload in bytes (default 10 MiB).
	MaxScripts    int
	MaxScriptSize int
	// SaaSZoneID is the zone whose Cloudflare for SaaS custom hostnames the account may manage
	// (custom domains on wfp-managed); an active one is served through the dispatch worker.
	// CustomHostnameReadsToActive is how many reads a new custom hostname answers pending before it
	// reads active, certificate included (default 1: pending in the create's answer, active when
	// read back; more stands for a slow validation).
	SaaSZoneID                  string
	CustomHostnameReadsToActive int
	// Workerd is the workerd binary that runs uploads. Empty: scripts are kept but never run (no
	// startup validation, and the edge answers 503).
	Workerd string
	// Now is the clock (default time.Now); tests move it to pass stale windows and rate blocks.
	Now func() time.Time
}

func (c *Config) defaults() error {
	if c.Token == "" || c.AccountID == "" {
		return errors.New("cfstandin: Token and AccountID are required")
	}
	if c.RateLimit == 0 {
		c.RateLimit = 1200
	}
	if c.RateWindow == 0 {
		c.RateWindow = 5 * time.Minute
	}
	if c.RateBlock == 0 {
		c.RateBlock = 5 * time.Minute
	}
	if c.CustomHostnameReadsToActive == 0 {
		c.CustomHostnameReadsToActive = 1
	}
	if c.MaxScripts == 0 {
		c.MaxScripts = 500
	}
	if c.MaxScriptSize == 0 {
		c.MaxScriptSize = 10 << 20
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Server is a running stand-in.
type Server struct {
	cfg Config

	// apiInFlight counts API requests being served, whether or not their client is still there.
	apiInFlight atomic.Int64
	// held counts the requests a FaultHold holds; released lets them go (faults.go).
	held     atomic.Int64
	released chan struct{}

	mu          sync.Mutex
	scripts     map[scriptKey]*script
	namespaces  map[string]time.Time
	kv          map[string]map[string]*kvKey
	faults      []*Fault
	rate        rateState
	requests    []Request
	credentials map[string]bool
	// customHostnames are the SaaS zone's custom hostnames by id.
	customHostnames map[string]*customHostname

	runner *runner
	ca     *edgeCA
	// dispatcher is the wfp-managed dispatch worker the base domain reaches (nil without workerd
	// or a base domain).
	dispatcher *dispatch.Workerd

	apiLn, edgeLn, serviceLn, routesLn, namespaceLn  net.Listener
	apiSrv, edgeSrv, svcSrv, routesSrv, namespaceSrv *http.Server
}

// Request is one API request as the stand-in saw it (for tests: which calls were made, in which
// order, and what they were answered).
type Request struct {
	Method string
	// Path is the path under /client/v4 with its query, e.g. /accounts/A/workers/scripts/s?force=true.
	Path   string
	Status int
	// Applied is true when the request reached its handler (also for a lost answer).
	Applied bool
	// Fault names the injected fault that met the request, if any.
	Fault FaultKind
}

// New starts a stand-in on loopback: the API, the edge and the internal listener service
// bindings reach scripts through. Close stops it and every workerd it started.
func New(cfg Config) (*Server, error) {
	return Listen(cfg, "127.0.0.1:0", "127.0.0.1:0")
}

// Listen is New with explicit addresses for the API and the edge.
func Listen(cfg Config, apiAddr, edgeAddr string) (*Server, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:         cfg,
		scripts:     map[scriptKey]*script{},
		namespaces:  map[string]time.Time{},
		kv:          map[string]map[string]*kvKey{},
		credentials: map[string]bool{},

		customHostnames: map[string]*customHostname{},
	}
	now := cfg.Now()
	for _, ns := range cfg.DispatchNamespaces {
		s.namespaces[ns] = now
	}
	for _, id := range cfg.KVNamespaces {
		s.kv[id] = map[string]*kvKey{}
	}
	ca, err := newEdgeCA()
	if err != nil {
		return nil, err
	}
	s.ca = ca
	var lc net.ListenConfig
	if s.apiLn, err = lc.Listen(context.Background(), "tcp", apiAddr); err != nil {
		return nil, fmt.Errorf("cfstandin: listen for the API: %w", err)
	}
	if s.edgeLn, err = lc.Listen(context.Background(), "tcp", edgeAddr); err != nil {
		_ = s.apiLn.Close()
		return nil, fmt.Errorf("cfstandin: listen for the edge: %w", err)
	}
	if s.serviceLn, err = lc.Listen(context.Background(), "tcp", "127.0.0.1:0"); err != nil {
		_ = s.apiLn.Close()
		_ = s.edgeLn.Close()
		return nil, fmt.Errorf("cfstandin: listen for service bindings: %w", err)
	}
	s.runner = newRunner(cfg.Workerd, s.serviceLn.Addr().String())
	if s.routesLn, err = lc.Listen(context.Background(), "tcp", "127.0.0.1:0"); err != nil {
		_ = s.apiLn.Close()
		_ = s.edgeLn.Close()
		_ = s.serviceLn.Close()
		return nil, fmt.Errorf("cfstandin: listen for the dispatch worker's KV: %w", err)
	}
	if s.namespaceLn, err = lc.Listen(context.Background(), "tcp", "127.0.0.1:0"); err != nil {
		_ = s.apiLn.Close()
		_ = s.edgeLn.Close()
		_ = s.serviceLn.Close()
		_ = s.routesLn.Close()
		return nil, fmt.Errorf("cfstandin: listen for the dispatch namespace: %w", err)
	}

	api := s.apiHandler()
	s.apiSrv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.apiInFlight.Add(1)
		defer s.apiInFlight.Add(-1)
		api.ServeHTTP(w, r)
	}), ReadHeaderTimeout: 10 * time.Second}
	s.edgeSrv = &http.Server{Handler: http.HandlerFunc(s.serveEdge), ReadHeaderTimeout: 10 * time.Second}
	s.svcSrv = &http.Server{Handler: http.HandlerFunc(s.serveService), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.apiSrv.Serve(s.apiLn) }()
	go func() { _ = s.edgeSrv.Serve(newSniffListener(s.edgeLn, s.ca.serverConfig())) }()
	s.routesSrv = &http.Server{Handler: http.HandlerFunc(s.serveRoutesKV), ReadHeaderTimeout: 10 * time.Second}
	s.namespaceSrv = &http.Server{Handler: http.HandlerFunc(s.serveNamespace), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.svcSrv.Serve(s.serviceLn) }()
	go func() { _ = s.routesSrv.Serve(s.routesLn) }()
	go func() { _ = s.namespaceSrv.Serve(s.namespaceLn) }()
	if cfg.Workerd != "" && cfg.BaseDomain != "" {
		d, err := dispatch.StartWorkerd(cfg.Workerd, s.routesLn.Addr().String(), s.namespaceLn.Addr().String(), dispatch.MinCacheTTL)
		if err != nil {
			_ = s.Close()
			return nil, fmt.Errorf("cfstandin: start the dispatch worker: %w", err)
		}
		s.dispatcher = d
	}
	return s, nil
}

// Close stops the listeners and every workerd process.
func (s *Server) Close() error {
	s.Release() // a held request goes on (and ends with the server)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, srv := range []*http.Server{s.apiSrv, s.edgeSrv, s.svcSrv, s.routesSrv, s.namespaceSrv} {
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
	}
	s.runner.closeAll()
	if s.dispatcher != nil {
		s.dispatcher.Close()
	}
	return nil
}

// BaseURL is the API's base URL, ending in /client/v4/ like https://api.cloudflare.com/client/v4/.
func (s *Server) BaseURL() string { return "http://" + s.apiLn.Addr().String() + "/client/v4/" }

// EdgeAddr is the address every worker hostname resolves to (plain HTTP and TLS on one port).
func (s *Server) EdgeAddr() string { return s.edgeLn.Addr().String() }

// EdgeCACertPEM is the certificate of the CA that signs the edge's TLS certificate.
func (s *Server) EdgeCACertPEM() []byte { return append([]byte(nil), s.ca.certPEM...) }

// EdgeClient is an HTTP client that resolves every hostname to the edge (the "local resolver")
// and trusts the edge's CA, so https://<script>.<sub>.workers.dev/ reaches the stand-in.
func (s *Server) EdgeClient() *http.Client {
	addr := s.EdgeAddr()
	var d net.Dialer
	return &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return d.DialContext(ctx, network, addr)
			},
			TLSClientConfig:   &tls.Config{RootCAs: s.ca.pool(), MinVersion: tls.VersionTLS12},
			DisableKeepAlives: true,
		},
	}
}

// Requests returns the API requests seen so far, oldest first.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// SawCredential reports whether any request carried value as its bearer token or in an
// X-Auth-Key, X-Auth-Email or X-Auth-User-Service-Key header (tests prove that credentials from
// the environment never reach the API).
func (s *Server) SawCredential(value string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.credentials[value]
}

func (s *Server) now() time.Time { return s.cfg.Now() }

// scriptKey names a script: Namespace is empty for the account's own scripts.
type scriptKey struct{ Namespace, Name string }

// Module is one uploaded module part.
type Module struct {
	Name        string
	ContentType string
	Content     []byte
}

// Binding is one binding of a script version. Text holds the value of plain_text and secret_text
// bindings; JSON the value of a json binding; Service the target of a service binding; Namespace
// the KV namespace id of a kv_namespace binding or the namespace of a dispatch_namespace one.
//
// A service binding may name an Entrypoint of its target (a WorkerEntrypoint class the target
// exports) and Props, a JSON object the target reads as ctx.props: both are the binding's
// configuration, fixed at upload, which the calling script cannot change.
type Binding struct {
	Name        string
	Type        string
	Text        string
	JSON        json.RawMessage
	Service     string
	Environment string
	Entrypoint  string
	Props       json.RawMessage
	Namespace   string
	// target is the account script's current version that a binding with an Entrypoint runs
	// (the stand-in runs it inside the caller's workerd, where workerd passes entrypoint and
	// props as Cloudflare does); kept current when the target is uploaded again.
	target *Version
}

// Version is one uploaded version of a script.
type Version struct {
	ID                 string
	MainModule         string
	CompatibilityDate  string
	CompatibilityFlags []string
	Modules            []Module
	Bindings           []Binding
	// Limits are the version's limits as its upload set them (none: Cloudflare's defaults).
	Limits    Limits
	CreatedOn time.Time
}

// Limits are a version's limits, as an upload's metadata sets them and the settings readback
// shows them.
type Limits struct {
	CPUMs int64 `json:"cpu_ms,omitempty"`
}

// Binding returns the binding named name.
func (v Version) Binding(name string) (Binding, bool) {
	for _, b := range v.Bindings {
		if b.Name == name {
			return b, true
		}
	}
	return Binding{}, false
}

// Subdomain is a script's workers.dev route.
type Subdomain struct {
	Enabled         bool `json:"enabled"`
	PreviewsEnabled bool `json:"previews_enabled"`
}

// Script is a script as the stand-in holds it.
type Script struct {
	Namespace  string
	Name       string
	CreatedOn  time.Time
	ModifiedOn time.Time
	Etag       string
	Current    Version
	// Uploads counts the versions made so far (uploads and secret changes).
	Uploads   int
	Subdomain Subdomain
	// Schedules are its cron triggers (account scripts only: dispatch-namespace scripts have
	// none), as the schedules API last set them.
	Schedules []string
}

type script struct {
	Script
}

func (sc *script) snapshot() Script {
	out := sc.Script
	out.Current = copyVersion(sc.Current)
	out.Schedules = append([]string(nil), sc.Schedules...)
	return out
}

func copyVersion(v Version) Version {
	v.CompatibilityFlags = append([]string(nil), v.CompatibilityFlags...)
	v.Modules = append([]Module(nil), v.Modules...)
	v.Bindings = append([]Binding(nil), v.Bindings...)
	return v
}

// Script returns the account script named name.
func (s *Server) Script(name string) (Script, bool) { return s.NamespaceScript("", name) }

// NamespaceScript returns the script named name in dispatch namespace ns ("" for the account's
// own scripts).
func (s *Server) NamespaceScript(ns, name string) (Script, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sc, ok := s.scripts[scriptKey{ns, name}]
	if !ok {
		return Script{}, false
	}
	return sc.snapshot(), true
}

// ScriptNames lists the scripts of namespace ns ("" for the account's own), sorted.
func (s *Server) ScriptNames(ns string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var names []string
	for k := range s.scripts {
		if k.Namespace == ns {
			names = append(names, k.Name)
		}
	}
	sort.Strings(names)
	return names
}

// SetAccountSubdomain changes the account's workers.dev subdomain (a test of placement drift).
func (s *Server) SetAccountSubdomain(sub string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.AccountSubdomain = sub
}

// APIRequestsInFlight is how many API requests the stand-in is serving now. Like Cloudflare, it
// finishes a request whose client has gone (a killed Host's upload still lands): a test that
// moves the Host's clock past a killed request's lease waits for none to be in flight first, as
// the lease's real time would.
func (s *Server) APIRequestsInFlight() int64 { return s.apiInFlight.Load() }
