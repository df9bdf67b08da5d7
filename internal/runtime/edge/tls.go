package edge

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/takoform/terraform-provider-takoform/internal/safedir"
)

// TLSOptions turn HTTPS on at the edge: either a certificate from PEM files (CertFile and KeyFile,
// typically a wildcard for the endpoint suffix) or certificates from an ACME CA (ACME.Email set),
// never both. The zero value keeps the edge on plain HTTP.
type TLSOptions struct {
	// CertFile and KeyFile are the PEM certificate (chain) and its private key. The key file must
	// be the node's own, readable by it alone (SPEC 6.3). Both are read again when they change
	// (checked every ReloadEvery) and on SIGHUP, so a renewal needs no restart.
	CertFile string
	KeyFile  string
	// ReloadEvery is how often the files are checked for a change (default 10s).
	ReloadEvery time.Duration
	// ACME obtains certificates on demand, only for hostnames the edge routes.
	ACME ACMEOptions
	// HTTPListen, with TLS on, is an extra plain-HTTP listener that redirects requests for routed
	// hostnames to https:// and answers any other host 404 (HTTPListener, when set, is used
	// instead; tests pass a port-0 one). Without it a TLS edge serves no plain HTTP at all.
	HTTPListen   string
	HTTPListener net.Listener
	// PublicHTTPSPort is the port clients reach the HTTPS edge on, which the redirect names: the
	// edge's own listen port is wrong behind a port mapping or a load balancer. Zero means 443
	// (left out of the redirect's URL).
	PublicHTTPSPort int
}

// Enabled reports whether the options ask for HTTPS.
func (o TLSOptions) Enabled() bool { return o.CertFile != "" || o.KeyFile != "" || o.ACME.Email != "" }

// Validate refuses options that contradict each other, naming the flags.
func (o TLSOptions) Validate() error {
	if (o.CertFile == "") != (o.KeyFile == "") {
		return errors.New("--edge-tls-cert and --edge-tls-key go together")
	}
	if o.CertFile != "" && o.ACME.Email != "" {
		return errors.New("the edge takes its certificate from --edge-tls-cert/--edge-tls-key or from ACME (--edge-acme-email), not both")
	}
	if o.ACME.Email == "" && (o.ACME.CA != "" || o.ACME.CARoot != "") {
		return errors.New("--edge-acme-ca and --edge-acme-ca-root need --edge-acme-email, which turns ACME on")
	}
	for _, c := range o.ACME.Challenges {
		if c != ChallengeTLSALPN && c != ChallengeHTTP {
			return fmt.Errorf("--edge-acme-challenges: %q is not %s or %s", c, ChallengeTLSALPN, ChallengeHTTP)
		}
	}
	if tlsALPN, http01 := o.ACME.challenges(); len(o.ACME.Challenges) > 0 && !tlsALPN && http01 && o.HTTPListen == "" && o.HTTPListener == nil {
		return errors.New("--edge-acme-challenges http-01 needs --edge-http-listen: the CA asks for the challenge over plain HTTP")
	}
	if o.ACME.OrdersPerHour < 0 || o.ACME.OrdersPerOrganizationPerHour < 0 {
		return errors.New("--edge-acme-orders-per-hour and --edge-acme-orders-per-organization must not be negative")
	}
	if o.PublicHTTPSPort < 0 || o.PublicHTTPSPort > 65535 {
		return fmt.Errorf("--edge-https-port %d is not a TCP port", o.PublicHTTPSPort)
	}
	if !o.Enabled() && o.PublicHTTPSPort != 0 {
		return errors.New("--edge-https-port is the public port of an HTTPS edge: it needs --edge-tls-cert/--edge-tls-key or --edge-acme-email")
	}
	if !o.Enabled() && (o.HTTPListen != "" || o.HTTPListener != nil) {
		return errors.New("--edge-http-listen is the plain-HTTP companion of an HTTPS edge: it needs --edge-tls-cert/--edge-tls-key or --edge-acme-email (without them the edge itself serves plain HTTP)")
	}
	return nil
}

// TLS is the edge's HTTPS: the tls.Config its server hands every connection, and whatever keeps
// the certificates current (the file watcher or the ACME manager).
type TLS struct {
	config *tls.Config
	files  *certFiles
	acme   *acmeManager
	stop   chan struct{}
	done   sync.WaitGroup
	once   sync.Once
}

