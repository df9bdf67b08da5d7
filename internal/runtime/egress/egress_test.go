package egress

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDenyListHoldsEveryNodeAddressThePublishedEdgeAndTheOperatorsRanges(t *testing.T) {
	t.Parallel()
	extra, err := ParseDeny([]string{"203.0.113.7/24", " 2001:db8::1/32 "})
	require.NoError(t, err)
	require.Equal(t, []string{"203.0.113.0/24", "2001:db8::/32"}, extra, "canonical network form")
	deny, err := DenyList([]string{"198.51.100.9:443", "0.0.0.0:8787", "edge.example:80"}, extra)
	require.NoError(t, err)
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, a := range addrs {
		ip := a.(*net.IPNet).IP
		want := ip.String() + "/128"
		if ip.To4() != nil {
			want = ip.To4().String() + "/32"
		}
		require.Contains(t, deny, want, "every address of this node's interfaces")
	}
	require.Contains(t, deny, "198.51.100.9/32", "the published edge's address")
	require.NotContains(t, deny, "0.0.0.0/32", "an unspecified listen address names no address")
	require.Contains(t, deny, "203.0.113.0/24")
	require.Contains(t, deny, "2001:db8::/32")
	again, err := DenyList([]string{"198.51.100.9:443", "0.0.0.0:8787", "edge.example:80"}, extra)
	require.NoError(t, err)
	require.Equal(t, deny, again, "the same addresses give the same list (and so the same config)")
}

func TestParseDenyRefusesWhatIsNotACIDR(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"10.0.0.1", "example.com/24", "", `1.2.3.4/32"]`} {
		_, err := ParseDeny([]string{bad})
		require.Error(t, err, bad)
	}
}

// A worker's subrequest reaches public unicast addresses only: never a private, local, reserved,
// documentation or mapping range (which workerd's own "public" admitted), nor this node's own
// addresses or the operator's ranges.
func TestPolicyAllowsPublicAddressesOnly(t *testing.T) {
	t.Parallel()
	p, err := NewPolicy([]string{"198.51.100.9:443"}, []string{"8.8.4.0/24"})
	require.NoError(t, err)
	for addr, want := range map[string]bool{
		"1.1.1.1": true, "2606:4700:4700::1111": true, "8.8.8.8": true,
		"8.8.4.4":   false, // the operator's
		"127.0.0.1": false, "::1": false, "10.1.2.3": false, "172.16.0.9": false, "192.168.7.8": false,
		"169.254.169.254": false, "fe80::1": false, "fd00::2": false, "0.0.0.0": false, "::": false,
		"100.64.0.1": false, "192.0.0.8": false, "192.0.2.2": false, "198.51.100.7": false, "203.0.113.7": false,
		"198.18.0.1": false, "240.0.0.1": false, "255.255.255.255": false, "224.0.0.1": false,
		"64:ff9b::a00:1": false, "64:ff9b:1::1": false, "2002:a00:1::": false, "2001::1": false, "2001:db8::1": false,
		"::ffff:10.0.0.1": false, "::ffff:1.1.1.1": true,
	} {
		require.Equal(t, want, p.Allowed(netip.MustParseAddr(addr)), addr)
	}
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.(*net.IPNet).IP)
		require.False(t, p.Allowed(ip), "this node's own address %s", ip)
	}
}

// The egress dials what the policy allows, after resolving the name itself: a hostname that
// resolves to a forbidden address reaches nothing, and the worker gets a problem naming only the
// host it asked for.
func TestEgressRefusesANameThatResolvesToAForbiddenAddress(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hits.Add(1) }))
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	policy, err := NewPolicy(nil, nil)
	require.NoError(t, err)
	e := New(policy, nil)
	m := NewMeter(0, 0, 0)
	defer m.Begin()()
	for _, target := range []string{"http://localhost:" + port + "/", "http://127.0.0.1:" + port + "/", "https://localhost:" + port + "/"} {
		req := httptest.NewRequest(http.MethodGet, target, nil)
		rec := httptest.NewRecorder()
		e.Serve(rec, req, m, "caller")
		require.Equal(t, http.StatusBadGateway, rec.Code, target)
		require.Contains(t, rec.Body.String(), "egress_refused", target)
		require.NotContains(t, rec.Body.String(), "127.0.0.1:"+port, "the problem names no resolved address")
	}
	require.Zero(t, hits.Load(), "nothing reached the loopback listener")
}

