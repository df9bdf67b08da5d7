package cfstandin

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"sync"
	"time"
)

// edgeCA is the stand-in's own certificate authority: the edge mints a certificate for each
// hostname a client asks for (SNI), so https://<script>.<sub>.workers.dev/ verifies against it.
type edgeCA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

func newEdgeCA() (*edgeCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "Takoform Cloudflare stand-in edge CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &edgeCA{
		cert: cert, key: key, leaves: map[string]*tls.Certificate{},
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
	}, nil
}

func randomSerial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

func (ca *edgeCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

func (ca *edgeCA) serverConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: ca.leaf}
}

// leaf returns (minting once) the certificate for the hostname the client asked for.
func (ca *edgeCA) leaf(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	name := hello.ServerName
	if name == "" {
		return nil, errors.New("the stand-in's edge needs SNI to choose a certificate")
	}
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[name]; ok {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key}
	ca.leaves[name] = c
	return c, nil
}

// sniffListener serves plain HTTP and TLS on one port: a connection whose first byte is a TLS
// handshake record (0x16) is wrapped in TLS. Sniffing happens off the accept loop, so a client
// that sends nothing holds up no one else.
type sniffListener struct {
	net.Listener
	config *tls.Config
	conns  chan net.Conn
	errs   chan error
}

func newSniffListener(ln net.Listener, config *tls.Config) *sniffListener {
	s := &sniffListener{Listener: ln, config: config, conns: make(chan net.Conn), errs: make(chan error, 1)}
	go s.acceptLoop()
	return s
}

func (s *sniffListener) acceptLoop() {
	for {
		conn, err := s.Listener.Accept()
		if err != nil {
			s.errs <- err
			return
		}
		go func() {
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(conn)
			first, err := br.Peek(1)
			_ = conn.SetReadDeadline(time.Time{})
			if err != nil {
				_ = conn.Close()
				return
			}
			var c net.Conn = &peekedConn{Conn: conn, r: br}
			if first[0] == 0x16 {
				c = tls.Server(c, s.config)
			}
			select {
			case s.conns <- c:
			case err := <-s.errs:
				s.errs <- err
				_ = c.Close()
			}
		}()
	}
}

func (s *sniffListener) Accept() (net.Conn, error) {
	select {
	case c := <-s.conns:
		return c, nil
	case err := <-s.errs:
		s.errs <- err
		return nil, err
	}
}

type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
