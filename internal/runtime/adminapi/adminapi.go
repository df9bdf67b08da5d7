// Package adminapi holds the wire types of the runtime node's admin API: the only code the Host
// and the runtime node share (SPEC 5). The Host's selfhost backend is a client of this API, the
// way the workers-dev backend is a client of Cloudflare's.
//
// # Authentication
//
// Every route under /v1 needs `Authorization: Bearer <token>`, the token the runtime node wrote on
// its first start into `<state-dir>/admin-token` (0600). GET /healthz and GET /metrics (Prometheus)
// need none: the admin listener is loopback, or TLS when it is not.
//
// # Scripts
//
//	PUT    /v1/scripts/{scriptName}                     ScriptPut → ScriptStatus
//	GET    /v1/scripts/{scriptName}                     → ScriptStatus
//	DELETE /v1/scripts/{scriptName}?workerUid=U         → ScriptStatus (present: false)
//
// A script PUT declares the desired deployment. It is idempotent by effectId: a replay of the same
// request does no new work and answers the script's current status with `Takoform-Replayed: true`;
// the same effectId with another body is `409 effect_conflict`. Generations only move forward for
// one worker UID: an older generation is `409 stale_generation`, and the same generation with other
// content is `409 generation_conflict`, so a late copy of an old PUT can never revert a newer one.
// A script is one worker UID's (SPEC 3.4): a PUT naming another worker UID than the script has is
// `409 script_held` (naming nobody) until the holder's delete is confirmed; no generation overrides
// that. A PUT with no secretNames erases the delivered secrets (SPEC 3.5: a worker
// without runtime inputs keeps no values on the backend).
//
// The DELETE is conditional on the worker UID the caller believes is there, so a late delete never
// removes a successor (a replaced worker keeps its script name): when the script is absent, or
// belongs to another worker UID, nothing is removed and the 200 answer says what is there (present
// false, or present with the other workerUid). Otherwise it stops the script's incarnations
// (in-flight requests drain, bounded), erases its delivered secrets, and answers once the processes
// are gone. Routes naming the script stay until their own DELETE; the edge answers 503 for them.
//
// The script's status reports `incarnation` (the serving one, or the one starting when none has
// served yet) and `candidate` (a newer one being admitted beside it, or the last one that failed),
// each with its state (pending, ready, failed), reason, message, restarts, incident, pid and
// loopback address. `ready` is true when the serving incarnation is Ready and is the one the
// current desired deployment (and current delivery, when the script declares secretNames) calls
// for; until then `reason` is RuntimePending, RuntimeInputPending, RuntimeRestarting,
// LifecycleBrake or RuntimeFailed.
//
// # Secret deliveries
//
//	PUT    /v1/scripts/{scriptName}/secrets             SecretsPut → ScriptStatus
//	DELETE /v1/scripts/{scriptName}/secrets?workerUid=U → ScriptStatus
//	POST   /v1/scripts/{scriptName}/secrets/readback    ReadbackRequest → Readback
//
// A delivery carries the values of one worker UID; its names must equal the script's secretNames
// (`422 secret_names_mismatch`), its worker UID the script's (`409 worker_mismatch`), and the script
// must exist (`404 script_absent`). It replaces any previous delivery and admits a new incarnation
// through the update path; later code changes of the same worker UID run with it, so the Host never
// re-sends values. The DELETE erases the delivery if it still belongs to that worker UID. Values are
// sealed at rest under the runtime's own key and reach workerd only through its environment; no
// response, log line or file ever holds one. Readback answers HMAC-SHA256(challenge, canonical JSON
// of the bindings exactly as given to workerd), never the values nor an unkeyed digest.
//
// # Routes
//
//	PUT    /v1/routes/{hostname}                          RoutePut → RouteStatus
//	GET    /v1/routes/{hostname}                          → RouteStatus
//	DELETE /v1/routes/{hostname}?scriptName=S&endpointUid=E → RouteStatus
//
// The hostname is lowercase and carries no port; the edge matches the request's Host header with
// its port removed. A PUT on a hostname held by another endpoint UID is `409 route_conflict`: the
// holder is removed by its own DELETE first. The DELETE is compare-and-delete: it removes the route
// only while it maps the hostname to that script for that endpoint UID, so a late delete never
// removes a successor; a route that is absent, or that is someone else's, is left alone and the
// answer reports what is there (present, and whose).
//
// # Worker logs
//
//	GET /v1/scripts/{scriptName}/logs?workerUid=U[&epoch=E&after=N][&since=T][&wait=D] → LogPage
//
// The runtime keeps, per worker UID, a bounded ring of what its incarnations printed: console.*
// calls and uncaught exceptions, each with the node's time of reception, the incarnation and a
// level (log, info, warn, error, debug, exception). Values of the worker's delivered secrets are
// removed (raw, JSON-escaped, base64 and hex forms) before an entry enters the ring. Entries pass a
// per-worker rate limit; what it refuses is counted, and the count enters the ring as an entry of
// its own (`dropped`). The ring lives in memory: it starts empty when the node starts, and goes
// with the script's delete.
//
// Entries carry a sequence number; a page answers those after `after` (within ring `epoch`: a
// cursor from another epoch, such as one from before the node restarted, starts over), at or
// after `since` (RFC 3339) when given. `wait` (a Go duration, at most LogWaitMax) makes the call a
// long poll: with no entry to answer it returns as soon as one arrives, or empty when wait ends.
// At most MaxLogWaits long polls wait at once; one more is `429 log_waits_full`, so that log
// streams never take the connections the Host's other calls need.
// `missed` counts entries that left the ring between the cursor and the first one answered. A
// script that is absent, or another worker UID's, is `404 script_absent`.
//
// # Status and brakes
//
//	GET  /v1/status              → Status
//	GET  /v1/brakes              → Brakes
//	POST /v1/brakes/lifecycle    BrakeSet → Brakes
//
// The lifecycle brake (global, one organization, or one worker by the script's labels; space and
// worker go together) stops restarts of admitted incarnations in its scope: a process that dies
// there stays down (reason LifecycleBrake) until the brake is released. It never stops what is
// serving, nor the admission of a new deployment (that is the Host's deployment brake), nor the
// start of the desired incarnations when the node itself starts. Brakes persist across restarts;
// releasing one scope leaves the others engaged.
//
// # Metrics
//
// GET /metrics (no token) exports takoform_runtime_restarts_total{script},
// takoform_runtime_incident{script}, takoform_runtime_ready_incarnations, takoform_runtime_scripts
// and takoform_runtime_edge_requests_total{code}.
//
// Errors are RFC 9457 `application/problem+json` (Problem) with a stable Code.
package adminapi

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/vocab"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