// A worker's subrequests are bounded per request it serves (its budget is spent across its
// requests in flight), and its ctx.waitUntil work makes none once WaitUntilAfter has passed
// since its last response: the review's waitUntil loop made 60,000 in 90 s (SPEC 5.1).
func TestMeterBoundsSubrequestsPerRequestAndAfterTheLastResponse(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	m := NewMeter(50, 3, 0)
	m.SetClock(func() time.Time { return now })
	admitted := func() bool {
		if p := m.admit(); p != nil {
			return false
		}
		m.inflight.Add(-1)
		return true
	}
	require.False(t, admitted(), "a worker that serves no request makes none")
	end := m.Begin()
	for range 3 {
		require.True(t, admitted())
	}
	require.False(t, admitted(), "the request's budget is spent")
	end2 := m.Begin()
	require.True(t, admitted(), "a second request brings its own budget")
	end()
	end2()
	now = now.Add(WaitUntilAfter - time.Second)
	require.True(t, admitted(), "work left running after the response may still go on for a while")
	now = now.Add(2 * time.Second)
	require.False(t, admitted(), "waitUntil work makes no subrequest past the bound")
	require.EqualValues(t, 3, m.Refused())
	m.Begin()()
	for range 3 {
		require.True(t, admitted(), "a new request starts a budget of its own, not what was left")
	}
	require.False(t, admitted())
}

// At most Limit subrequests of one worker are in flight at once.
func TestMeterCapsSubrequestsInFlight(t *testing.T) {
	t.Parallel()
	m := NewMeter(2, 100, 0)
	defer m.Begin()()
	hold := make(chan struct{})
	var wg sync.WaitGroup
	codes := make(chan int, 3)
	arrived := make(chan struct{}, 3)
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := httptest.NewRecorder()
			m.Admitted(rec, httptest.NewRequest(http.MethodGet, "http://x/", nil), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
				arrived <- struct{}{}
				<-hold
			}))
			codes <- rec.Code
		}()
	}
	<-arrived
	<-arrived
	require.Eventually(t, func() bool { return m.Refused() == 1 }, 5*time.Second, time.Millisecond, "the third is refused")
	require.EqualValues(t, 2, m.InFlight())
	close(hold)
	wg.Wait()
	close(codes)
	byCode := map[int]int{}
	for c := range codes {
		byCode[c]++
	}
	require.Equal(t, map[int]int{http.StatusOK: 2, http.StatusTooManyRequests: 1}, byCode)
}

