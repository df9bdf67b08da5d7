package edge

import (
	"bufio"
	"net/http"
	"net/netip"
	"strings"
)

// forwardingHeader reports the headers that say who the client is and how it connected: the
// edge writes them itself (forwarded), from the connection, or from a trusted proxy's.
func forwardingHeader(k string) bool {
	switch k {
	case "X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "X-Real-Ip", "Forwarded":
		return true
	}
	return false
}

// forwarded writes the forwarding headers the worker receives. A client's own are replaced by
// what the edge sees of its connection, so that no client can pass for another address or for
// HTTPS; a peer in Limits.TrustedProxies (a TLS terminator, a load balancer) is believed: its
// X-Forwarded-For and Forwarded are appended to, its X-Forwarded-Proto, X-Forwarded-Host kept,
// and X-Real-IP names the first address, from the right, that is not a trusted proxy.
func (h *Handler) forwarded(bw *bufio.Writer, r *http.Request) {
	peerText := remoteIP(r.RemoteAddr)
	peer, _ := netip.ParseAddr(peerText)
	// A worker's subrequest arrives from workerd's own loopback connection, which a
	// --trusted-proxy 127.0.0.1 would otherwise believe: one tenant's worker could then pass for
	// any client address or for HTTPS at another tenant's worker.
	fromWorker, _ := r.Context().Value(fromWorkerKey{}).(bool)
	trusted := !fromWorker && peer.IsValid() && h.trusted(peer)
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

func (h *Handler) trusted(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range h.limits.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// remoteIP is the address part of a RemoteAddr ("1.2.3.4:5", "[::1]:5").
func remoteIP(remote string) string {
	host := remote
	if i := strings.LastIndexByte(remote, ':'); i >= 0 {
		host = remote[:i]
	}
	return strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
}
