// Command demodomain is what `make demo-domain` stands in for the world with: a DNS server on the
// loopback that the Host's resolver asks (serve --dns-resolver), where the demo publishes a custom
// domain's TXT record as a user publishes it at their DNS host, and a private CA that issued the
// edge's certificate for the demo's names, which the demo's client trusts.
//
//	demodomain -dir DIR -hosts app.example.com,*.workers.localhost
//
// It writes DIR/ca.pem, DIR/edge.pem and DIR/edge-key.pem (DIR 0700, files 0600), prints
// "dns=ADDR control=URL" once it serves, and serves until interrupted. PUT URL/txt/NAME with the
// value as the body publishes a TXT record; DELETE removes it.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/customdomain/dnstest"
)

func main() {
	dir := flag.String("dir", "", "private directory for the CA and the edge's certificate")
	hosts := flag.String("hosts", "", "comma-separated names the edge's certificate covers")
	flag.Parse()
	if *dir == "" || *hosts == "" {
		log.Fatal("demodomain: -dir and -hosts are required")
	}
	if err := writePKI(*dir, strings.Split(*hosts, ",")); err != nil {
		log.Fatalf("demodomain: %v", err)
	}
	dns, err := dnstest.Start()
	if err != nil {
		log.Fatalf("demodomain: dns: %v", err)
	}
	defer dns.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatalf("demodomain: control: %v", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /txt/{name}", func(w http.ResponseWriter, r *http.Request) {
		value, _ := io.ReadAll(io.LimitReader(r.Body, 4096))
		dns.SetTXT(r.PathValue("name"), string(value))
		log.Printf("published TXT %s %q", r.PathValue("name"), value)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("DELETE /txt/{name}", func(w http.ResponseWriter, r *http.Request) {
		dns.SetTXT(r.PathValue("name"))
		log.Printf("removed TXT %s", r.PathValue("name"))
		w.WriteHeader(http.StatusNoContent)
	})
	go func() { _ = http.Serve(l, mux) }()
	fmt.Printf("dns=%s control=http://%s\n", dns.Addr, l.Addr())
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
}

// writePKI makes a CA and a certificate for hosts it issued, as PEM files in dir.
func writePKI(dir string, hosts []string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTemplate := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "takoform demo-domain CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	leaf := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: hosts[0]}, DNSNames: hosts,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	for name, block := range map[string]*pem.Block{
		"ca.pem": {Type: "CERTIFICATE", Bytes: caDER}, "edge.pem": {Type: "CERTIFICATE", Bytes: leafDER},
		"edge-key.pem": {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			return err
		}
	}
	return nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic(err)
	}
	return n
}
