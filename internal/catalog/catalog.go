// Package catalog holds the offerings the Host sells and the backend installations behind them
// (SPEC 6.1). With no config file the catalog is one selfhost installation selling module-worker and
// worker-endpoint to every organization.
package catalog

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
	"github.com/takoform/terraform-provider-takoform/internal/poolkey"
	"github.com/takoform/terraform-provider-takoform/internal/quota"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

// Backend packs.
const (
	PackSelfhost      = "selfhost"
	PackWorkersDev    = "workers-dev"
	PackWFPManaged    = "wfp-managed"
	KindWorker        = "module-worker"
	KindEndpoint      = "worker-endpoint"
	everyOrganization = "*"
)

// Installation is one configured backend: a pack plus its settings.
type Installation struct {
	Name string `json:"name"`
	Pack string `json:"pack"`
	// selfhost
	EndpointSuffix string `json:"endpointSuffix,omitempty"`
	EdgeListen     string `json:"edgeListen,omitempty"`
	Scheme         string `json:"scheme,omitempty"`
	// RuntimeURL is the runtime node's admin API (SPEC 5); RuntimeTokenFile holds its bearer token.
	RuntimeURL       string `json:"runtimeUrl,omitempty"`
	RuntimeTokenFile string `json:"runtimeTokenFile,omitempty"`
	// RuntimeCAFile (PEM) is the private CA that issued the runtime's admin certificate;
	// RuntimeClientCertFile and RuntimeClientKeyFile (PEM) are the Host's certificate for mutual
	// TLS (SPEC 5.1, control channel). All need an https:// RuntimeURL.
	RuntimeCAFile         string `json:"runtimeCaFile,omitempty"`
	RuntimeClientCertFile string `json:"runtimeClientCertFile,omitempty"`
	RuntimeClientKeyFile  string `json:"runtimeClientKeyFile,omitempty"`
	// PoolPublicKey ("x25519:…", from `takoserver nodes init-pool-key`) is the pool's public key
	// (SPEC 6.2): a selfhost installation that names it seals each delivery to its nodes at
	// dispatch and keeps the blob, so that a node that lost its state gets its secrets back. Not
	// part of the offering digest: a key rotation moves no worker.
	PoolPublicKey string `json:"poolPublicKey,omitempty"`
	// FenceSeconds is how long a node of the pool must have been fenced (out of DNS and every
	// load balancer) before `takoserver nodes retire --lost` takes it out of the pool (SPEC 6.2).
	// Zero takes DefaultFence. Not part of the offering digest.
	FenceSeconds int `json:"fenceSeconds,omitempty"`
	// SuspectAfterSeconds is how long a serving node of the pool may stay silent before it leaves
	// the Ready set (it never leaves custody). Zero takes DefaultSuspectAfter. Not part of the
	// offering digest.
	SuspectAfterSeconds int `json:"suspectAfterSeconds,omitempty"`
	// Cloudflare packs (SPEC 8): the account, the file holding its API token (0600, in a 0700
	// directory), and the API's base URL (default Cloudflare's; tests and Cloudflare-compatible
	// gateways set it).
	AccountID    string `json:"accountId,omitempty"`
	APITokenFile string `json:"apiTokenFile,omitempty"`
	APIBaseURL   string `json:"apiBaseUrl,omitempty"`
	// ScriptCeiling is how many scripts the installation's account (or dispatch namespace) may
	// hold across every organization it is sold to (SPEC 8: 500 on Cloudflare's paid plans, 100 on
	// Free); the Host answers 429 quota_exceeded at it. Zero takes DefaultScriptCeiling.
	ScriptCeiling int `json:"scriptCeiling,omitempty"`
	// CronCeiling is how many cron triggers the installation's account may hold across every
	// worker of every organization it serves (Cloudflare caps them per account: 250 on a paid
	// plan); the Host answers 429 quota_exceeded past it. Zero takes DefaultCronCeiling.
	CronCeiling int `json:"cronCeiling,omitempty"`
	// RoutePropagationSeconds is how long after an endpoint's route reads back deleted the edge
	// may still route it (SPEC 8): the deletion attestation stays open that long. Zero takes the
	// pack's default (DefaultWorkersDevPropagation, DefaultWFPPropagation).
	RoutePropagationSeconds int `json:"routePropagationSeconds,omitempty"`
	// workers-dev
	AccountSubdomain string `json:"accountSubdomain,omitempty"`
	// wfp-managed: the base domain sold, the dispatch namespace the scripts live in, the dispatch
	// worker the base domain's wildcard route reaches, and the KV namespace it looks hostnames up in.
	// The dispatch worker's contract version is not part of the offering digest (an upgrade of it
	// would otherwise strand every worker on the installation as placement drift): the pack reads
	// it back from the dispatch worker before it uploads a service binding that needs it.
	BaseDomain           string `json:"baseDomain,omitempty"`
	DispatchNamespace    string `json:"dispatchNamespace,omitempty"`
	DispatchWorkerName   string `json:"dispatchWorkerName,omitempty"`
	RoutingKVNamespaceID string `json:"routingKvNamespaceId,omitempty"`
	// SaaSZoneID and SaaSCnameTarget: the operator's zone whose Cloudflare for SaaS custom
	// hostnames carry users' custom domains (SPEC 3.7), and the target users point them at. The
	// zone's */* route reaches the dispatch worker; the API token also needs the zone's "SSL and
	// Certificates: Edit". Not in the digest: where custom domains land, not where workers run.
	SaaSZoneID      string `json:"saasZoneId,omitempty"`
	SaaSCnameTarget string `json:"saasCnameTarget,omitempty"`
}

// Defaults of the Cloudflare packs (SPEC 8).
const (
	DefaultScriptCeiling         = 500
	DefaultCronCeiling           = 250
	DefaultWorkersDevPropagation = 30 * time.Second
	DefaultWFPPropagation        = 90 * time.Second
	// MinKVCacheTTL is Cloudflare's smallest cacheTtl for KV reads, which the dispatch worker's
	// routing lookups use.
	MinKVCacheTTL = 60 * time.Second
)

