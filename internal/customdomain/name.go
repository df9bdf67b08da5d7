// Package customdomain is the authority over custom domains (SPEC 3.7): an organization's claim on
// a DNS name, verified by a TXT record the Host looks up, held by one organization at a time (the
// first to verify), re-checked daily and revoked when its record is gone for a week.
package customdomain

import (
	"net"
	"strings"

	"golang.org/x/net/idna"
	"golang.org/x/net/publicsuffix"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// Kind is the ownership kind of custom domains; ResourceType the provider resource that holds them.
const (
	Kind         = "custom-domain"
	ResourceType = "takoform_custom_domain"
)

// ChallengeLabel is the label the TXT record is published under: _takoform-challenge.<name>.
const ChallengeLabel = "_takoform-challenge"

// Name is a checked custom domain hostname: Hostname as claimed ("*." included for a wildcard),
// Base without it.
type Name struct {
	Hostname string
	Base     string
	Wildcard bool
}

// ChallengeName is where the claim's TXT record is looked up.
func (n Name) ChallengeName() string { return ChallengeLabel + "." + n.Base }

// Parse checks a claimed hostname (SPEC 3.7): a lowercase A-label DNS name of at least two labels,
// at most 253 octets, no trailing dot and no IP literal, or "*." and one; neither it nor a
// wildcard's base may be a public suffix, and no name the operator reserves (nor one under it) may
// be claimed.
func Parse(c *catalog.Catalog, hostname string) (Name, error) {
	n := nameOf(hostname)
	switch {
	case hostname != strings.ToLower(hostname):
		return Name{}, apierr.New(apierr.InvalidRequest, "hostname %q must be lowercase", hostname)
	case strings.HasSuffix(hostname, "."):
		return Name{}, apierr.New(apierr.InvalidRequest, "hostname %q must have no trailing dot", hostname)
	case net.ParseIP(strings.Trim(n.Base, "[]")) != nil:
		return Name{}, apierr.New(apierr.InvalidRequest, "hostname %q is an IP address; a custom domain is a DNS name", hostname)
	case !vocab.CustomDomain.MatchString(hostname) || !validALabels(n.Base) || len(hostname) > 253:
		return Name{}, apierr.New(apierr.InvalidRequest, "hostname %q is not a lowercase A-label DNS name of at most 253 octets (or *. and one)", hostname)
	case allDigits(n.Base[strings.LastIndexByte(n.Base, '.')+1:]):
		return Name{}, apierr.New(apierr.InvalidRequest, "hostname %q ends in a numeric label: it is an address, not a DNS name", hostname)
	}
	if suffix, _ := publicsuffix.PublicSuffix(n.Base); suffix == n.Base {
		if n.Wildcard {
			return Name{}, apierr.New(apierr.InvalidRequest, "hostname %q is a wildcard over a public suffix (%s): it would cover names of many owners", hostname, n.Base)
		}
		return Name{}, apierr.New(apierr.InvalidRequest, "hostname %q is a public suffix: names under it belong to many owners", hostname)
	}
	if d := c.DomainReserved(n.Base); d != "" {
		return Name{}, apierr.New(apierr.DomainReserved, "hostname %q is under %s, which the operator reserves; a worker gets an address there through a reservation's subdomain", hostname, d)
	}
	return n, nil
}

// validALabels reports whether every xn-- label of name is valid Punycode of an IDNA name.
func validALabels(name string) bool {
	if !strings.Contains(name, "xn--") {
		return true
	}
	_, err := idna.Lookup.ToUnicode(name)
	return err == nil
}

func allDigits(label string) bool {
	for _, c := range label {
		if c < '0' || c > '9' {
			return false
		}
	}
	return label != ""
}

// Covering names the claims that may cover a reservation's hostname: the hostname itself, then the
// wildcard one label above it ("" when it has no parent that could be claimed).
func Covering(hostname string) (exact, wildcard string) {
	_, parent, ok := strings.Cut(hostname, ".")
	if !ok || !strings.Contains(parent, ".") {
		return hostname, ""
	}
	return hostname, "*." + parent
}