// NewTLS sets HTTPS up for the edge h listening at edgeAddr. ACME state (account key,
// certificates) goes to the private directory acme/ under stateDir (SPEC 6.3). It returns nil
// when opts ask for no TLS.
func NewTLS(opts TLSOptions, h *Handler, edgeAddr net.Addr, stateDir string, owner safedir.Owner, log *slog.Logger) (*TLS, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if !opts.Enabled() {
		return nil, nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &TLS{stop: make(chan struct{})}
	if opts.CertFile != "" {
		files, err := loadCertFiles(opts.CertFile, opts.KeyFile, owner, log)
		if err != nil {
			return nil, err
		}
		t.files = files
		t.config = &tls.Config{GetCertificate: files.getCertificate}
		every := opts.ReloadEvery
		if every <= 0 {
			every = 10 * time.Second
		}
		t.done.Add(1)
		go func() { defer t.done.Done(); files.watch(every, t.stop) }()
	} else {
		var httpAddr net.Addr
		if opts.HTTPListener != nil {
			httpAddr = opts.HTTPListener.Addr()
		}
		m, err := newACME(opts.ACME, h.Serves, h.OwnerOf, edgeAddr, httpAddr, stateDir, owner, log)
		if err != nil {
			return nil, err
		}
		t.acme = m
		t.config = m.tlsConfig()
	}
	t.config.MinVersion = tls.VersionTLS12
	// HTTP/2 first: the server picks the first protocol of its own list the client offers.
	t.config.NextProtos = append([]string{"h2", "http/1.1"}, t.config.NextProtos...)
	return t, nil
}

// Collector exports the expiry of a certificate read from files, for the alert that a renewal
// did not happen (ACME renews its own certificates): nil with ACME.
func (t *TLS) Collector() prometheus.Collector {
	if t.files == nil {
		return nil
	}
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "takoform_runtime_edge_certificate_expiry_timestamp_seconds",
		Help: "When the edge's certificate (--edge-tls-cert) stops being valid, in Unix seconds.",
	}, func() float64 {
		if c := t.files.current.Load(); c != nil && c.Leaf != nil {
			return float64(c.Leaf.NotAfter.Unix())
		}
		return 0
	})
}

// Config is the tls.Config of the edge's server (HTTP/2 and HTTP/1.1 by ALPN).
func (t *TLS) Config() *tls.Config { return t.config.Clone() }

// HTTPChallenge puts the ACME HTTP-01 answers in front of h, the plain-HTTP listener's handler
// (h itself without ACME).
func (t *TLS) HTTPChallenge(h http.Handler) http.Handler {
	if t.acme == nil {
		return h
	}
	return t.acme.httpChallenge(h)
}

// Reload reads the certificate files again now (what SIGHUP does); with ACME it does nothing.
func (t *TLS) Reload() error {
	if t.files == nil {
		return nil
	}
	return t.files.reload(true)
}

// Close stops the file watcher or the ACME manager.
func (t *TLS) Close() {
	t.once.Do(func() {
		close(t.stop)
		t.done.Wait()
		if t.acme != nil {
			t.acme.close()
		}
	})
}

// Redirect is the handler of the plain-HTTP listener beside an HTTPS edge: a request for a
// hostname the edge routes is redirected (308, method and body kept) to the same path over
// https:// on publicPort, the port clients reach the HTTPS edge on (0 or 443: the scheme's
// default, left out of the URL); any other host gets the edge's 404 problem, so the listener
// never redirects to a name this node does not serve, and CONNECT is refused as the edge refuses
// it. Nothing reaches a worker over plain HTTP.
func Redirect(h *Handler, publicPort int) http.Handler {
	port := ""
	if publicPort != 0 && publicPort != 443 {
		port = strconv.Itoa(publicPort)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodConnect {
			refuseConnect(w, nil)
			return
		}
		if r.URL.Path == HealthPath && (r.Method == http.MethodGet || r.Method == http.MethodHead) && healthHost(r.Host) {
			// A load balancer may check the plain-HTTP port (an IP address has no certificate).
			h.health(w)
			return
		}
		host := Hostname(r.Host)
		if host == "" || !h.Serves(host) {
			writeProblem(w, problemUnknownHost)
			return
		}
		if port != "" {
			host = net.JoinHostPort(host, port)
		} else if strings.IndexByte(host, ':') >= 0 {
			host = "[" + host + "]" // an IPv6 literal
		}
		http.Redirect(w, r, "https://"+host+r.URL.RequestURI(), http.StatusPermanentRedirect)
	})
}