// Route patterns, in the form net/http's ServeMux takes.
const (
	PatternScript         = "/v1/scripts/{scriptName}"
	PatternScriptSecrets  = "/v1/scripts/{scriptName}/secrets"
	PatternScriptReadback = "/v1/scripts/{scriptName}/secrets/readback"
	PatternScriptLogs     = "/v1/scripts/{scriptName}/logs"
	// PatternScriptScheduled runs one cron tick of a script (POST, a ScheduledRun).
	PatternScriptScheduled = "/v1/scripts/{scriptName}/scheduled"
	PatternRoute           = "/v1/routes/{hostname}"
	PathStatus             = "/v1/status"
	PathPool               = "/v1/pool"
	PathPoolReseal         = "/v1/pool/reseal"
	// PathMembership is the node's place in its pool, as the Host last told it (SPEC 6.2).
	PathMembership     = "/v1/membership"
	PathBrakes         = "/v1/brakes"
	PathLifecycleBrake = "/v1/brakes/lifecycle"
	// PathBackup answers a consistent backup of the node's state (application/gzip; `takoserver
	// runtime backup`): what it serves, sealed as at rest, without its admin token.
	PathBackup           = "/v1/backup"
	PathHealth           = "/healthz"
	PathMetrics          = "/metrics"
	HeaderReplayed       = "Takoform-Replayed"
	ProblemContentType   = "application/problem+json"
	TokenFileName        = "admin-token"
	DefaultAdminListen   = "127.0.0.1:8788"
	DefaultEdgeListen    = "127.0.0.1:8787"
	DefaultAdminURL      = "http://" + DefaultAdminListen
	queryWorkerUID       = "workerUid"
	queryScriptName      = "scriptName"
	queryEndpointUID     = "endpointUid"
	problemTypeURIPrefix = "urn:takoform:problem:runtime:"
)