// DefaultFence is a selfhost pool's fenceSeconds when the catalog names none.
const DefaultFence = 300 * time.Second

// DefaultSuspectAfter is a selfhost pool's suspectAfterSeconds when the catalog names none.
const DefaultSuspectAfter = 30 * time.Second

// Suspect is how long a serving node of the pool may be silent before it is suspect.
func (inst Installation) Suspect() time.Duration {
	if inst.SuspectAfterSeconds > 0 {
		return time.Duration(inst.SuspectAfterSeconds) * time.Second
	}
	return DefaultSuspectAfter
}

// Fence is how long a pool's node must have been fenced before it may be retired as lost.
func (inst Installation) Fence() time.Duration {
	if inst.FenceSeconds > 0 {
		return time.Duration(inst.FenceSeconds) * time.Second
	}
	return DefaultFence
}

// Propagation is how long a deleted route of this installation may still be served.
func (inst Installation) Propagation() time.Duration {
	if inst.RoutePropagationSeconds > 0 {
		return time.Duration(inst.RoutePropagationSeconds) * time.Second
	}
	if inst.Pack == PackWFPManaged {
		return DefaultWFPPropagation
	}
	return DefaultWorkersDevPropagation
}

// Crons is the installation's cron ceiling.
func (inst Installation) Crons() int {
	if inst.CronCeiling > 0 {
		return inst.CronCeiling
	}
	return DefaultCronCeiling
}

// Scripts is the installation's script ceiling.
func (inst Installation) Scripts() int {
	if inst.ScriptCeiling > 0 {
		return inst.ScriptCeiling
	}
	return DefaultScriptCeiling
}

// Offering is one sold catalog entry. Digest is the SHA-256 of the canonical JSON of its
// placement, which includes the settings of its installation, so that any change to where or how
// it runs changes the digest.
type Offering struct {
	ID           string   `json:"id"`
	Kind         string   `json:"kind"`
	Installation string   `json:"installation"`
	SoldTo       []string `json:"soldTo"`
	// MaxCPUMs and MaxMemoryMB are the ceilings of a module-worker offering's per-worker limits
	// (0: the pack's default). They bound what a worker may ask for, not where it runs, so they
	// are not in the digest: raising one moves no worker.
	MaxCPUMs    int64 `json:"maxCpuMs,omitempty"`
	MaxMemoryMB int64 `json:"maxMemoryMb,omitempty"`
	// ChosenLabels: a reservation on this offering may choose its subdomain (SPEC 3.3; seed 001:
	// choosing a name is what a reseller lane sells). Unset: true on selfhost and wfp-managed;
	// workers-dev, whose only labels are script names, refuses it. What is sold, not where it runs:
	// not in the digest.
	ChosenLabels *bool `json:"chosenLabels,omitempty"`
	// MaxBundleBytes bounds a module-worker's bundle on the offering: its modules' names and
	// contents, bytes modules decoded (0: DefaultMaxBundleBytes; SPEC 3.6). What a worker may
	// hold, not where it runs: not in the digest.
	MaxBundleBytes int64 `json:"maxBundleBytes,omitempty"`
	// CustomDomains: the offering serves its organizations' verified custom domains (SPEC 3.7),
	// and where their DNS points. Unset: it serves none. What is sold, not where it runs: not in
	// the digest.
	CustomDomains *CustomDomains `json:"customDomains,omitempty"`
	Pack          string         `json:"-"`
	Digest        string         `json:"-"`
	// LegacyDigest is the digest objects placed on a selfhost offering carry when a release
	// before pools wrote them (it covered runtimeUrl): the Host rewrites it to Digest once, at
	// start (nodepool.MoveDigests). Empty for other packs.
	LegacyDigest string `json:"-"`
}

// CustomDomains is how an offering serves custom domains: Target is what a custom hostname's DNS
// points at, a host name (published as a CNAME) or an IP address (an A or AAAA record).
type CustomDomains struct {
	Target string `json:"target"`
}

// RoutingRecord is the record a custom hostname publishes to reach the offering: its type and
// value (the name is the hostname's own).
func (c CustomDomains) RoutingRecord() (recordType, value string) {
	if ip := net.ParseIP(c.Target); ip != nil {
		if ip.To4() != nil {
			return "A", c.Target
		}
		return "AAAA", c.Target
	}
	return "CNAME", c.Target
}

// SellsChosenLabels reports whether a reservation on the offering may choose its subdomain.
func (o Offering) SellsChosenLabels() bool {
	if o.ChosenLabels != nil {
		return *o.ChosenLabels
	}
	return o.Pack != PackWorkersDev
}

// DefaultMaxBundleBytes is an offering's bundle ceiling when its catalog entry names none: 10 MiB,
// on a runtime node as on Cloudflare (whose paid plans take 10 MB compressed, which a 10 MiB
// bundle always is).
const DefaultMaxBundleBytes = 10 << 20

// MaxBundleBytesCeiling bounds what an offering may set: a bundle travels base64 in one request
// (4/3 of its bytes), and a runtime node takes a request of at most 32 MiB.
const MaxBundleBytesCeiling = 20 << 20

// BundleCeiling is the most a worker's bundle may hold on the offering.
func (o Offering) BundleCeiling() int64 {
	if o.MaxBundleBytes > 0 {
		return o.MaxBundleBytes
	}
	return DefaultMaxBundleBytes
}

