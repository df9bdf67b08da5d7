// Package dnstest is a small authoritative DNS server on the loopback for tests and demos of
// custom domains (SPEC 3.7): it answers the TXT records it is given, NXDOMAIN for names it does not
// know, the failure it is told to give for a name, and A records for names it routes. It is a real
// server speaking DNS over UDP and TCP (github.com/miekg/dns), so the Host's resolver code runs as
// in production.
package dnstest

import (
	"net"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Server is one running DNS server.
type Server struct {
	// Addr is host:port, for serve --dns-resolver.
	Addr string

	udp, tcp *dns.Server
	mu       sync.Mutex
	txt      map[string][]string
	a        map[string]net.IP
	fail     map[string]int
	queries  map[string]int
	delay    time.Duration
}

// Start serves on a free loopback port (UDP and TCP on the same port) until Close.
func Start() (*Server, error) {
	pc, l, err := listen()
	if err != nil {
		return nil, err
	}
	s := &Server{Addr: pc.LocalAddr().String(), txt: map[string][]string{}, a: map[string]net.IP{}, fail: map[string]int{}, queries: map[string]int{}}
	h := dns.HandlerFunc(s.answer)
	s.udp, s.tcp = &dns.Server{PacketConn: pc, Handler: h}, &dns.Server{Listener: l, Handler: h}
	up := make(chan struct{}, 2)
	s.udp.NotifyStartedFunc = func() { up <- struct{}{} }
	s.tcp.NotifyStartedFunc = func() { up <- struct{}{} }
	go func() { _ = s.udp.ActivateAndServe() }()
	go func() { _ = s.tcp.ActivateAndServe() }()
	<-up
	<-up
	return s, nil
}

// listen takes a free UDP port and the same TCP port, trying other ports while the TCP one is
// taken (the UDP port's number may be in use over TCP).
func listen() (net.PacketConn, net.Listener, error) {
	var err error
	for range 20 {
		var pc net.PacketConn
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			return nil, nil, err
		}
		var l net.Listener
		if l, err = net.Listen("tcp", pc.LocalAddr().String()); err == nil {
			return pc, l, nil
		}
		pc.Close()
	}
	return nil, nil, err
}

// Close stops the server.
func (s *Server) Close() {
	_ = s.udp.Shutdown()
	_ = s.tcp.Shutdown()
}

func key(name string) string { return strings.ToLower(dns.Fqdn(name)) }

// SetTXT publishes the TXT records of name (replacing any); none removes them.
func (s *Server) SetTXT(name string, values ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(values) == 0 {
		delete(s.txt, key(name))
		return
	}
	s.txt[key(name)] = values
}

// SetA answers name's A queries with ip.
func (s *Server) SetA(name string, ip net.IP) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.a[key(name)] = ip
}

// Fail answers every query for name with rcode (dns.RcodeServerFailure, dns.RcodeRefused); 0
// answers normally again.
func (s *Server) Fail(name string, rcode int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rcode == 0 {
		delete(s.fail, key(name))
		return
	}
	s.fail[key(name)] = rcode
}

// Delay holds every answer for d (a slow resolver).
func (s *Server) Delay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delay = d
}

// Queries is how many queries for name the server answered.
func (s *Server) Queries(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queries[key(name)]
}

func (s *Server) answer(w dns.ResponseWriter, q *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(q)
	m.Authoritative = true
	s.mu.Lock()
	for _, question := range q.Question {
		name := strings.ToLower(question.Name)
		s.queries[name]++
		if rcode, ok := s.fail[name]; ok {
			m.Rcode = rcode
			continue
		}
		txt, hasTXT := s.txt[name]
		ip, hasA := s.a[name]
		switch {
		case question.Qtype == dns.TypeTXT && hasTXT:
			for _, v := range txt {
				m.Answer = append(m.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: question.Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 1}, Txt: split(v)})
			}
		case question.Qtype == dns.TypeA && hasA:
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: question.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 1}, A: ip})
		case !hasTXT && !hasA:
			m.Rcode = dns.RcodeNameError
		}
	}
	delay := s.delay
	s.mu.Unlock()
	time.Sleep(delay)
	_ = w.WriteMsg(m)
}

// split cuts a TXT value into the 255-octet strings one record carries.
func split(v string) []string {
	var out []string
	for len(v) > 255 {
		out, v = append(out, v[:255]), v[255:]
	}
	return append(out, v)
}
