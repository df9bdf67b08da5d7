package edge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/takoform/terraform-provider-takoform/internal/safedir"
)

// ACMEOptions obtain the edge's certificates from an ACME CA, on demand: during the TLS handshake
// for a hostname the edge routes at that moment, never for any other.
type ACMEOptions struct {
	// Email is the account's contact at the CA; setting it turns ACME on. Using ACME agrees to
	// the CA's subscriber agreement.
	Email string
	// CA is the directory URL (default Let's Encrypt's production directory).
	CA string
	// CARoot is a PEM file of the CA certificates that issued the ACME server's own HTTPS
	// certificate (a private ACME CA); by default the system's roots are trusted.
	CARoot string
	// OrdersPerHour caps new certificate orders in any sliding hour (default 100: Let's Encrypt
	// allows an account 300 new orders per 3 hours). Orders beyond it fail the handshake that
	// asked; the next handshake for that hostname tries again.
	OrdersPerHour int
	// OrdersPerOrganizationPerHour caps one organization's share of them (default a fifth of
	// OrdersPerHour, at least 1): the organization is the routed worker's, so one tenant naming
	// many custom hostnames cannot spend the node's whole hour (SPEC 3.7).
	OrdersPerOrganizationPerHour int
	// Challenges are the ACME challenge types the edge answers: "tls-alpn-01" on its own port
	// (the CA must reach it on 443) and "http-01" on the plain-HTTP listener (the CA must reach
	// it on 80; only with --edge-http-listen). Empty: both, HTTP-01 where there is a listener.
	Challenges []string
}

// The challenge types the edge answers.
const (
	ChallengeTLSALPN = "tls-alpn-01"
	ChallengeHTTP    = "http-01"
)

// challenges reports which challenge types the options ask for.
func (o ACMEOptions) challenges() (tlsALPN, http01 bool) {
	if len(o.Challenges) == 0 {
		return true, true
	}
	return slices.Contains(o.Challenges, ChallengeTLSALPN), slices.Contains(o.Challenges, ChallengeHTTP)
}

// organizationShare is OrdersPerOrganizationPerHour's default.
func (o ACMEOptions) organizationShare() int {
	if o.OrdersPerOrganizationPerHour > 0 {
		return o.OrdersPerOrganizationPerHour
	}
	return max(1, o.OrdersPerHour/5)
}

// DefaultACMEOrdersPerHour is ACMEOptions.OrdersPerHour's default.
const DefaultACMEOrdersPerHour = 100

// ACMEDir is the private directory under the runtime's state directory where ACME state lives:
// the account key and every certificate and key obtained (certmagic's file storage).
const ACMEDir = "acme"

var (
	errNotRouted     = errors.New("no worker is routed at this hostname: no certificate is ordered for it")
	errOrdersLimited = errors.New("the edge's ACME order limit for this hour is reached")
	errOrgLimited    = errors.New("the ACME order limit of this hostname's organization for this hour is reached")
)

type acmeManager struct {
	cache   *certmagic.Cache
	config  *certmagic.Config
	issuer  *certmagic.ACMEIssuer
	limiter *hourLimits // the node's orders, under one key
	orgs    *hourLimits
}

// nodeOrders is the key the node's own order limit counts under.
const nodeOrders = "node"

// hourLimits count orders in a sliding hour, at most perHour under each key: the organizations'
// shares, and (another instance, under nodeOrders) the node's own limit. A key whose orders are
// all older is dropped. (certmagic's limiter hands out permits from a goroutine of its own, so one
// made and asked at once could refuse an organization's first order.)
type hourLimits struct {
	perHour int
	now     func() time.Time
	mu      sync.Mutex
	by      map[string][]time.Time
}

func newHourLimits(perHour int, now func() time.Time) *hourLimits {
	return &hourLimits{perHour: perHour, now: now, by: map[string][]time.Time{}}
}

// allow records an order of org and reports true while its last hour holds fewer than perHour.
func (l *hourLimits) allow(org string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	since := now.Add(-time.Hour)
	for o, times := range l.by {
		for len(times) > 0 && !times[0].After(since) {
			times = times[1:]
		}
		if len(times) == 0 {
			delete(l.by, o)
		} else {
			l.by[o] = times
		}
	}
	if len(l.by[org]) >= l.perHour {
		return false
	}
	l.by[org] = append(l.by[org], now)
	return true
}

// held is how many organizations have orders in the hour.
func (l *hourLimits) held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.by)
}