// Default ceilings of a worker's limits. Cloudflare: 30 s of CPU (Cloudflare's default on paid
// plans) and its fixed 128 MB isolates. selfhost (SPEC 5.1): a node runs an organization's workers
// as isolates of one process, all under V8's heap limit of 128 MB (a node with a lower one refuses
// more), and ends a request that computes past its liveness bound with its whole process, so a
// worker may not be promised more than that bound (2 s by default) per request.
const (
	DefaultMaxCPUMs              = 30000
	SelfhostMemoryMB             = 128
	SelfhostMaxCPUMs             = 2000
	CloudflareMemoryMB           = 128
	cloudflareMaxCPUMsUpperBound = 300000
)

// Cron deliveries: how an offering runs a worker's cron triggers (SPEC 3.6).
const (
	// CronsAtMostOnce: the Host claims each tick once and one node runs it at most once.
	CronsAtMostOnce = "at-most-once"
	// CronsAtLeastOnce: Cloudflare runs the ticks (its schedules API), at least once.
	CronsAtLeastOnce = "at-least-once"
)

// CronDelivery is how a module-worker on this offering has its cron triggers run, or "" when it
// has none: the Host runs selfhost's, Cloudflare workers-dev's; wfp-managed has no schedules API
// for dispatch-namespace scripts.
func (o Offering) CronDelivery() string {
	switch {
	case o.Kind != KindWorker:
		return ""
	case o.Pack == PackSelfhost:
		return CronsAtMostOnce
	case o.Pack == PackWorkersDev:
		return CronsAtLeastOnce
	}
	return ""
}

// Ceilings are the limits a worker on this offering may ask for.
func (o Offering) Ceilings() workerconf.Ceilings {
	c := workerconf.Ceilings{CPUMs: o.MaxCPUMs, MemoryMB: CloudflareMemoryMB, FixedMemory: true}
	switch {
	case o.Pack == PackSelfhost:
		c.MemoryMB = SelfhostMemoryMB
		if c.CPUMs == 0 {
			c.CPUMs = SelfhostMaxCPUMs
		}
	case c.CPUMs == 0:
		c.CPUMs = DefaultMaxCPUMs
	}
	return c
}

// Catalog is the validated set of installations and offerings, with the default per-organization
// ceilings and the per-key request rate every Host replica applies.
type Catalog struct {
	Installations map[string]Installation
	Offerings     []Offering
	// Quotas are the ceilings of an organization without overrides (SPEC 5.1).
	Quotas quota.Ceilings
	// Rates is the per-API-key request rate.
	Rates Rates
	// ReservedLabels are labels no reservation may choose (SPEC 3.3): the operator's own names.
	ReservedLabels map[string]bool
	// ReservedDomains are names no custom domain may claim, nor any name under them (SPEC 3.7):
	// the catalog's reservedDomains, every installation's endpoint suffix and base domain, and
	// workers.dev.
	ReservedDomains []string
}

// DomainReserved reports the reserved domain name is (or is under), or "".
func (c *Catalog) DomainReserved(name string) string {
	for _, d := range c.ReservedDomains {
		if name == d || strings.HasSuffix(name, "."+d) {
			return d
		}
	}
	return ""
}

// Rates is the token bucket each API key gets on each Host replica: PerSecond tokens a second up
// to Burst. A replica keeps its buckets in memory, so behind N replicas a key gets up to N times
// the rate. PerSecond 0 turns the limit off.
type Rates struct {
	PerSecond float64
	Burst     int
}

// Default request rate per API key and replica. A refresh is one request per resource, sent as
// fast as the Host answers (a no-op plan of 100 resources: 101 requests in about a second), and
// an apply of the same 100 sends about 400 in 7 s: the burst takes the refresh of a
// 1,000-resource configuration at once, and the sustained rate a 100-resource plan every second,
// while a key in a loop is held to a small share of a replica.
const (
	DefaultRatePerSecond = 100
	DefaultRateBurst     = 1000
)

type file struct {
	Installations []Installation `json:"installations"`
	Offerings     []Offering     `json:"offerings"`
	Quotas        *quotasFile    `json:"quotas,omitempty"`
	Rates         *ratesFile     `json:"rates,omitempty"`
	// ReservedLabels are labels no reservation may choose.
	ReservedLabels []string `json:"reservedLabels,omitempty"`
	// ReservedDomains are names no custom domain may claim (besides the installations' own).
	ReservedDomains []string `json:"reservedDomains,omitempty"`
}

// quotasFile is the config file's top-level "quotas": the default ceilings, each optional.
type quotasFile struct {
	Workers       *int `json:"workers"`
	Endpoints     *int `json:"endpoints"`
	Reservations  *int `json:"reservations"`
	RuntimeInputs *int `json:"runtimeInputs"`
	CustomDomains *int `json:"customDomains"`
}

// ratesFile is the config file's top-level "rates".
type ratesFile struct {
	PerKeyPerSecond *float64 `json:"perKeyPerSecond"`
	PerKeyBurst     *int     `json:"perKeyBurst"`
}

// The default selfhost installation's runtime node (SPEC 6.1): the one `takoserver dev` embeds
// and `takoserver runtime` runs with its defaults.
const (
	DefaultRuntimeURL       = "http://127.0.0.1:8788"
	DefaultRuntimeTokenFile = ".takoform/runtime/admin-token"
)

// Default is the catalog used without a config file.
func Default() *Catalog {
	return DefaultWithRuntime(DefaultRuntimeURL, DefaultRuntimeTokenFile, "127.0.0.1:8787")
}

// DefaultWithRuntime is the default catalog pointing at another runtime node (tests, and a
// `takoserver dev` whose node listens elsewhere).
func DefaultWithRuntime(runtimeURL, tokenFile, edgeListen string) *Catalog {
	return DefaultWithEdge(runtimeURL, tokenFile, edgeListen, "http")
}

