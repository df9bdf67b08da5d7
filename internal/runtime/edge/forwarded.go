package edge

import (
	"bufio"
	"net/http"
	"net/netip"
	"strings"
)

// forwardingNames are the headers that say who the client is and how it connected: the edge
// writes them itself (forwarded), from the connection, or from a trusted proxy's. CF-Connecting-IP
// and True-Client-IP are Cloudflare's (and Akamai's) names for the client's address, which
// workers written for Cloudflare read.
var forwardingNames = [...]string{"X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "X-Real-Ip", "Forwarded",
	"Cf-Connecting-Ip", "True-Client-Ip"}

// forwardingHeader reports whether a client's header k is one of forwardingNames, which the edge
// drops: by its canonical name, or spelt with underscores for dashes, which CGI-style servers
// behind a worker (PHP's HTTP_X_FORWARDED_FOR, nginx with underscores_in_headers) cannot tell from
// the real one.
func forwardingHeader(k string) bool {
	switch k {
	case "X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "X-Real-Ip", "Forwarded",
		"Cf-Connecting-Ip", "True-Client-Ip":
		return true
	}
	if strings.IndexByte(k, '_') < 0 {
		return false
	}
	for _, name := range forwardingNames {
		if sameNameButUnderscores(k, name) {
			return true
		}
	}
	return false
}

// sameNameButUnderscores reports whether k is name, case aside, with any of its dashes written as
// underscores.
func sameNameButUnderscores(k, name string) bool {
	if len(k) != len(name) {
		return false
	}
	for i := 0; i < len(k); i++ {
		a, b := k[i], name[i]
		if a == '_' && b == '-' {
			continue
		}
		if 'A' <= a && a <= 'Z' {
			a += 'a' - 'A'
		}
		if 'A' <= b && b <= 'Z' {
			b += 'a' - 'A'
		}
		if a != b {
			return false
		}
	}
	return true
}

// unknownClient is what the edge writes for a client address it does not have. A worker's own
// subrequest that comes back into the edge (ServeEgress, ServeBinding) has no client address
// worth telling: its connection is this node's loopback (or, under the org process model, a Unix
// socket), and a worker that trusts 127.0.0.1 as "local" would then trust another tenant's worker.
// RFC 7239 names such a node "unknown" in Forwarded; the edge writes the same in X-Forwarded-For,
// X-Real-Ip, CF-Connecting-IP and True-Client-IP rather than leave them out, since a worker that
// finds one missing may fall back to a default of its own (often the loopback), while "unknown"
// parses as no address at all, and is what Squid writes there.
const unknownClient = "unknown"

// forwarded writes the forwarding headers the worker receives. A client's own are replaced by
// what the edge sees of its connection, so that no client can pass for another address or for
// HTTPS; a peer in Limits.TrustedProxies (a TLS terminator, a load balancer) is believed: its
// X-Forwarded-For and Forwarded are appended to, its X-Forwarded-Proto, X-Forwarded-Host kept,
// and X-Real-IP, CF-Connecting-IP and True-Client-IP name the first address, from the right,
// that is not a trusted proxy. A request from a worker of this node, or from a peer that has no
// IP address, is from an unknownClient.
func (h *Handler) forwarded(bw *bufio.Writer, r *http.Request) {
	// A worker's subrequest arrives from workerd's own loopback connection, which a
	// --trusted-proxy 127.0.0.1 would otherwise believe: one tenant's worker could then pass for
	// any client address or for HTTPS at another tenant's worker.
	fromWorker, _ := r.Context().Value(fromWorkerKey{}).(bool)
	peerText := unknownClient
	var peer netip.Addr
	if !fromWorker {
		if a, err := netip.ParseAddr(remoteIP(r.RemoteAddr)); err == nil {
			peer, peerText = a, remoteIP(r.RemoteAddr)
		}
	}
	trusted := peer.IsValid() && h.trusted(peer)
	proto := "http"
	if r.TLS != nil {
		proto = "https"
	}

	xff := r.Header["X-Forwarded-For"]
	bw.WriteString("X-Forwarded-For: ")
	if trusted && len(xff) > 0 {
		for _, v := range xff {
			bw.WriteString(v)
			bw.WriteString(", ")
		}
	}
	bw.WriteString(peerText)
	bw.WriteString("\r\n")

	if v := r.Header.Get("X-Forwarded-Proto"); trusted && v != "" {
		writeField(bw, "X-Forwarded-Proto", v)
	} else {
		writeField(bw, "X-Forwarded-Proto", proto)
	}
	if v := r.Header.Get("X-Forwarded-Host"); trusted && v != "" {
		writeField(bw, "X-Forwarded-Host", v)
	} else {
		writeField(bw, "X-Forwarded-Host", r.Host)
	}

	client := peerText
	if trusted {
		if len(xff) > 0 {
			client = h.clientFrom(xff, client)
		} else if v := strings.TrimSpace(r.Header.Get("X-Real-Ip")); v != "" {
			if a, err := netip.ParseAddr(v); err == nil {
				client = a.String()
			}
		}
	}
	writeField(bw, "X-Real-Ip", client)
	writeField(bw, "CF-Connecting-IP", client)
	writeField(bw, "True-Client-IP", client)

	bw.WriteString("Forwarded: ")
	if prior := r.Header["Forwarded"]; trusted && len(prior) > 0 {
		for _, v := range prior {
			bw.WriteString(v)
			bw.WriteString(", ")
		}
	}
	bw.WriteString("for=")
	if peer.Is6() && !peer.Is4In6() {
		bw.WriteString(`"[`)
		bw.WriteString(peerText)
		bw.WriteString(`]"`)
	} else {
		bw.WriteString(peerText)
	}
	bw.WriteString(";proto=")
	bw.WriteString(proto)
	bw.WriteString("\r\n")
}

// clientFrom walks a trusted X-Forwarded-For from the right past trusted proxies: the first
// other address is the client's. Anything unreadable stops the walk there (what is left of it
// was written by whoever the last trusted proxy believed).
func (h *Handler) clientFrom(xff []string, fallback string) string {
	client := fallback
	for i := len(xff) - 1; i >= 0; i-- {
		v := xff[i]
		for v != "" {
			var hop string
			if j := strings.LastIndexByte(v, ','); j >= 0 {
				hop, v = v[j+1:], v[:j]
			} else {
				hop, v = v, ""
			}
			a, err := netip.ParseAddr(strings.TrimSpace(hop))
			if err != nil {
				return client
			}
			client = a.String()
			if !h.trusted(a) {
				return client
			}
		}
	}
	return client
}

func (h *Handler) trusted(a netip.Addr) bool { return inPrefixes(h.limits.TrustedProxies, a) }

// inPrefixes reports whether a is in one of ps.
func inPrefixes(ps []netip.Prefix, a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// remoteIP is the address part of a RemoteAddr ("1.2.3.4:5", "[::1]:5"); what it makes of
// anything else ("", a Unix socket's "@") is no IP address.
func remoteIP(remote string) string {
	host := remote
	if i := strings.LastIndexByte(remote, ':'); i >= 0 {
		host = remote[:i]
	}
	return strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
}
