package main

import (
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
)

// edgeTLSFlags are the edge's HTTPS: certificate files or ACME, and the plain-HTTP redirect
// listener beside it (`takoserver runtime` and `takoserver dev`; without them the edge serves
// plain HTTP).
func edgeTLSFlags(fs *pflag.FlagSet, o *edge.TLSOptions) {
	fs.StringVar(&o.CertFile, "edge-tls-cert", "", "serve the edge over HTTPS with this certificate (PEM, a wildcard for the endpoint suffix); reloaded when it changes or on SIGHUP")
	fs.StringVar(&o.KeyFile, "edge-tls-key", "", "key (PEM) of --edge-tls-cert: a file of this node's user, readable by it alone (0600 or 0400)")
	fs.StringVar(&o.ACME.Email, "edge-acme-email", "", "serve the edge over HTTPS with certificates from an ACME CA, obtained on demand for routed hostnames only (TLS-ALPN-01: the CA must reach the edge on port 443); this is the account's contact, and using it agrees to the CA's terms")
	fs.StringVar(&o.ACME.CA, "edge-acme-ca", "", "ACME directory URL (default Let's Encrypt's production directory)")
	fs.StringVar(&o.ACME.CARoot, "edge-acme-ca-root", "", "CA certificate(s) (PEM) that issued a private ACME server's HTTPS certificate")
	fs.IntVar(&o.ACME.OrdersPerHour, "edge-acme-orders-per-hour", edge.DefaultACMEOrdersPerHour, "new certificate orders the edge may place in any hour; beyond it a new hostname's handshake fails until the hour has room")
	fs.IntVar(&o.ACME.OrdersPerOrganizationPerHour, "edge-acme-orders-per-organization", 0, "new certificate orders one organization's hostnames may place in any hour (default a fifth of --edge-acme-orders-per-hour, at least 1), so that one tenant's custom domains cannot spend the node's hour")
	fs.StringSliceVar(&o.ACME.Challenges, "edge-acme-challenges", nil, "the ACME challenge types the edge answers: tls-alpn-01 (on the edge's port; the CA must reach it on 443) and http-01 (on --edge-http-listen; the CA must reach it on 80); default both, http-01 where there is a plain-HTTP listener")
	fs.StringVar(&o.HTTPListen, "edge-http-listen", "", "with HTTPS on, also listen for plain HTTP here and redirect routed hostnames to https:// (other hosts get 404); without it no plain HTTP is served")
	fs.IntVar(&o.PublicHTTPSPort, "edge-https-port", 0, "the port clients reach the HTTPS edge on, named by the plain-HTTP redirect (behind a port mapping or load balancer); default 443, left out of the redirect's URL")
}

// printEdgeTLS says, on a node whose edge serves HTTPS, how it gets its certificates.
func printEdgeTLS(w io.Writer, info runtime.Info) {
	if info.EdgeScheme != "https" {
		return
	}
	fmt.Fprintf(w, "takoserver runtime: the edge serves HTTPS (HTTP/2 and HTTP/1.1)")
	if info.EdgeHTTPAddr != "" {
		fmt.Fprintf(w, "; plain HTTP on %s redirects to it", info.EdgeHTTPAddr)
	}
	fmt.Fprintln(w)
}