// DefaultWithEdge is DefaultWithRuntime for an edge that serves scheme (http, or https when the
// node has --edge-tls-* or --edge-acme-*): its origins are scheme://<label>.workers.localhost.
func DefaultWithEdge(runtimeURL, tokenFile, edgeListen, scheme string) *Catalog {
	c, err := build(file{
		Installations: []Installation{{
			Name: "selfhost", Pack: PackSelfhost,
			EndpointSuffix: "workers.localhost", EdgeListen: edgeListen, Scheme: scheme,
			RuntimeURL: runtimeURL, RuntimeTokenFile: tokenFile,
		}},
		Offerings: []Offering{
			{ID: "selfhost-module-worker", Kind: KindWorker, Installation: "selfhost", SoldTo: []string{everyOrganization},
				CustomDomains: edgeTarget(edgeListen)},
			{ID: "selfhost-worker-endpoint", Kind: KindEndpoint, Installation: "selfhost", SoldTo: []string{everyOrganization}},
		},
	})
	if err != nil {
		panic(err)
	}
	return c
}

// edgeTarget is where a custom domain of the default catalog points: the edge's address when it
// listens on one IP, else none is served.
func edgeTarget(edgeListen string) *CustomDomains {
	host, _, err := net.SplitHostPort(edgeListen)
	if err != nil || net.ParseIP(host) == nil || net.ParseIP(host).IsUnspecified() {
		return nil
	}
	return &CustomDomains{Target: host}
}

// SetPoolKey names the pool public key of the selfhost installation name (`takoserver dev` gives
// its embedded node's installation one). It moves no offering digest.
func (c *Catalog) SetPoolKey(name, publicKey string) error {
	inst, ok := c.Installations[name]
	if !ok || inst.Pack != PackSelfhost {
		return fmt.Errorf("no selfhost installation %q", name)
	}
	if _, err := poolkey.ParsePublic(publicKey); err != nil {
		return fmt.Errorf("poolPublicKey: %w", err)
	}
	inst.PoolPublicKey = publicKey
	c.Installations[name] = inst
	return nil
}

// Load reads a JSON catalog file: {"installations":[...], "offerings":[...], "quotas":{...},
// "rates":{...}}. Unknown fields are refused.
func Load(path string) (*Catalog, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read catalog: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var f file
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("catalog %s: %w", path, err)
	}
	c, err := build(f)
	if err != nil {
		return nil, fmt.Errorf("catalog %s: %w", path, err)
	}
	return c, nil
}

var (
	idPattern   = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	soldToEntry = regexp.MustCompile(`^(\*|[a-z0-9][a-z0-9_-]{0,62}|org_[a-z0-9]{8,40})$`)
)