// ScriptPath is the path of one script.
func ScriptPath(scriptName string) string { return "/v1/scripts/" + url.PathEscape(scriptName) }

// ScheduledPath is where one script's cron ticks are run.
func ScheduledPath(scriptName string) string { return ScriptPath(scriptName) + "/scheduled" }

// ScheduledRun asks a node to run one cron tick of a script's worker (SPEC 3.6): its scheduled
// handler, once. The node runs a tick id at most once and only before Deadline; asked again for the
// same id it answers the first run's outcome.
type ScheduledRun struct {
	TickID        string    `json:"tickId"`
	WorkerUID     string    `json:"workerUid"`
	Cron          string    `json:"cron"`
	ScheduledTime time.Time `json:"scheduledTime"`
	Deadline      time.Time `json:"deadline"`
}

// Scheduled outcomes: the handler returned (ok) or threw (exception).
const (
	ScheduledOK        = "ok"
	ScheduledException = "exception"
)

// ScheduledOutcome is what became of a ScheduledRun: Outcome, the incarnation that ran it, and
// for an exception its message (scrubbed of the worker's values, as its log is).
type ScheduledOutcome struct {
	Outcome     string `json:"outcome"`
	Incarnation string `json:"incarnation"`
	Message     string `json:"message,omitempty"`
}

// ScriptWatchPath reads one script as a long poll: the answer comes once its version differs from
// since (a version an earlier read answered), or when wait (at most StatusWaitMax) has passed.
func ScriptWatchPath(scriptName, since string, wait time.Duration) string {
	return ScriptPath(scriptName) + "?" + url.Values{"since": {since}, "wait": {wait.String()}}.Encode()
}

// StatusWaitMax bounds the wait of one script status long poll.
const StatusWaitMax = 10 * time.Second

// ScriptDeletePath is the conditional delete of one script for one worker UID.
func ScriptDeletePath(scriptName, workerUID string) string {
	return ScriptPath(scriptName) + "?" + url.Values{queryWorkerUID: {workerUID}}.Encode()
}

// SecretsPath is the secret delivery of one script.
func SecretsPath(scriptName string) string { return ScriptPath(scriptName) + "/secrets" }

// SecretsDeletePath is the conditional erasure of one script's delivery for one worker UID.
func SecretsDeletePath(scriptName, workerUID string) string {
	return SecretsPath(scriptName) + "?" + url.Values{queryWorkerUID: {workerUID}}.Encode()
}

// ReadbackPath is the challenge readback of one script's delivery.
func ReadbackPath(scriptName string) string { return SecretsPath(scriptName) + "/readback" }

// LogQuery selects a page of a worker's log entries.
type LogQuery struct {
	WorkerUID string
	// Epoch and After are the cursor of the last page read (zero: from the start of the ring).
	Epoch string
	After uint64
	// Since, when set, skips entries received before it.
	Since time.Time
	// Wait makes the call a long poll of at most LogWaitMax.
	Wait time.Duration
}

// LogWaitMax bounds the wait of one log long poll.
const LogWaitMax = 30 * time.Second

// MaxLogWaits bounds the log long polls a node holds at once, and MaxAdminConns the admin API's
// connections: both well inside the descriptors the node keeps for its own use, its probes first
// (edge.DescriptorReserve).
const (
	MaxLogWaits   = 512
	MaxAdminConns = 1024
)

