package server

import (
	"sync"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
)

// Bounds on the log follow streams one Host replica holds open (SPEC 3.6, issue 32 item 10): a
// follow stream holds a connection here and a long poll on the runtime node for as long as its
// client stays, so an unbounded number of them would take a replica's and the node's descriptors.
const (
	// DefaultLogStreamsPerKey and DefaultLogStreamsPerOrganization cap the follow streams open
	// at once on one replica, per API key and per organization.
	DefaultLogStreamsPerKey          = 4
	DefaultLogStreamsPerOrganization = 16
)

// streamGate counts the open follow streams of each key and organization.
type streamGate struct {
	perKey, perOrg int
	mu             sync.Mutex
	byKey, byOrg   map[string]int
}

func newStreamGate(perKey, perOrg int) *streamGate {
	if perKey <= 0 {
		perKey = DefaultLogStreamsPerKey
	}
	if perOrg <= 0 {
		perOrg = DefaultLogStreamsPerOrganization
	}
	return &streamGate{perKey: perKey, perOrg: perOrg, byKey: map[string]int{}, byOrg: map[string]int{}}
}

// open admits one more stream of key in org, or refuses it (429, retryable) naming the cap it
// would pass. The release it returns ends the stream's count, once.
func (g *streamGate) open(key, org string) (release func(), err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.byKey[key] >= g.perKey:
		return nil, apierr.New(apierr.RateLimited, "this API key already follows %d worker logs on this Host, its most; end one (or read without follow) and retry", g.perKey)
	case g.byOrg[org] >= g.perOrg:
		return nil, apierr.New(apierr.RateLimited, "this organization already follows %d worker logs on this Host, its most; end one (or read without follow) and retry", g.perOrg)
	}
	g.byKey[key]++
	g.byOrg[org]++
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.byKey[key]--; g.byKey[key] == 0 {
				delete(g.byKey, key)
			}
			if g.byOrg[org]--; g.byOrg[org] == 0 {
				delete(g.byOrg, org)
			}
		})
	}, nil
}