// certFiles serves one certificate read from PEM files, swapped atomically when they change.
type certFiles struct {
	certFile, keyFile string
	owner             safedir.Owner
	log               *slog.Logger
	current           atomic.Pointer[tls.Certificate]
	// stamp identifies the file versions last tried (loaded or refused), so a bad pair is logged
	// once, not at every check.
	mu    sync.Mutex
	stamp string
}

func loadCertFiles(certFile, keyFile string, owner safedir.Owner, log *slog.Logger) (*certFiles, error) {
	f := &certFiles{certFile: certFile, keyFile: keyFile, owner: owner, log: log}
	if err := f.reload(true); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *certFiles) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return f.current.Load(), nil
}

// watch reloads the pair when either file changes (a renewal replaces them, often through a
// symlink swap) and on SIGHUP, until stop closes.
func (f *certFiles) watch(every time.Duration, stop <-chan struct{}) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			_ = f.reload(false)
		case <-hup:
			_ = f.reload(true)
		}
	}
}

// reload reads the pair when it changed since the last try (or always, when forced). A pair that
// cannot be used leaves the current certificate in place.
func (f *certFiles) reload(force bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	stamp := fileStamp(f.certFile) + "|" + fileStamp(f.keyFile)
	if !force && stamp == f.stamp {
		return nil
	}
	f.stamp = stamp
	cert, err := readKeyPair(f.certFile, f.keyFile, f.owner)
	if err != nil {
		if f.current.Load() != nil {
			f.log.Error("edge TLS: kept the current certificate; the new files cannot be used", "error", err)
		}
		return err
	}
	old := f.current.Swap(cert)
	if old != nil {
		f.log.Info("edge TLS: certificate reloaded", "cert", f.certFile, "subject", cert.Leaf.Subject.String(), "notAfter", cert.Leaf.NotAfter)
	}
	return nil
}

// fileStamp identifies one version of a file (symlinks followed): device, inode, size, times.
func fileStamp(path string) string {
	info, err := os.Stat(path)
	if err != nil {
		return "missing"
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Sprint(info.Size(), info.ModTime().UnixNano())
	}
	return fmt.Sprint(st.Dev, st.Ino, st.Size, st.Mtim.Nano(), st.Ctim.Nano(), st.Mode)
}

// readKeyPair reads a certificate and its key. The key file (symlinks followed, as certbot's
// live/ directory and mounted secrets use them) must be a regular file of the node's user that no
// one else may read or write (SPEC 6.3); it is checked on the open file, so a swap between check
// and read cannot slip another file in. Errors name paths, never contents.
func readKeyPair(certFile, keyFile string, owner safedir.Owner) (*tls.Certificate, error) {
	kf, err := os.Open(keyFile)
	if err != nil {
		return nil, fmt.Errorf("edge TLS key: %w", err)
	}
	defer kf.Close()
	info, err := kf.Stat()
	if err != nil {
		return nil, fmt.Errorf("edge TLS key: %w", err)
	}
	if !info.Mode().IsRegular() {
		return nil, &safedir.UnsafePathError{Path: keyFile, Reason: "it is not a regular file"}
	}
	if st, ok := info.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != owner.UID {
		return nil, &safedir.UnsafePathError{Path: keyFile, Reason: "it is not owned by the runtime's user"}
	}
	if info.Mode().Perm()&0o077 != 0 {
		return nil, &safedir.UnsafePathError{Path: keyFile, Reason: fmt.Sprintf("its mode is %#o; a private key must be readable by its owner only (0600 or 0400)", info.Mode().Perm())}
	}
	keyPEM, err := io.ReadAll(io.LimitReader(kf, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("edge TLS key: %w", err)
	}
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("edge TLS certificate: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("edge TLS: %s and %s are not a certificate and its key: %w", certFile, keyFile, err)
	}
	return &cert, nil
}