// LogsPath is the log read of one script for one worker UID.
func LogsPath(scriptName string, q LogQuery) string {
	v := url.Values{queryWorkerUID: {q.WorkerUID}}
	if q.Epoch != "" {
		v.Set("epoch", q.Epoch)
		v.Set("after", strconv.FormatUint(q.After, 10))
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if q.Wait > 0 {
		v.Set("wait", q.Wait.String())
	}
	return ScriptPath(scriptName) + "/logs?" + v.Encode()
}

// Levels of a log entry: a console method's name, or LevelException for an uncaught exception.
const (
	LevelLog       = "log"
	LevelInfo      = "info"
	LevelWarn      = "warn"
	LevelError     = "error"
	LevelDebug     = "debug"
	LevelException = "exception"
)

// LogEntry is one line a worker printed (Level and Message), or the count of lines the rate limit
// dropped since the previous entry (Dropped, with no Level).
type LogEntry struct {
	Seq         uint64    `json:"seq"`
	Time        time.Time `json:"time"`
	Incarnation string    `json:"incarnation,omitempty"`
	Level       string    `json:"level,omitempty"`
	Message     string    `json:"message,omitempty"`
	Dropped     int       `json:"dropped,omitempty"`
}

// LogPage answers a log read: entries in order, and the cursor (Epoch, Next) to read on from.
type LogPage struct {
	Epoch   string     `json:"epoch"`
	Next    uint64     `json:"next"`
	Missed  int        `json:"missed"`
	Entries []LogEntry `json:"entries"`
}

// RoutePath is the path of one hostname's route.
func RoutePath(hostname string) string { return "/v1/routes/" + url.PathEscape(hostname) }

// RouteDeletePath is the compare-and-delete of one hostname's route.
func RouteDeletePath(hostname, scriptName, endpointUID string) string {
	return RoutePath(hostname) + "?" + url.Values{queryScriptName: {scriptName}, queryEndpointUID: {endpointUID}}.Encode()
}

// Query parameter names of the conditional deletes.
const (
	QueryWorkerUID   = queryWorkerUID
	QueryScriptName  = queryScriptName
	QueryEndpointUID = queryEndpointUID
)

// Labels say whose a script is. The runtime interprets them only to scope brakes.
type Labels struct {
	Organization string `json:"organization"`
	Space        string `json:"space"`
	Worker       string `json:"worker"`
}

// ScriptPut is the desired deployment of one script.
type ScriptPut struct {
	EffectID          string            `json:"effectId"`
	WorkerUID         string            `json:"workerUid"`
	DeploymentID      string            `json:"deploymentId"`
	Generation        int64             `json:"generation"`
	Labels            Labels            `json:"labels"`
	Modules           map[string]string `json:"modules"`
	MainModule        string            `json:"mainModule"`
	CompatibilityDate string            `json:"compatibilityDate"`
	// Settings: vars, jsonVars and compatibilityFlags, inline; absent when none.
	workerconf.Settings
	SecretNames []string `json:"secretNames"`
	// BundleDigest is the Host's digest of the bundle, kept and reported back; the runtime's
	// incarnation identity uses its own digest of the modules.
	BundleDigest string `json:"bundleDigest"`
}

// Incarnation states.
const (
	StatePending = "pending"
	StateReady   = "ready"
	StateFailed  = "failed"
)

// Reasons an incarnation or a script is not Ready (the Host reports them as worker conditions).
const (
	ReasonPending    = "RuntimePending"
	ReasonFailed     = "RuntimeFailed"
	ReasonRestarting = "RuntimeRestarting"
	// ReasonUnresponsive: a Ready incarnation missed its liveness probes (a worker stuck in a
	// loop blocks workerd's one thread); it is killed and restarted (SPEC 5.1).
	ReasonUnresponsive   = "RuntimeUnresponsive"
	ReasonBraked         = "LifecycleBrake"
	ReasonSecretsPending = "RuntimeInputPending"
	ReasonReady          = "Ready"
	// ReasonQuarantined: the worker was implicated in repeated kills of its organization's
	// process and waits for a process of its own (SPEC 5.1); it answers 503 meanwhile.
	ReasonQuarantined = "RuntimeQuarantined"
)

// Incarnation is one running identity of a script: its exact bundle and config (secrets included
// by keyed digest), served by one workerd process.
type Incarnation struct {
	ID           string `json:"id"`
	DeploymentID string `json:"deploymentId"`
	Generation   int64  `json:"generation"`
	// DeliveryID names the secret delivery it runs with, empty when it runs with none.
	DeliveryID string `json:"deliveryId"`
	State      string `json:"state"`
	Reason     string `json:"reason"`
	Message    string `json:"message"`
	// Restarts counts restarts of this incarnation since the runtime node started.
	Restarts int  `json:"restarts"`
	Incident bool `json:"incident"`
	// Address is its process's ingress socket ("unix:" and a path), Loader the id that process's
	// router loads it under (a request to Address names it in the Takoform-Incarnation header),
	// and PID the process (0 when down).
	Address string `json:"address"`
	Loader  string `json:"loader"`
	PID     int    `json:"pid"`
}

// SecretsStatus describes a script's delivery without any value.
type SecretsStatus struct {
	Delivered  bool     `json:"delivered"`
	Names      []string `json:"names"`
	DeliveryID string   `json:"deliveryId"`
}

// ScriptStatus is what the runtime holds and runs for one script.
type ScriptStatus struct {
	ScriptName   string        `json:"scriptName"`
	Present      bool          `json:"present"`
	WorkerUID    string        `json:"workerUid"`
	DeploymentID string        `json:"deploymentId"`
	Generation   int64         `json:"generation"`
	BundleDigest string        `json:"bundleDigest"`
	Labels       Labels        `json:"labels"`
	SecretNames  []string      `json:"secretNames"`
	Secrets      SecretsStatus `json:"secrets"`
	// Incarnation is the one serving (or, before any has served, the one starting); Candidate is a
	// newer one being admitted beside it.
	Incarnation *Incarnation `json:"incarnation"`
	Candidate   *Incarnation `json:"candidate"`
	// Ready: the serving incarnation is Ready and is the one for the current desired deployment
	// (and, when the script declares secretNames, runs with the current delivery of those names).
	Ready  bool   `json:"ready"`
	Reason string `json:"reason"`
	// Incident: the script's incarnation was implicated in six kills or aborts of its process
	// within an hour (retries continue).
	Incident        bool   `json:"incident"`
	IncidentMessage string `json:"incidentMessage,omitempty"`
	// Quarantined: the script's incarnation was implicated in repeated kills of its
	// organization's process, and runs in a process of its own (or waits for one, answering 503).
	Quarantined       bool   `json:"quarantined,omitempty"`
	QuarantineMessage string `json:"quarantineMessage,omitempty"`
	// Version changes whenever anything else in this status does: a long poll names the one it
	// last read (ScriptWatchPath).
	Version string `json:"version"`
}

// SecretsPut delivers the values of one worker UID's secret bindings. Its String, GoString,
// Format and LogValue never show a value; only MarshalJSON (the wire) does.
//
// A pool's delivery carries Sealed instead of Values: the values sealed to the pool's public key
// for WorkerUID and DeliveryID (poolkey), which the node opens with its --pool-key-file. Restore
// asks the node to take it only when it holds no delivery for WorkerUID (the Host naming a
// delivery again to a node that lost its state; SPEC 6.2).
type SecretsPut struct {
	EffectID   string
	WorkerUID  string
	DeliveryID string
	Values     map[string]vocab.Secret
	Sealed     []byte
	Restore    bool
	// Replaces is, with Restore, the delivery the node must hold for the restore to be taken
	// ("": none): a node restored from an old backup holds a superseded delivery of the worker.
	Replaces string
}

type secretsPutWire struct {
	EffectID   string            `json:"effectId"`
	WorkerUID  string            `json:"workerUid"`
	DeliveryID string            `json:"deliveryId"`
	Values     map[string]string `json:"values,omitempty"`
	Sealed     []byte            `json:"sealed,omitempty"`
	Restore    bool              `json:"restore,omitempty"`
	Replaces   string            `json:"replaces,omitempty"`
}

// MarshalJSON writes the values in clear: the request body is the one place they travel.
func (p SecretsPut) MarshalJSON() ([]byte, error) {
	w := secretsPutWire{EffectID: p.EffectID, WorkerUID: p.WorkerUID, DeliveryID: p.DeliveryID, Values: make(map[string]string, len(p.Values)),
		Sealed: p.Sealed, Restore: p.Restore, Replaces: p.Replaces}
	for k, v := range p.Values {
		w.Values[k] = v.Reveal()
	}
	return json.Marshal(w)
}

// UnmarshalJSON reads the wire form.
func (p *SecretsPut) UnmarshalJSON(b []byte) error {
	var w secretsPutWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*p = SecretsPut{EffectID: w.EffectID, WorkerUID: w.WorkerUID, DeliveryID: w.DeliveryID, Values: make(map[string]vocab.Secret, len(w.Values)),
		Sealed: w.Sealed, Restore: w.Restore, Replaces: w.Replaces}
	for k, v := range w.Values {
		p.Values[k] = vocab.NewSecret(v)
	}
	return nil
}

func (p SecretsPut) String() string {
	names := make([]string, 0, len(p.Values))
	for k := range p.Values {
		names = append(names, k)
	}
	return fmt.Sprintf("SecretsPut{effectId:%s workerUid:%s deliveryId:%s names:%v sealed:%d bytes restore:%t}", p.EffectID, p.WorkerUID, p.DeliveryID, names, len(p.Sealed), p.Restore)
}

// GoString redacts like String.
func (p SecretsPut) GoString() string { return p.String() }

// Format redacts for every verb.
func (p SecretsPut) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(p.String())) }