// newACME configures certmagic for on-demand issuance. The decision consults the edge's routes
// (serves), so an unknown hostname never reaches storage or the CA; an order counts against the
// node's hour and against the hour of the organization whose worker is routed there (ownerOf);
// TLS-ALPN-01 is answered by the edge's own listener at edgeAddr (the CA must reach it on port
// 443), and HTTP-01 by the plain-HTTP listener at httpAddr (nil: none) through HTTPChallenge.
func newACME(o ACMEOptions, serves func(string) bool, ownerOf func(string) string, edgeAddr, httpAddr net.Addr, stateDir string, owner safedir.Owner, log *slog.Logger) (*acmeManager, error) {
	tlsALPN, http01 := o.challenges()
	httpPort := 0
	if httpAddr != nil {
		_, p, err := net.SplitHostPort(httpAddr.String())
		if err != nil {
			return nil, err
		}
		if httpPort, err = strconv.Atoi(p); err != nil {
			return nil, err
		}
	} else if http01 && len(o.Challenges) > 0 && !tlsALPN {
		return nil, errors.New("--edge-acme-challenges http-01 needs --edge-http-listen: the CA asks for the challenge over plain HTTP")
	}
	http01 = http01 && httpPort != 0
	dir := filepath.Join(stateDir, ACMEDir)
	if err := safedir.Ensure(dir, owner); err != nil {
		return nil, err
	}
	var roots *x509.CertPool
	if o.CARoot != "" {
		pem, err := os.ReadFile(o.CARoot)
		if err != nil {
			return nil, fmt.Errorf("--edge-acme-ca-root: %w", err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--edge-acme-ca-root %s holds no PEM certificate", o.CARoot)
		}
	}
	if o.CA == "" {
		o.CA = certmagic.LetsEncryptProductionCA
	}
	if o.OrdersPerHour == 0 {
		o.OrdersPerHour = DefaultACMEOrdersPerHour
	}
	host, portText, err := net.SplitHostPort(edgeAddr.String())
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return nil, err
	}
	zl := zap.New(slogCore{h: log.With("part", "edge-acme").Handler()})
	m := &acmeManager{limiter: newHourLimits(o.OrdersPerHour, time.Now),
		orgs: newHourLimits(o.organizationShare(), time.Now)}
	m.cache = certmagic.NewCache(certmagic.CacheOptions{
		GetConfigForCert: func(certmagic.Certificate) (*certmagic.Config, error) { return m.config, nil },
		Logger:           zl,
	})
	m.config = certmagic.New(m.cache, certmagic.Config{
		Storage: privateStorage{&certmagic.FileStorage{Path: dir}},
		OnDemand: &certmagic.OnDemandConfig{DecisionFunc: func(_ context.Context, name string) error {
			// Only a hostname with a route right now: never an order (nor a storage read) for
			// whatever name a client puts in its ClientHello.
			if !serves(Hostname(name)) {
				return errNotRouted
			}
			return nil
		}},
		Logger: zl,
	})
	issuer := certmagic.NewACMEIssuer(m.config, certmagic.ACMEIssuer{
		CA: o.CA, Email: o.Email, Agreed: true, TrustedRoots: roots,
		// TLS-ALPN-01 on the edge's own port: the challenge is answered in the edge's handshake.
		// HTTP-01 on the plain-HTTP listener, through HTTPChallenge. Naming those addresses makes
		// certmagic find them taken and never open a listener of its own.
		DisableTLSALPNChallenge: !tlsALPN, DisableHTTPChallenge: !http01, DisableDistributedSolvers: true,
		ListenHost: host, AltTLSALPNPort: port, AltHTTPPort: httpPort,
		Logger: zl,
	})
	m.issuer = issuer
	m.config.Issuers = []certmagic.Issuer{limitedIssuer{ACMEIssuer: issuer, limiter: m.limiter, orgs: m.orgs, ownerOf: ownerOf}}
	return m, nil
}

func (m *acmeManager) tlsConfig() *tls.Config { return m.config.TLSConfig() }

// httpChallenge answers the CA's HTTP-01 requests (/.well-known/acme-challenge/) in front of h.
func (m *acmeManager) httpChallenge(h http.Handler) http.Handler {
	return m.issuer.HTTPChallengeHandler(h)
}

func (m *acmeManager) close() {
	m.cache.Stop()
}

// limitedIssuer is the ACME issuer behind the order limits: a certificate already in storage is
// loaded without an order, so only new orders count. The organization's limit is asked first, so
// that an organization past its own spends nothing of the node's.
type limitedIssuer struct {
	*certmagic.ACMEIssuer
	limiter *hourLimits
	orgs    *hourLimits
	ownerOf func(string) string
}

func (i limitedIssuer) Issue(ctx context.Context, csr *x509.CertificateRequest) (*certmagic.IssuedCertificate, error) {
	for _, name := range csr.DNSNames {
		if org := i.ownerOf(Hostname(name)); org != "" && !i.orgs.allow(org) {
			return nil, certmagic.ErrNoRetry{Err: errOrgLimited}
		}
	}
	if !i.limiter.allow(nodeOrders) {
		return nil, certmagic.ErrNoRetry{Err: errOrdersLimited}
	}
	return i.ACMEIssuer.Issue(ctx, csr)
}

// privateStorage is certmagic's file storage with its lock files made 0600 like every other file
// of the state directory (certmagic writes its data files 0600 and directories 0700 itself).
type privateStorage struct{ *certmagic.FileStorage }

func (s privateStorage) Lock(ctx context.Context, name string) error {
	if err := s.FileStorage.Lock(ctx, name); err != nil {
		return err
	}
	_ = os.Chmod(filepath.Join(s.Path, "locks", certmagic.StorageKeys.Safe(name)+".lock"), safedir.FileMode)
	return nil
}

// slogCore hands certmagic's zap log entries to the node's slog handler.
type slogCore struct {
	h      slog.Handler
	fields []zapcore.Field
}

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

func (c slogCore) Enabled(l zapcore.Level) bool {
	return c.h.Enabled(context.Background(), slogLevel(l))
}

func (c slogCore) With(fields []zapcore.Field) zapcore.Core {
	return slogCore{h: c.h, fields: append(slices.Clip(c.fields), fields...)}
}

func (c slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	r := slog.NewRecord(e.Time, slogLevel(e.Level), e.Message, 0)
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	keys := make([]string, 0, len(enc.Fields))
	for k := range enc.Fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		r.AddAttrs(slog.Any(k, enc.Fields[k]))
	}
	return c.h.Handle(context.Background(), r)
}

func (slogCore) Sync() error { return nil }