func build(f file) (*Catalog, error) {
	c := &Catalog{Installations: map[string]Installation{}, Quotas: quota.Defaults(),
		Rates: Rates{PerSecond: DefaultRatePerSecond, Burst: DefaultRateBurst}}
	if err := f.Quotas.apply(&c.Quotas); err != nil {
		return nil, fmt.Errorf("quotas: %w", err)
	}
	if f.Quotas != nil && f.Quotas.CustomDomains != nil {
		if n := *f.Quotas.CustomDomains; n < 0 || n > 10_000 {
			return nil, fmt.Errorf("quotas: customDomains must be between 0 and 10000")
		}
		c.Quotas.CustomDomains = *f.Quotas.CustomDomains
	}
	c.ReservedDomains = []string{"workers.dev"}
	for _, d := range f.ReservedDomains {
		if !vocab.IsHostname(d) {
			return nil, fmt.Errorf("reservedDomains: %q is not a lowercase DNS name", d)
		}
		c.ReservedDomains = append(c.ReservedDomains, d)
	}
	if err := f.Rates.apply(&c.Rates); err != nil {
		return nil, fmt.Errorf("rates: %w", err)
	}
	c.ReservedLabels = map[string]bool{}
	for _, l := range f.ReservedLabels {
		if !vocab.Label.MatchString(l) {
			return nil, fmt.Errorf("reservedLabels: %q is not one lowercase DNS label", l)
		}
		c.ReservedLabels[l] = true
	}
	namespaces := map[string]string{}
	for _, inst := range f.Installations {
		if !idPattern.MatchString(inst.Name) {
			return nil, fmt.Errorf("installation name %q must match %s", inst.Name, idPattern)
		}
		if _, dup := c.Installations[inst.Name]; dup {
			return nil, fmt.Errorf("installation %q is declared twice", inst.Name)
		}
		if err := validateInstallation(&inst); err != nil {
			return nil, fmt.Errorf("installation %q: %w", inst.Name, err)
		}
		// Script names are unique per installation in the database (SPEC 3.4): two installations
		// on one runtime node, account or dispatch namespace would let two workers share one.
		ns := inst.ScriptNamespace()
		if other, dup := namespaces[ns]; dup {
			return nil, fmt.Errorf("installations %q and %q share one script namespace (%s): declare it once", other, inst.Name, ns)
		}
		namespaces[ns] = inst.Name
		c.Installations[inst.Name] = inst
		for _, d := range []string{inst.EndpointSuffix, inst.BaseDomain} {
			if d != "" {
				c.ReservedDomains = append(c.ReservedDomains, d)
			}
		}
	}
	seen := map[string]bool{}
	for _, o := range f.Offerings {
		if !idPattern.MatchString(o.ID) {
			return nil, fmt.Errorf("offering id %q must match %s", o.ID, idPattern)
		}
		if seen[o.ID] {
			return nil, fmt.Errorf("offering %q is declared twice", o.ID)
		}
		seen[o.ID] = true
		if o.Kind != KindWorker && o.Kind != KindEndpoint {
			return nil, fmt.Errorf("offering %q: kind must be %q or %q", o.ID, KindWorker, KindEndpoint)
		}
		inst, ok := c.Installations[o.Installation]
		if !ok {
			return nil, fmt.Errorf("offering %q names unknown installation %q", o.ID, o.Installation)
		}
		if len(o.SoldTo) == 0 {
			return nil, fmt.Errorf("offering %q: soldTo must name organizations or \"*\"", o.ID)
		}
		for _, s := range o.SoldTo {
			if !soldToEntry.MatchString(s) {
				return nil, fmt.Errorf("offering %q: soldTo entry %q is not an organization name, id or \"*\"", o.ID, s)
			}
		}
		o.Pack = inst.Pack
		switch {
		case o.MaxCPUMs < 0 || o.MaxMemoryMB < 0:
			return nil, fmt.Errorf("offering %q: maxCpuMs and maxMemoryMb must be positive", o.ID)
		case o.Pack != PackSelfhost && o.MaxMemoryMB != 0 && o.MaxMemoryMB != CloudflareMemoryMB:
			return nil, fmt.Errorf("offering %q: Cloudflare runs every worker with %d MB; maxMemoryMb must be %d or omitted", o.ID, CloudflareMemoryMB, CloudflareMemoryMB)
		case o.Pack != PackSelfhost && o.MaxCPUMs > cloudflareMaxCPUMsUpperBound:
			return nil, fmt.Errorf("offering %q: Cloudflare allows at most %d ms of CPU per request", o.ID, cloudflareMaxCPUMsUpperBound)
		case o.Pack == PackSelfhost && o.MaxMemoryMB != 0 && o.MaxMemoryMB != SelfhostMemoryMB:
			return nil, fmt.Errorf("offering %q: a runtime node runs every worker of an organization in one process, under V8's heap limit of %d MB each; maxMemoryMb must be %d or omitted", o.ID, SelfhostMemoryMB, SelfhostMemoryMB)
		case o.Pack == PackSelfhost && o.MaxCPUMs > SelfhostMaxCPUMs:
			return nil, fmt.Errorf("offering %q: a runtime node ends a request that computes for longer than its liveness bound (%d ms) with its organization's process; maxCpuMs must be at most %d", o.ID, SelfhostMaxCPUMs, SelfhostMaxCPUMs)
		case o.Pack == PackWorkersDev && o.ChosenLabels != nil && *o.ChosenLabels:
			return nil, fmt.Errorf("offering %q: workers-dev sells no chosen labels (a worker's only label there is its script name); remove chosenLabels", o.ID)
		case o.CustomDomains != nil && o.Pack == PackWFPManaged && inst.SaaSZoneID == "":
			return nil, fmt.Errorf("offering %q: a wfp-managed offering serves custom domains through Cloudflare for SaaS: give installation %q saasZoneId and saasCnameTarget", o.ID, inst.Name)
		case o.CustomDomains != nil && o.Pack == PackWFPManaged && o.CustomDomains.Target != "" && o.CustomDomains.Target != inst.SaaSCnameTarget:
			return nil, fmt.Errorf("offering %q: on wfp-managed, custom domains point at the installation's saasCnameTarget; leave customDomains.target out", o.ID)
		case o.CustomDomains != nil && o.Pack == PackWorkersDev:
			return nil, fmt.Errorf("offering %q: workers-dev cannot serve another party's domain (Cloudflare's Workers Custom Domains need a zone in the operator's account); remove customDomains", o.ID)
		case o.CustomDomains != nil && o.Kind != KindWorker:
			return nil, fmt.Errorf("offering %q: customDomains belongs on the module-worker offering, which reservations are placed on", o.ID)
		case o.CustomDomains != nil && o.Pack != PackWFPManaged && net.ParseIP(o.CustomDomains.Target) == nil && !vocab.IsHostname(o.CustomDomains.Target):
			return nil, fmt.Errorf("offering %q: customDomains.target %q is neither a DNS name nor an IP address", o.ID, o.CustomDomains.Target)
		case o.MaxBundleBytes < 0 || o.MaxBundleBytes > MaxBundleBytesCeiling:
			return nil, fmt.Errorf("offering %q: maxBundleBytes must be between 1 and %d (a bundle travels in one request to the Host and one to the node)", o.ID, MaxBundleBytesCeiling)
		case o.MaxMemoryMB != 0 && o.MaxMemoryMB < workerconf.MinMemoryMB:
			return nil, fmt.Errorf("offering %q: maxMemoryMb %d is below %d: workerd cannot start in it", o.ID, o.MaxMemoryMB, workerconf.MinMemoryMB)
		}
		if o.CustomDomains != nil && o.Pack == PackWFPManaged {
			o.CustomDomains = &CustomDomains{Target: inst.SaaSCnameTarget}
		}
		o.Digest = digest(o, inst, "")
		if inst.Pack == PackSelfhost {
			o.LegacyDigest = digest(o, inst, inst.RuntimeURL)
		}
		c.Offerings = append(c.Offerings, o)
	}
	return c, nil
}

// ScriptNamespace names where an installation's script names live: its runtime node, its
// account's workers.dev subdomain, or its managed base domain's dispatch namespace.
func (inst Installation) ScriptNamespace() string {
	switch inst.Pack {
	case PackSelfhost:
		if u, err := url.Parse(inst.RuntimeURL); err == nil {
			return "runtime node " + strings.ToLower(u.Host)
		}
		return "runtime node " + inst.RuntimeURL
	case PackWorkersDev:
		return "workers.dev account " + inst.AccountSubdomain
	}
	if inst.DispatchNamespace != "" {
		return "dispatch namespace " + inst.AccountID + "/" + inst.DispatchNamespace
	}
	return "dispatch namespace of " + inst.BaseDomain
}

func (q *quotasFile) apply(c *quota.Ceilings) error {
	if q == nil {
		return nil
	}
	for _, f := range []struct {
		name string
		from *int
		to   *int
	}{{"workers", q.Workers, &c.Workers}, {"endpoints", q.Endpoints, &c.Endpoints},
		{"reservations", q.Reservations, &c.Reservations}, {"runtimeInputs", q.RuntimeInputs, &c.RuntimeInputs}} {
		if f.from == nil {
			continue
		}
		if *f.from < 0 || *f.from > quota.MaxCeiling {
			return fmt.Errorf("%s must be between 0 and %d", f.name, quota.MaxCeiling)
		}
		*f.to = *f.from
	}
	return nil
}