// LogValue redacts in slog.
func (p SecretsPut) LogValue() slog.Value { return slog.StringValue(p.String()) }

// ReadbackRequest carries the Host's challenge: standard base64 of 32 bytes.
type ReadbackRequest struct {
	Challenge string `json:"challenge"`
	// Concludes names the delivery whose lease this readback decides. When the script does not
	// hold it, the runtime refuses it from then on (409 delivery_refused), so that a copy of it
	// still on its way (from a Host that died while sending it, or a call that timed out) can never
	// land after the Host has failed its lease for not finding it.
	Concludes string `json:"concludes,omitempty"`
}

// Readback answers a challenge: Digest is lowercase hex HMAC-SHA256(challenge, canonical JSON of
// the bindings as given to workerd), empty when nothing is delivered.
type Readback struct {
	Present    bool   `json:"present"`
	WorkerUID  string `json:"workerUid"`
	DeliveryID string `json:"deliveryId"`
	Digest     string `json:"digest"`
}

// RoutePut installs hostname → script for one endpoint UID.
type RoutePut struct {
	EffectID     string `json:"effectId"`
	ScriptName   string `json:"scriptName"`
	EndpointUID  string `json:"endpointUid"`
	DeploymentID string `json:"deploymentId"`
}

// RouteStatus is what the runtime holds for one hostname. Ready: installed, and its script's
// serving incarnation is Ready.
type RouteStatus struct {
	Hostname     string `json:"hostname"`
	Present      bool   `json:"present"`
	ScriptName   string `json:"scriptName"`
	EndpointUID  string `json:"endpointUid"`
	DeploymentID string `json:"deploymentId"`
	Ready        bool   `json:"ready"`
}

