package cfstandin

import (
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Cloudflare for SaaS custom hostnames of the account's SaaS zone (SaaSZoneID): created pending,
// they turn active, certificate included, after CustomHostnameReadsToActive reads (Cloudflare
// validates them once the user's DNS points at the zone's CNAME target; the stand-in has no DNS to
// look at). The edge serves an active one through the dispatch worker, as the zone's */* route does.

// CodeDuplicateCustomHostname is Cloudflare's "Duplicate custom hostname found."
const CodeDuplicateCustomHostname = 1406

// customHostname is one custom hostname of the zone.
type customHostname struct {
	id, hostname string
	created      time.Time
	reads        int
}

func (h *customHostname) active(after int) bool { return h.reads >= after }

// view is the custom hostname as the API answers it.
func (s *Server) view(h *customHostname) map[string]any {
	status, ssl := "pending", "pending_validation"
	if h.active(s.cfg.CustomHostnameReadsToActive) {
		status, ssl = "active", "active"
	}
	return map[string]any{"id": h.id, "hostname": h.hostname, "created_at": h.created.UTC().Format(time.RFC3339),
		"status": status, "ssl": map[string]any{"id": "ssl-" + h.id, "status": ssl, "method": "http", "type": "dv"}}
}

// zoneOf refuses a zone other than the account's SaaS zone, as Cloudflare refuses a zone the token
// cannot reach.
func (s *Server) zoneOf(r *http.Request) *failure {
	if s.cfg.SaaSZoneID == "" || r.PathValue("zone") != s.cfg.SaaSZoneID {
		return fail(http.StatusForbidden, CodeAuthentication, "Authentication error")
	}
	return nil
}

func (s *Server) createCustomHostname(w http.ResponseWriter, r *http.Request) *failure {
	if f := s.zoneOf(r); f != nil {
		return f
	}
	var body struct {
		Hostname string `json:"hostname"`
		SSL      struct {
			Method string `json:"method"`
			Type   string `json:"type"`
		} `json:"ssl"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&body); err != nil {
		return validation("the request body is not a custom hostname")
	}
	host := strings.ToLower(body.Hostname)
	switch {
	case host == "" || strings.HasSuffix(host, ".") || !strings.Contains(host, "."):
		return validation("hostname is not a valid hostname")
	case body.SSL.Method != "http" && body.SSL.Method != "txt" && body.SSL.Method != "email":
		return validation("ssl.method must be http, txt or email")
	case body.SSL.Type != "dv":
		return validation("ssl.type must be dv")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range s.customHostnames {
		if h.hostname == host {
			return fail(http.StatusConflict, CodeDuplicateCustomHostname, "Duplicate custom hostname found.")
		}
	}
	h := &customHostname{id: strings.ReplaceAll(uuid.NewString(), "-", ""), hostname: host, created: s.now()}
	s.customHostnames[h.id] = h
	writeResult(w, s.view(h))
	return nil
}

func (s *Server) listCustomHostnames(w http.ResponseWriter, r *http.Request) *failure {
	if f := s.zoneOf(r); f != nil {
		return f
	}
	contain := r.URL.Query().Get("hostname.contain")
	if contain == "" {
		contain = r.URL.Query().Get("hostname")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var items []any
	var ids []string
	for id, h := range s.customHostnames {
		if strings.Contains(h.hostname, strings.ToLower(contain)) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	for _, id := range ids {
		h := s.customHostnames[id]
		h.reads++
		items = append(items, s.view(h))
	}
	writeList(w, items)
	return nil
}

func (s *Server) getCustomHostname(w http.ResponseWriter, r *http.Request) *failure {
	if f := s.zoneOf(r); f != nil {
		return f
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.customHostnames[r.PathValue("id")]
	if !ok {
		return notFound("The custom hostname was not found.")
	}
	h.reads++
	writeResult(w, s.view(h))
	return nil
}

func (s *Server) deleteCustomHostname(w http.ResponseWriter, r *http.Request) *failure {
	if f := s.zoneOf(r); f != nil {
		return f
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	id := r.PathValue("id")
	if _, ok := s.customHostnames[id]; !ok {
		return notFound("The custom hostname was not found.")
	}
	delete(s.customHostnames, id)
	writeResult(w, map[string]any{"id": id})
	return nil
}

// CustomHostnames lists the zone's custom hostnames and whether each is active (for tests).
func (s *Server) CustomHostnames() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]bool{}
	for _, h := range s.customHostnames {
		out[h.hostname] = h.active(s.cfg.CustomHostnameReadsToActive)
	}
	return out
}

// servesCustomHostname reports whether the edge serves host as an active custom hostname.
func (s *Server) servesCustomHostname(host string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range s.customHostnames {
		if h.hostname == host {
			return h.active(s.cfg.CustomHostnameReadsToActive)
		}
	}
	return false
}