// A meter knows when each subrequest in flight began and when its answer began to come back (a
// final status, not an informational one), and remembers the last ones that ended (liveness blame
// reads them: a request waiting for an answer that has not come is not holding its process's
// thread). A refused subrequest is never counted.
func TestMeterKnowsWhenEachSubrequestBeganAndWasAnswered(t *testing.T) {
	t.Parallel()
	m := NewMeter(2, 100, 0)
	defer m.Begin()()
	before := time.Now()
	w1, _, first, ok := m.Hold(httptest.NewRecorder(), get())
	require.True(t, ok)
	w2, _, second, ok := m.Hold(httptest.NewRecorder(), get())
	require.True(t, ok)
	_, _, _, ok = m.Hold(httptest.NewRecorder(), get())
	require.False(t, ok, "the cap in flight is 2")
	subs := m.Subrequests()
	require.Len(t, subs, 2)
	for _, s := range subs {
		require.False(t, s.Began.Before(before))
		require.True(t, s.Answered.IsZero(), "no answer yet")
		require.True(t, s.Ended.IsZero(), "in flight")
	}

	// The edge flushes a streamed answer through it, and takes its connection for a WebSocket.
	require.Implements(t, (*http.Flusher)(nil), w1)
	require.Implements(t, (*http.Hijacker)(nil), w1)
	w1.WriteHeader(http.StatusContinue)
	for _, s := range m.Subrequests() {
		require.True(t, s.Answered.IsZero(), "an informational status is no answer")
	}
	w1.WriteHeader(http.StatusOK)
	_, err := w2.Write([]byte("body"))
	require.NoError(t, err)
	for _, s := range m.Subrequests() {
		require.False(t, s.Answered.Before(s.Began), "answered once its status or body came")
		require.False(t, s.Answered.IsZero())
	}

	first()
	first()
	subs = m.Subrequests()
	require.Len(t, subs, 2, "an ended subrequest is remembered, once")
	require.Equal(t, 1, len(slices.DeleteFunc(subs, func(s Subrequest) bool { return s.Ended.IsZero() })))
	second()
	for range maxEnded {
		_, _, release, ok := m.Hold(httptest.NewRecorder(), get())
		require.True(t, ok)
		release()
	}
	subs = m.Subrequests()
	require.Len(t, subs, maxEnded, "the last %d ended are remembered", maxEnded)
	for _, s := range subs {
		require.True(t, s.Answered.IsZero(), "the earlier answered ones are forgotten")
	}
}

// A subrequest carried by Admitted is noted too, and a flush or a protocol switch is an answer
// as much as a status (a streamed answer's first bytes, a WebSocket's 101).
func TestEveryWayAnAnswerBeginsIsNoted(t *testing.T) {
	t.Parallel()
	answered := func(m *Meter) int {
		n := 0
		for _, s := range m.Subrequests() {
			if !s.Answered.IsZero() {
				n++
			}
		}
		return n
	}
	m := NewMeter(10, 100, 0)
	defer m.Begin()()
	inside := make(chan int, 1)
	m.Admitted(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "http://x/", nil), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		inside <- answered(m)
		w.WriteHeader(http.StatusNoContent)
	}))
	require.Equal(t, 0, <-inside, "not answered before its status")
	require.Equal(t, 1, answered(m), "Admitted notes its answer")

	w, _, release, ok := m.Hold(httptest.NewRecorder(), get())
	require.True(t, ok)
	defer release()
	w.(http.Flusher).Flush()
	require.Equal(t, 2, answered(m), "a flush")

	w, _, release, ok = m.Hold(httptest.NewRecorder(), get())
	require.True(t, ok)
	defer release()
	_, _, _ = w.(http.Hijacker).Hijack() // the recorder cannot be taken; the switch was asked for
	require.Equal(t, 3, answered(m), "a protocol switch")
}

// get is a subrequest without a body.
func get() *http.Request { return httptest.NewRequest(http.MethodGet, "http://x/", nil) }

// A subrequest without a body is sent as it begins; one with a body once the body has been read
// whole (a streamed body is made by its worker's code meanwhile).
func TestAMeterNotesWhenASubrequestsBodyWasSentWhole(t *testing.T) {
	t.Parallel()
	m := NewMeter(10, 100, 0)
	defer m.Begin()()
	_, _, release, ok := m.Hold(httptest.NewRecorder(), get())
	require.True(t, ok)
	release()
	subs := m.Subrequests()
	require.Len(t, subs, 1)
	require.Equal(t, subs[0].Began, subs[0].Sent, "no body: sent as it began")

	_, r, release, ok := m.Hold(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "http://x/", strings.NewReader("a body")))
	require.True(t, ok)
	defer release()
	sent := func() time.Time {
		for _, s := range m.Subrequests() {
			if s.Ended.IsZero() {
				return s.Sent
			}
		}
		t.Fatal("no subrequest in flight")
		return time.Time{}
	}
	require.True(t, sent().IsZero(), "its body is not read yet")
	b := make([]byte, 2)
	_, err := r.Body.Read(b)
	require.NoError(t, err)
	require.True(t, sent().IsZero(), "nor read whole")
	_, err = io.ReadAll(r.Body)
	require.NoError(t, err)
	require.False(t, sent().IsZero(), "read whole")
}