// BrakeScope selects scripts by their labels: empty is every script; Space needs Organization, and
// Worker needs Space.
type BrakeScope struct {
	Organization string `json:"organization,omitempty"`
	Space        string `json:"space,omitempty"`
	Worker       string `json:"worker,omitempty"`
}

// Matches reports whether a script with labels l is inside the scope.
func (s BrakeScope) Matches(l Labels) bool {
	return (s.Organization == "" || s.Organization == l.Organization) &&
		(s.Space == "" || s.Space == l.Space) &&
		(s.Worker == "" || s.Worker == l.Worker)
}

// Valid reports whether the scope is one of the shapes the CLI offers.
func (s BrakeScope) Valid() bool {
	if s.Space != "" && s.Organization == "" {
		return false
	}
	return (s.Space == "") == (s.Worker == "")
}

// BrakeSet engages or releases the lifecycle brake of exactly one scope.
type BrakeSet struct {
	Engaged bool       `json:"engaged"`
	Scope   BrakeScope `json:"scope"`
}

// Brakes lists the engaged lifecycle brakes.
type Brakes struct {
	Lifecycle []BrakeScope `json:"lifecycle"`
}

// Status is everything the runtime holds.
type Status struct {
	Scripts []ScriptStatus `json:"scripts"`
	Routes  []RouteStatus  `json:"routes"`
	// GenerationFloor is the highest generation the node has held or deleted under any script
	// name: a PUT at or below it may be refused as stale, so a Host whose database was restored to
	// an earlier point moves its generations past it before it deploys again.
	GenerationFloor int64  `json:"generationFloor"`
	Brakes          Brakes `json:"brakes"`
	// Sandbox says how workers run (SPEC 5.1): SandboxBwrap, or SandboxOff when the node was
	// started with --insecure-no-sandbox.
	Sandbox string `json:"sandbox"`
	// Boot identifies this start of the node: the Host confirms a member's place in its pool only
	// for the start it found up to date (SPEC 6.2).
	Boot string `json:"boot,omitempty"`
}

