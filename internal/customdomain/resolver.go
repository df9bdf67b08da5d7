package customdomain

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// Outcome is what one lookup of a claim's TXT record found.
type Outcome int

const (
	// Present: the record holds the claim's value.
	Present Outcome = iota
	// Absent: the name does not exist (NXDOMAIN), or has no TXT record with the value. It counts
	// toward a revocation.
	Absent
	// Unknown: the resolver failed (a timeout, SERVFAIL, a refusal). It counts for nothing.
	Unknown
)

func (o Outcome) String() string {
	switch o {
	case Present:
		return "present"
	case Absent:
		return "absent"
	}
	return "unknown"
}

// Resolver looks TXT records up through one recursive DNS server (serve --dns-resolver), or the
// first nameserver of /etc/resolv.conf when Server is empty.
type Resolver struct {
	// Server is host:port (port 53 when omitted).
	Server string
	// Timeout bounds one lookup (3 s when zero).
	Timeout time.Duration
}

// timeout is how long one lookup may take.
func (r *Resolver) timeout() time.Duration {
	if r.Timeout <= 0 {
		return 3 * time.Second
	}
	return r.Timeout
}

// server is the resolver's address.
func (r *Resolver) server() (string, error) {
	s := r.Server
	if s == "" {
		conf, err := dns.ClientConfigFromFile("/etc/resolv.conf")
		if err != nil || len(conf.Servers) == 0 {
			return "", errors.New("no DNS resolver: give serve --dns-resolver host:port (none in /etc/resolv.conf)")
		}
		s = conf.Servers[0]
	}
	if _, _, err := net.SplitHostPort(s); err != nil {
		s = net.JoinHostPort(strings.Trim(s, "[]"), "53")
	}
	return s, nil
}

// Check looks the TXT records at name up and reports whether one of them is value, and in words
// what was found (for the claim's condition: never more than the answer said).
func (r *Resolver) Check(ctx context.Context, name, value string) (Outcome, string) {
	server, err := r.server()
	if err != nil {
		return Unknown, err.Error()
	}
	timeout := r.timeout()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeTXT)
	q.RecursionDesired = true
	q.SetEdns0(4096, false)
	answer, _, err := (&dns.Client{Net: "udp", Timeout: timeout}).ExchangeContext(ctx, q, server)
	if err == nil && answer.Truncated {
		answer, _, err = (&dns.Client{Net: "tcp", Timeout: timeout}).ExchangeContext(ctx, q, server)
	}
	if err != nil {
		return Unknown, fmt.Sprintf("the resolver did not answer for %s: %v", name, err)
	}
	switch answer.Rcode {
	case dns.RcodeSuccess:
	case dns.RcodeNameError:
		return Absent, fmt.Sprintf("%s does not exist (NXDOMAIN)", name)
	default:
		return Unknown, fmt.Sprintf("the resolver answered %s for %s", dns.RcodeToString[answer.Rcode], name)
	}
	// The TXT records of the name, or of the end of a CNAME chain from it (a challenge delegated
	// elsewhere): never a record of another owner the answer happens to carry.
	owners := map[string]bool{strings.ToLower(dns.Fqdn(name)): true}
	for range answer.Answer {
		for _, rr := range answer.Answer {
			if c, ok := rr.(*dns.CNAME); ok && owners[strings.ToLower(c.Hdr.Name)] {
				owners[strings.ToLower(c.Target)] = true
			}
		}
	}
	found := 0
	for _, rr := range answer.Answer {
		txt, ok := rr.(*dns.TXT)
		if !ok || !owners[strings.ToLower(txt.Hdr.Name)] {
			continue
		}
		found++
		if strings.Join(txt.Txt, "") == value {
			return Present, fmt.Sprintf("the TXT record at %s holds the claim's value", name)
		}
	}
	if found == 0 {
		return Absent, fmt.Sprintf("%s has no TXT record", name)
	}
	return Absent, fmt.Sprintf("%s has %d TXT record(s), none with the claim's value", name, found)
}