func (r *ratesFile) apply(out *Rates) error {
	if r == nil {
		return nil
	}
	if r.PerKeyPerSecond != nil {
		if *r.PerKeyPerSecond < 0 || *r.PerKeyPerSecond > 1e6 {
			return fmt.Errorf("perKeyPerSecond must be between 0 (no limit) and 1000000")
		}
		out.PerSecond = *r.PerKeyPerSecond
	}
	if r.PerKeyBurst != nil {
		if *r.PerKeyBurst < 1 || *r.PerKeyBurst > 1e6 {
			return fmt.Errorf("perKeyBurst must be between 1 and 1000000")
		}
		out.Burst = *r.PerKeyBurst
	}
	return nil
}

func validateInstallation(inst *Installation) error {
	if inst.Pack != PackSelfhost && (inst.hasRuntimeTLS() || inst.PoolPublicKey != "" || inst.FenceSeconds != 0 || inst.SuspectAfterSeconds != 0) {
		return fmt.Errorf("runtimeCaFile, runtimeClientCertFile, runtimeClientKeyFile, poolPublicKey, fenceSeconds and suspectAfterSeconds belong to selfhost installations")
	}
	if inst.ScriptCeiling < 0 || inst.RoutePropagationSeconds < 0 || inst.CronCeiling < 0 || inst.FenceSeconds < 0 || inst.SuspectAfterSeconds < 0 {
		return fmt.Errorf("scriptCeiling, cronCeiling, routePropagationSeconds, fenceSeconds and suspectAfterSeconds may not be negative")
	}
	if inst.Pack == PackSelfhost && (inst.ScriptCeiling != 0 || inst.RoutePropagationSeconds != 0 || inst.CronCeiling != 0) {
		return fmt.Errorf("scriptCeiling, cronCeiling and routePropagationSeconds belong to Cloudflare installations")
	}
	switch inst.Pack {
	case PackSelfhost:
		if inst.EndpointSuffix == "" {
			inst.EndpointSuffix = "workers.localhost"
		}
		if inst.EdgeListen == "" {
			inst.EdgeListen = "127.0.0.1:8787"
		}
		if inst.Scheme == "" {
			inst.Scheme = "http"
		}
		if inst.RuntimeURL == "" {
			inst.RuntimeURL = DefaultRuntimeURL
		}
		if inst.RuntimeTokenFile == "" {
			inst.RuntimeTokenFile = DefaultRuntimeTokenFile
		}
		if err := ValidateRuntimeChannel(inst); err != nil {
			return err
		}
		if inst.PoolPublicKey != "" {
			if _, err := poolkey.ParsePublic(inst.PoolPublicKey); err != nil {
				return fmt.Errorf("poolPublicKey: %w", err)
			}
		}
		if !vocab.IsHostname(inst.EndpointSuffix) {
			return fmt.Errorf("endpointSuffix %q is not a lowercase DNS name", inst.EndpointSuffix)
		}
		if _, _, err := net.SplitHostPort(inst.EdgeListen); err != nil {
			return fmt.Errorf("edgeListen %q is not host:port", inst.EdgeListen)
		}
		if inst.Scheme != "http" && inst.Scheme != "https" {
			return fmt.Errorf("scheme must be http or https")
		}
		if inst.AccountSubdomain != "" || inst.BaseDomain != "" || inst.AccountID != "" || inst.APITokenFile != "" || inst.APIBaseURL != "" {
			return fmt.Errorf("selfhost takes endpointSuffix, edgeListen, scheme, runtimeUrl, runtimeTokenFile, the runtime's TLS files, poolPublicKey, fenceSeconds and suspectAfterSeconds only")
		}
	case PackWorkersDev:
		if !vocab.IsHostname(inst.AccountSubdomain) || strings.Contains(inst.AccountSubdomain, ".") {
			return fmt.Errorf("workers-dev needs accountSubdomain, one lowercase DNS label")
		}
		if inst.EndpointSuffix != "" || inst.EdgeListen != "" || inst.Scheme != "" || inst.RuntimeURL != "" || inst.RuntimeTokenFile != "" || inst.BaseDomain != "" ||
			inst.DispatchNamespace != "" || inst.DispatchWorkerName != "" || inst.RoutingKVNamespaceID != "" {
			return fmt.Errorf("workers-dev takes accountSubdomain only, with accountId, apiTokenFile, apiBaseUrl, scriptCeiling and routePropagationSeconds")
		}
		if err := validateCloudflareAPI(inst); err != nil {
			return err
		}
	case PackWFPManaged:
		if !vocab.IsHostname(inst.BaseDomain) || !strings.Contains(inst.BaseDomain, ".") {
			return fmt.Errorf("wfp-managed needs baseDomain, a lowercase DNS name")
		}
		if inst.EndpointSuffix != "" || inst.EdgeListen != "" || inst.Scheme != "" || inst.RuntimeURL != "" || inst.RuntimeTokenFile != "" || inst.AccountSubdomain != "" {
			return fmt.Errorf("wfp-managed takes baseDomain, dispatchNamespace, dispatchWorkerName and routingKvNamespaceId, with accountId, apiTokenFile, apiBaseUrl, scriptCeiling and routePropagationSeconds")
		}
		if (inst.SaaSZoneID == "") != (inst.SaaSCnameTarget == "") {
			return fmt.Errorf("wfp-managed saasZoneId and saasCnameTarget go together (the Cloudflare for SaaS zone of custom domains, and where users point them)")
		}
		if inst.SaaSZoneID != "" && (!cfName.MatchString(inst.SaaSZoneID) || !vocab.IsHostname(inst.SaaSCnameTarget)) {
			return fmt.Errorf("wfp-managed saasZoneId must be a zone id and saasCnameTarget a lowercase DNS name")
		}
		// The dispatch worker caches each routing entry for Cloudflare's smallest KV cacheTtl
		// (60 s): a shorter propagation window would close a deleted route's attestation, and
		// free its hostname for another organization, while the edge still serves the old
		// script. A Cloudflare-compatible API of the operator's own (apiBaseUrl) may cache less.
		if inst.APIBaseURL == "" && inst.RoutePropagationSeconds > 0 && inst.Propagation() < MinKVCacheTTL {
			return fmt.Errorf("wfp-managed routePropagationSeconds must be at least %d (Cloudflare caches KV reads that long)", int(MinKVCacheTTL.Seconds()))
		}
		if inst.HasCloudflareAPI() {
			for _, f := range []struct{ name, v string }{{"dispatchNamespace", inst.DispatchNamespace}, {"dispatchWorkerName", inst.DispatchWorkerName}, {"routingKvNamespaceId", inst.RoutingKVNamespaceID}} {
				if !cfName.MatchString(f.v) {
					return fmt.Errorf("wfp-managed with an API token needs %s (letters, digits, - and _)", f.name)
				}
			}
		}
		if err := validateCloudflareAPI(inst); err != nil {
			return err
		}
	default:
		return fmt.Errorf("pack must be one of %s, %s, %s", PackSelfhost, PackWorkersDev, PackWFPManaged)
	}
	return nil
}

