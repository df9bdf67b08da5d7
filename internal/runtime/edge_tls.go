package runtime

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
)

// openEdgeTLS sets HTTPS up on the edge when the config asks for it (--edge-tls-* or
// --edge-acme-*), and opens the plain-HTTP redirect listener (--edge-http-listen) beside it.
func (n *Node) openEdgeTLS(handler *edge.Handler, edgeL net.Listener) error {
	opts := n.cfg.EdgeTLS
	if err := opts.Validate(); err != nil {
		return err
	}
	// The plain-HTTP listener first: ACME answers HTTP-01 on it, and is told its address.
	httpL := opts.HTTPListener
	if httpL == nil && opts.HTTPListen != "" && opts.Enabled() {
		var err error
		if httpL, err = n.listen(opts.HTTPListen, "edge (plain HTTP)"); err != nil {
			return fmt.Errorf("edge: plain-HTTP listen on %s: %w", opts.HTTPListen, err)
		}
		opts.HTTPListener = httpL
	}
	t, err := edge.NewTLS(opts, handler, edgeL.Addr(), n.store.Dir(), n.store.Owner(), n.log)
	if err != nil || t == nil {
		if httpL != nil && n.cfg.EdgeTLS.HTTPListener == nil {
			_ = httpL.Close()
		}
		return err
	}
	n.edgeTLS, n.edgeHTTPL = t, httpL
	if c := t.Collector(); c != nil {
		n.reg.MustRegister(c)
	}
	if httpL != nil {
		// The redirect names the port clients reach the HTTPS edge on, not the one it listens on
		// (a port mapping or a load balancer may stand between).
		n.edgeHTTP = &http.Server{Handler: t.HTTPChallenge(edge.Redirect(handler, opts.PublicHTTPSPort)), ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout: 30 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 64 << 10,
			ErrorLog: slog.NewLogLogger(n.log.Handler(), slog.LevelWarn)}
	}
	return nil
}

// serveEdge serves the edge on edgeL: over TLS (HTTP/2 and HTTP/1.1) when HTTPS is on, with the
// redirect listener beside it; else plain HTTP. Either way, HTTP/1.x connections are served by
// the edge's own loop (edge.Server), HTTP/2 ones by net/http's.
func (n *Node) serveEdge(edgeL net.Listener) error {
	if n.edgeTLS == nil {
		// Plain HTTP/1.x: the edge's own loop and parser, which refuse a request with both
		// Content-Length and Transfer-Encoding and close its connection.
		return n.edge.Serve(edgeL)
	}
	if n.edgeHTTP != nil {
		go func() {
			n.served <- serveErr("edge plain-HTTP redirect", n.edgeHTTP.Serve(n.edge.LimitListener(n.edgeHTTPL)))
		}()
	}
	// The edge completes each handshake itself so that it serves HTTP/1.1 connections with its own
	// loop (as on plain HTTP); HTTP/2 connections go to net/http's server, which gets a copy of
	// the configuration (it adjusts its own) and starts with Serve: a configuration it refuses
	// ends Serve with its error.
	config := n.edgeTLS.Config()
	n.edge.SetTLSConfig(config.Clone())
	return n.edge.Serve(edge.TLSListener(edgeL, config, n.cfg.Edge.WithDefaults().HeaderTimeout))
}

// edgeScheme is the scheme the edge serves.
func (n *Node) edgeScheme() string {
	if n.edgeTLS != nil {
		return "https"
	}
	return "http"
}

// edgeHTTPAddr is the plain-HTTP redirect listener's address, or "".
func (n *Node) edgeHTTPAddr() string {
	if n.edgeHTTPL == nil {
		return ""
	}
	return n.edgeHTTPL.Addr().String()
}

// closeEdgeTLS stops the redirect listener and whatever keeps the certificates current.
func (n *Node) closeEdgeTLS(ctx context.Context) error {
	if n.edgeTLS == nil {
		return nil
	}
	var err error
	if n.edgeHTTP != nil {
		err = n.edgeHTTP.Shutdown(ctx)
	}
	if n.edgeHTTPL != nil {
		_ = n.edgeHTTPL.Close() // already closed by Shutdown when it served
	}
	n.edgeTLS.Close()
	return err
}

// ReloadEdgeCertificate reads the edge's certificate files again now (what SIGHUP does).
func (n *Node) ReloadEdgeCertificate() error {
	if n.edgeTLS == nil {
		return nil
	}
	return n.edgeTLS.Reload()
}