// Pool is the pool key a node holds (GET PathPool): its pool's name and public key, both empty
// when the node has none (SPEC 6.2).
type Pool struct {
	Pool      string `json:"pool"`
	PublicKey string `json:"publicKey"`
	// PreviousPublicKey is the key PublicKey replaces, while the node still opens its blobs.
	PreviousPublicKey string `json:"previousPublicKey,omitempty"`
}

// Membership is a node's place in its pool (SPEC 6.2), which the Host tells it (PUT PathMembership)
// after each complete reconciliation and at each change. The node keeps it in its state
// directory, and:
//   - serves (its edge routes workers) unless it is retired or removed, has drained (draining for
//     FenceSeconds since DrainingSince), or restarted as a member of a pool of two or more and the
//     Host has not confirmed it since (it may have missed changes while it was away);
//   - answers its edge's GET /healthz 200 only while serving and its State is serving.
type Membership struct {
	Pool          string     `json:"pool"`
	Node          string     `json:"node"`
	State         string     `json:"state"`
	Epoch         int64      `json:"epoch"`
	PoolSize      int        `json:"poolSize"`
	FenceSeconds  int        `json:"fenceSeconds"`
	DrainingSince *time.Time `json:"drainingSince,omitempty"`
	// Confirms names the start of the node (Status.Boot) the Host found wholly up to date: a
	// restarted member of a pool of two or more serves again only once its own start is
	// confirmed. Empty confirms nothing.
	Confirms string `json:"confirms,omitempty"`
}

// States of a pool member (SPEC 6.2).
const (
	MemberJoining  = "joining"
	MemberServing  = "serving"
	MemberDraining = "draining"
	MemberRemoved  = "removed"
	MemberRetired  = "retired"
)

// MembershipStatus is what GET PathMembership answers: the membership the node holds (nil before
// any), whether the Host confirmed it since the node started, and whether its edge routes.
type MembershipStatus struct {
	Membership *Membership `json:"membership,omitempty"`
	Boot       string      `json:"boot"`
	Confirmed  bool        `json:"confirmed"`
	Routes     bool        `json:"routes"`
	Reason     string      `json:"reason,omitempty"`
}