// HasCloudflareAPI reports whether a Cloudflare installation names its account and API token.
func (inst Installation) HasCloudflareAPI() bool {
	return inst.AccountID != "" || inst.APITokenFile != ""
}

var (
	accountID = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	// cfName is a dispatch namespace, a script name or a KV namespace identifier.
	cfName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,63}$`)
)

// validateCloudflareAPI checks how the Host reaches Cloudflare's API for a Cloudflare installation
// (SPEC 8): accountId, apiTokenFile and an optional apiBaseUrl, which, like runtimeUrl, may be
// http:// only to loopback (the token travels in every request). The token file is checked
// (a regular 0600 file) but not read: the Host reads it when it first calls the API. An
// installation with none of them derives names and origins only; its mutations answer
// backend_misconfigured.
func validateCloudflareAPI(inst *Installation) error {
	if !inst.HasCloudflareAPI() && inst.APIBaseURL == "" {
		return nil
	}
	if !accountID.MatchString(inst.AccountID) {
		return fmt.Errorf("accountId must be the Cloudflare account's identifier")
	}
	if inst.APITokenFile == "" {
		return fmt.Errorf("apiTokenFile must name the file holding the API token")
	}
	info, err := os.Lstat(inst.APITokenFile)
	if err != nil {
		return fmt.Errorf("apiTokenFile: %w", err)
	}
	if !info.Mode().IsRegular() || info.Mode().Perm() != 0o600 {
		return fmt.Errorf("apiTokenFile %s must be a regular file of mode 0600 (it is %s)", inst.APITokenFile, info.Mode())
	}
	if inst.APIBaseURL == "" {
		return nil
	}
	u, err := url.Parse(inst.APIBaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("apiBaseUrl %q must be an http:// or https:// base URL", inst.APIBaseURL)
	}
	if u.Scheme == "http" && !loopbackHost(u.Hostname()) {
		return fmt.Errorf("apiBaseUrl %q is http:// to a host that is not loopback: the API token would cross the network in clear", inst.APIBaseURL)
	}
	return nil
}

func (inst *Installation) hasRuntimeTLS() bool {
	return inst.RuntimeCAFile != "" || inst.RuntimeClientCertFile != "" || inst.RuntimeClientKeyFile != ""
}

// ValidateRuntimeChannel checks how the Host reaches a selfhost runtime node (SPEC 5.1, control
// channel): the admin token and secret deliveries travel on it, so http:// is allowed to a loopback
// host only, and the TLS files, which need https://, are read now so that a wrong path or file is
// refused at start rather than at the first deployment.
func ValidateRuntimeChannel(inst *Installation) error {
	u, err := url.Parse(inst.RuntimeURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return fmt.Errorf("runtimeUrl %q must be an http:// or https:// base URL", inst.RuntimeURL)
	}
	if u.Scheme == "http" && !loopbackHost(u.Hostname()) {
		return fmt.Errorf("runtimeUrl %q is http:// to a host that is not loopback: the runtime's admin token and "+
			"secret deliveries would cross the network in clear; serve the admin API with TLS and use https:// "+
			"(runtimeCaFile names a private CA)", inst.RuntimeURL)
	}
	if u.Scheme == "http" && inst.hasRuntimeTLS() {
		return fmt.Errorf("runtimeCaFile, runtimeClientCertFile and runtimeClientKeyFile need an https:// runtimeUrl")
	}
	if (inst.RuntimeClientCertFile == "") != (inst.RuntimeClientKeyFile == "") {
		return fmt.Errorf("runtimeClientCertFile and runtimeClientKeyFile go together")
	}
	if inst.RuntimeCAFile != "" {
		pem, err := os.ReadFile(inst.RuntimeCAFile)
		if err != nil {
			return fmt.Errorf("runtimeCaFile: %w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return fmt.Errorf("runtimeCaFile %s holds no PEM certificate", inst.RuntimeCAFile)
		}
	}
	if inst.RuntimeClientCertFile != "" {
		if _, err := tls.LoadX509KeyPair(inst.RuntimeClientCertFile, inst.RuntimeClientKeyFile); err != nil {
			return fmt.Errorf("runtimeClientCertFile and runtimeClientKeyFile: %w", err)
		}
	}
	return nil
}

// loopbackHost reports whether a URL's host name is "localhost" or a loopback IP; other names are
// not, since what they resolve to can change.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// digest is the SHA-256 of the canonical JSON of o's placement (SPEC 1, offering): its id, kind,
// pack, installation name and every installation setting that changes where or how workers run
// or are addressed. Who it is sold to is not placement: selling it to one more organization
// changes no digest, so nothing already placed on it drifts. Nor are the credentials of the
// control channel (runtimeTokenFile, runtimeCaFile, runtimeClientCertFile, runtimeClientKeyFile):
// they say how the Host proves who it talks to, not where workers run, and rotating a certificate
// or moving its file must not make every worker placed on the node drift.
//
// A selfhost installation is a pool (SPEC 6.2): its digest covers the pool's name, suffix, scheme
// and public edge address, not its members, so a node added, retired or moved moves no worker.
// runtimeURL is what the digest says of runtimeUrl: "" now (which Cloudflare installations, with
// no runtimeUrl, always had), the catalog's value for the digest written before pools.
func digest(o Offering, inst Installation, runtimeURL string) string {
	installation := canonjson.Object{
		{Key: "name", Value: inst.Name},
		{Key: "pack", Value: inst.Pack},
		{Key: "endpointSuffix", Value: inst.EndpointSuffix},
		{Key: "edgeListen", Value: inst.EdgeListen},
		{Key: "scheme", Value: inst.Scheme},
		{Key: "runtimeUrl", Value: runtimeURL},
		{Key: "accountSubdomain", Value: inst.AccountSubdomain},
		{Key: "baseDomain", Value: inst.BaseDomain},
	}
	if inst.AccountID != "" {
		// The Cloudflare account is where the workers run (the API's base URL and token only say
		// how the Host reaches it). Left out when empty, so that no existing digest moves.
		installation = append(installation, canonjson.Field{Key: "accountId", Value: inst.AccountID})
	}
	// wfp-managed: the dispatch namespace is where its scripts live and the routing KV namespace
	// where its hostnames resolve. Left out when empty, like accountId.
	for _, f := range []canonjson.Field{{Key: "dispatchNamespace", Value: inst.DispatchNamespace}, {Key: "routingKvNamespaceId", Value: inst.RoutingKVNamespaceID}} {
		if f.Value != "" {
			installation = append(installation, f)
		}
	}
	sum := sha256.Sum256(canonjson.Marshal(canonjson.Object{
		{Key: "format", Value: "takoserver.offering-placement.v1"},
		{Key: "id", Value: o.ID},
		{Key: "kind", Value: o.Kind},
		{Key: "installation", Value: installation},
	}))
	return hex.EncodeToString(sum[:])
}

// PoolKey is the installation's pool public key, and whether it names one.
func (inst Installation) PoolKey() (poolkey.Public, bool) {
	if inst.PoolPublicKey == "" {
		return poolkey.Public{}, false
	}
	k, err := poolkey.ParsePublic(inst.PoolPublicKey)
	return k, err == nil
}

// Organization is the part of an organization the catalog needs to decide what is sold to it.
type Organization struct {
	ID   string
	Name string
}

// IsSoldTo reports whether o is sold to org.
func (o Offering) IsSoldTo(org Organization) bool {
	for _, s := range o.SoldTo {
		if s == everyOrganization || s == org.ID || s == org.Name {
			return true
		}
	}
	return false
}

// Visible lists the offerings sold to org, in catalog order.
func (c *Catalog) Visible(org Organization) []Offering {
	var out []Offering
	for _, o := range c.Offerings {
		if o.IsSoldTo(org) {
			out = append(out, o)
		}
	}
	return out
}

// Packs lists the distinct packs of the installations, sorted.
func (c *Catalog) Packs() []string {
	var packs []string
	for _, inst := range c.Installations {
		if !slices.Contains(packs, inst.Pack) {
			packs = append(packs, inst.Pack)
		}
	}
	slices.Sort(packs)
	return packs
}

// Offering selection errors.
var (
	// ErrOfferingAmbiguous: no offering id was given and zero or several eligible offerings are sold.
	ErrOfferingAmbiguous = errors.New("offering_ambiguous")
	// ErrOfferingUnknown: the named offering does not exist, is of another kind, or is not sold to the organization.
	ErrOfferingUnknown = errors.New("offering_unknown")
)

// Select picks the offering of kind for org: the one named by id, or, with no id, the only one
// of that kind sold to org (SPEC 3.3, offering selection).
func (c *Catalog) Select(org Organization, kind, id string) (Offering, Installation, error) {
	var found []Offering
	for _, o := range c.Visible(org) {
		if o.Kind == kind && (id == "" || o.ID == id) {
			found = append(found, o)
		}
	}
	switch {
	case id != "" && len(found) == 0:
		return Offering{}, Installation{}, fmt.Errorf("%w: no %s offering %q is sold to this organization", ErrOfferingUnknown, kind, id)
	case len(found) != 1:
		return Offering{}, Installation{}, fmt.Errorf("%w: %d %s offerings are sold to this organization; name one with offeringId", ErrOfferingAmbiguous, len(found), kind)
	}
	return found[0], c.Installations[found[0].Installation], nil
}

// SelectOn picks the only offering of kind sold to org on installation (an endpoint named with
// no offering goes where its worker runs), and reports false when there is none or several.
func (c *Catalog) SelectOn(org Organization, kind, installation string) (Offering, Installation, bool) {
	var found []Offering
	for _, o := range c.Visible(org) {
		if o.Kind == kind && o.Installation == installation {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		return Offering{}, Installation{}, false
	}
	return found[0], c.Installations[found[0].Installation], true
}

// Placement is where something runs: the offering (and its digest) and the backend behind it. It
// is stored on every reservation, resource and deployment and compared by every fence.
type Placement struct {
	OfferingID     string
	OfferingDigest string
	Pack           string
	Installation   string
}

// Placement is the placement of o.
func (o Offering) Placement() Placement {
	return Placement{OfferingID: o.ID, OfferingDigest: o.Digest, Pack: o.Pack, Installation: o.Installation}
}