// Reseal is a pool blob of one worker UID and delivery, sent to be sealed again to the node's
// current pool key (POST PathPoolReseal), and answered sealed again.
type Reseal struct {
	WorkerUID  string `json:"workerUid"`
	DeliveryID string `json:"deliveryId"`
	Sealed     []byte `json:"sealed"`
}

// Values of Status.Sandbox.
const (
	SandboxBwrap = "bwrap"
	SandboxOff   = "off"
)

// Problem is an RFC 9457 problem with a stable machine Code.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Code   string `json:"code"`
	// Current describes what is there when a conditional request found something else.
	Current any `json:"current,omitempty"`
}

// NewProblem builds a problem whose type URI is derived from its code.
func NewProblem(status int, code, title, detail string) *Problem {
	return &Problem{Type: problemTypeURIPrefix + code, Title: title, Status: status, Detail: detail, Code: code}
}

func (p *Problem) Error() string {
	if p.Detail != "" {
		return fmt.Sprintf("%d %s: %s", p.Status, p.Code, p.Detail)
	}
	return fmt.Sprintf("%d %s: %s", p.Status, p.Code, p.Title)
}

// Problem codes.
const (
	CodeUnauthorized       = "unauthorized"
	CodeInvalidRequest     = "invalid_request"
	CodeNotFound           = "not_found"
	CodeMethodNotAllowed   = "method_not_allowed"
	CodeEffectConflict     = "effect_conflict"
	CodeStaleGeneration    = "stale_generation"
	CodeGenerationConflict = "generation_conflict"
	CodeWorkerMismatch     = "worker_mismatch"
	// CodeScriptHeld: the script name is another worker UID's until that worker's delete is
	// confirmed (SPEC 3.4). The answer names nobody.
	CodeScriptHeld = "script_held"
	// CodeDeliveryRefused: a readback concluded this delivery absent; it never lands now.
	CodeDeliveryRefused = "delivery_refused"
	// CodeDeliveryHeld: a restore found another delivery held than the one it replaces.
	CodeDeliveryHeld = "delivery_held"
	CodeScriptAbsent = "script_absent"
	// CodeTickExpired: a cron tick asked of the node after its deadline; it never runs now.
	CodeTickExpired = "tick_expired"
	// CodeLogWaitsFull: the node already holds MaxLogWaits log long polls.
	CodeLogWaitsFull  = "log_waits_full"
	CodeSecretNames   = "secret_names_mismatch"
	CodeRouteConflict = "route_conflict"
	// CodeMemoryAboveNode: a script's limits.memoryMb is above the node's ceiling for one
	// incarnation; the node never starts it under a lower ceiling than it asked for.
	CodeMemoryAboveNode = "memory_above_node"
	CodeInternal        = "internal"
	// Edge answers.
	CodeUnknownHost = "unknown_host"
	// CodeNotServing: the node serves no worker (retired from its pool, drained, or waiting for the
	// Host to confirm it after a restart: SPEC 6.2).
	CodeNotServing = "node_not_serving"
	// CodeStaleMembership: a membership the node refuses (an older epoch, or one that would bring
	// back a node that left its pool).
	CodeStaleMembership = "stale_membership"
	// CodeLeftPool: the node was retired or removed from its pool, as it was last told: it takes
	// no write (a script, route, delivery or tick) until its state is wiped and it is added again.
	CodeLeftPool      = "node_left_pool"
	CodeNotReady      = "script_not_ready"
	CodeUpstreamError = "upstream_error"
	// Limits of the edge (SPEC 5.1).
	CodeResponseTimeout = "response_timeout"
	CodeBodyTooLarge    = "body_too_large"
	CodeBodyTimeout     = "body_timeout"
	CodeBadFraming      = "bad_framing"
	// Egress (SPEC 5.1): what a worker's own subrequests may be answered with.
	CodeEgressRefused   = "egress_refused"
	CodeSubrequestLimit = "subrequest_limit"
	CodeLoopDetected    = "loop_detected"
)
