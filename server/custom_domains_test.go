package server_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/cloudflare/cfstandin"
	"github.com/takoform/terraform-provider-takoform/internal/customdomain/dnstest"
	"github.com/takoform/terraform-provider-takoform/internal/quota"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// domainsCatalog sells a selfhost worker offering that serves custom domains (its edge at
// 203.0.113.7 for the routing record), one that does not, and reserves example.net.
const domainsCatalog = `{
  "installations": [{"name": "local", "pack": "selfhost", "endpointSuffix": "workers.test"}],
  "offerings": [
    {"id": "worker", "kind": "module-worker", "installation": "local", "soldTo": ["*"], "customDomains": {"target": "203.0.113.7"}},
    {"id": "worker-plain", "kind": "module-worker", "installation": "local", "soldTo": ["*"]},
    {"id": "endpoint", "kind": "worker-endpoint", "installation": "local", "soldTo": ["*"]}
  ],
  "reservedDomains": ["example.net"],
  "quotas": {"customDomains": 3}
}`

const domainsPath = "/v1/custom-domains/"

const tokenC = "token-cccccccccccccccc"

// domainHarness is a Host whose resolver is a real DNS server the test publishes records on.
func domainHarness(t *testing.T) (*harness, *dnstest.Server) {
	t.Helper()
	d, err := dnstest.Start()
	require.NoError(t, err)
	t.Cleanup(d.Close)
	h := setup(t, func(o *options) { o.catalogJSON, o.dnsResolver = domainsCatalog, d.Addr })
	return h, d
}

func (h *harness) putDomain(key, hostname, token string) reply {
	h.t.Helper()
	return h.do(req{method: http.MethodPut, path: domainsPath + hostname, key: key, token: token, body: map[string]any{}})
}

func (h *harness) getDomain(key, hostname string) reply {
	h.t.Helper()
	return h.do(req{method: http.MethodGet, path: domainsPath + hostname, key: key})
}

func (h *harness) deleteDomain(key, hostname, token string) reply {
	h.t.Helper()
	return h.do(req{method: http.MethodDelete, path: domainsPath + hostname, key: key, token: token})
}

// txtRecord is the claim's TXT record: its name and value.
func txtRecord(t *testing.T, claim map[string]any) (string, string) {
	t.Helper()
	records := claim["dnsRecords"].([]any)
	first := records[0].(map[string]any)
	require.Equal(t, "TXT", first["type"])
	return first["name"].(string), first["value"].(string)
}

// verifyDomain claims hostname for key under token, publishes its record on d, and runs the
// checker past the first backoff: the claim reads verified. It returns the TXT record.
func (h *harness) verifyDomain(d *dnstest.Server, key, hostname, token string) (name, value string) {
	h.t.Helper()
	claim := h.putDomain(key, hostname, token)
	require.Equal(h.t, http.StatusCreated, claim.status, "body: %s", claim.body)
	name, value = txtRecord(h.t, claim.json(h.t))
	d.SetTXT(name, value)
	h.advance("6 seconds")
	h.checkDomains()
	require.Equal(h.t, "verified", h.domainStatus(key, hostname))
	return name, value
}

// checkDomains runs one pass of the Host's custom-domain checker, as a replica's loop does.
func (h *harness) checkDomains() int {
	h.t.Helper()
	n, err := h.host.Domains.CheckDue(context.Background(), h.db, 100)
	require.NoError(h.t, err)
	return n
}

func (h *harness) domainStatus(key, hostname string) string {
	h.t.Helper()
	r := h.getDomain(key, hostname)
	require.Equal(h.t, http.StatusOK, r.status, "body: %s", r.body)
	return r.json(h.t)["status"].(string)
}

// A claim is pending until its TXT record is found, by the create's own lookup or by the checker
// with backoff; the record's value is the organization's for that name and survives deleting and
// claiming again; the first organization to verify holds the name, and a later claim is refused
// naming nobody (SPEC 3.7).
func TestACustomDomainIsVerifiedByItsTXTRecordAndHeldByTheFirstToVerify(t *testing.T) {
	t.Parallel()
	h, d := domainHarness(t)
	created := h.putDomain(h.key, "app.example.com", tokenA)
	require.Equal(t, http.StatusCreated, created.status, "body: %s", created.body)
	claim := created.json(t)
	require.Equal(t, "pending", claim["status"])
	name, value := txtRecord(t, claim)
	require.Equal(t, "_takoform-challenge.app.example.com", name)
	require.Len(t, value, 64)
	routing := claim["dnsRecords"].([]any)[1].(map[string]any)
	require.Equal(t, map[string]any{"type": "A", "name": "app.example.com", "value": "203.0.113.7", "offeringId": "worker"}, routing,
		"the record that points the name at the offering that serves custom domains, and only that one")
	require.Len(t, claim["dnsRecords"], 2)
	require.Contains(t, claim["conditions"].([]any)[0].(map[string]any)["message"], "does not exist (NXDOMAIN)")

	// Another organization's pending claim coexists; its value differs.
	globex, globexKey := h.newOrg("globex")
	other := h.putDomain(globexKey, "app.example.com", tokenB)
	require.Equal(t, http.StatusCreated, other.status, "body: %s", other.body)
	_, otherValue := txtRecord(t, other.json(t))
	require.NotEqual(t, value, otherValue, "the value is the organization's")

	// Published, the record is found on the next look (not before its backoff).
	d.SetTXT(name, "unrelated", value)
	require.Zero(t, h.checkDomains(), "nothing is due before the backoff")
	h.advance("6 seconds")
	require.Equal(t, 2, h.checkDomains())
	require.Equal(t, "verified", h.domainStatus(h.key, "app.example.com"))
	got := h.getDomain(h.key, "app.example.com").json(t)
	require.NotNil(t, got["verifiedAt"])
	require.Equal(t, tokenA, got["ownershipToken"])

	// The other organization publishes its own record too late: the name is held.
	d.SetTXT(name, value, otherValue)
	h.advance("11 seconds")
	h.checkDomains()
	otherClaim := h.getDomain(globexKey, "app.example.com").json(t)
	require.Equal(t, "pending", otherClaim["status"])
	require.Contains(t, otherClaim["conditions"].([]any)[0].(map[string]any)["message"], "another organization verified this name first")
	_, thirdKey := h.newOrg("initech")
	p := h.putDomain(thirdKey, "app.example.com", tokenC).problem(t, http.StatusConflict, "domain_taken")
	require.NotContains(t, p["detail"], "acme")
	require.NotContains(t, p["detail"], h.org.ID)
	require.NotContains(t, p["detail"], globex.ID)

	// Deleted and claimed again, under a new token: the same record verifies it at once.
	require.Equal(t, http.StatusOK, h.deleteDomain(h.key, "app.example.com", tokenA).status)
	again := h.putDomain(h.key, "app.example.com", "token-claim-again-00001")
	require.Equal(t, http.StatusCreated, again.status, "body: %s", again.body)
	require.Equal(t, "verified", again.json(t)["status"], "the create's own lookup found the record")
	_, againValue := txtRecord(t, again.json(t))
	require.Equal(t, value, againValue, "deleting and claiming again needs no new record")
}

// Names a claim may not take: malformed ones, public suffixes, and the operator's (SPEC 3.7). Each
// refusal writes nothing; the quota bounds what one organization claims.
func TestACustomDomainClaimRefusesNamesItMayNotTake(t *testing.T) {
	t.Parallel()
	h, _ := domainHarness(t)
	for _, bad := range []string{"App.example.com", "app.example.com.", "127.0.0.1", "com", "co.uk", "*.co.uk", "*.com", "-a.example.com", "a..example.com", "xn--.example.com"} {
		h.putDomain(h.key, bad, tokenA).problem(t, http.StatusUnprocessableEntity, "invalid_request")
	}
	for _, reserved := range []string{"example.net", "www.example.net", "*.example.net", "api.workers.test", "workers.test", "x.workers.dev"} {
		p := h.putDomain(h.key, reserved, tokenA).problem(t, http.StatusUnprocessableEntity, "domain_reserved")
		require.Contains(t, p["detail"], "reserves")
	}
	require.Zero(t, h.count(`SELECT count(*) FROM custom_domains`))
	for i, name := range []string{"a.example.com", "*.example.org", "b.example.com"} {
		require.Equal(t, http.StatusCreated, h.putDomain(h.key, name, tokenA+string(rune('a'+i))).status, name)
	}
	p := h.putDomain(h.key, "c.example.com", tokenB).problem(t, http.StatusTooManyRequests, "quota_exceeded")
	require.Contains(t, p["detail"], "ceiling is 3")
	require.Equal(t, 3, h.count(`SELECT count(*) FROM custom_domains`))

	// An operator's override of the organization's ceiling (takoserver orgs quota
	// --custom-domains) is what the next claim is held to.
	four := 4
	require.NoError(t, quota.Set(context.Background(), h.db, h.org.ID, quota.CustomDomains, &four))
	require.Equal(t, http.StatusCreated, h.putDomain(h.key, "c.example.com", tokenB).status)
	p = h.putDomain(h.key, "d.example.com", tokenB+"d").problem(t, http.StatusTooManyRequests, "quota_exceeded")
	require.Contains(t, p["detail"], "ceiling is 4")
}

// A verified domain whose record is gone on seven daily lookups in a row is revoked; a resolver
// failure counts for nothing, and a record seen again starts the count over. A pending claim that
// is not verified within a week fails (SPEC 3.7).
func TestAVerifiedDomainIsRevokedAfterSevenAbsentLookupsAndAPendingOneFailsAfterAWeek(t *testing.T) {
	t.Parallel()
	h, d := domainHarness(t)
	name, value := h.verifyDomain(d, h.key, "shop.example.com", tokenA)

	day := func() {
		t.Helper()
		h.advance("1 day 1 second")
		require.Equal(t, 1, h.checkDomains())
	}
	d.SetTXT(name)
	for range 6 {
		day()
	}
	require.Equal(t, "verified", h.domainStatus(h.key, "shop.example.com"), "six absent lookups do not revoke")
	d.SetTXT(name, value)
	day()
	d.SetTXT(name)
	for range 6 {
		day()
	}
	d.Fail(name, dns.RcodeServerFailure)
	h.advance("1 day")
	for range 30 {
		h.advance("1 hour 1 second")
		h.checkDomains()
	}
	require.Equal(t, "verified", h.domainStatus(h.key, "shop.example.com"), "a record seen again starts over, and a resolver error counts for nothing")
	d.Fail(name, 0)
	day()
	revoked := h.getDomain(h.key, "shop.example.com").json(t)
	require.Equal(t, "revoked", revoked["status"])
	require.Contains(t, revoked["conditions"].([]any)[0].(map[string]any)["message"], "absent on 7 daily lookups")
	h.advance("2 days")
	require.Zero(t, h.checkDomains(), "a revoked claim is not looked up again")

	// Nothing new is served on it: a reservation naming it is refused.
	h.putReservation(h.key, "res-shop", tokenB, map[string]any{"space": "prod", "workerName": "api", "hostname": "shop.example.com", "offeringId": "worker"}).
		problem(t, http.StatusUnprocessableEntity, "domain_not_verified")

	pending := h.putDomain(h.key, "late.example.com", tokenC)
	require.Equal(t, "pending", pending.json(t)["status"])
	for range 20 {
		h.advance("10 hours")
		h.checkDomains()
	}
	failed := h.getDomain(h.key, "late.example.com").json(t)
	require.Equal(t, "failed", failed["status"])
	require.Contains(t, failed["conditions"].([]any)[0].(map[string]any)["message"], "not verified within 7 days")
}

// Two replicas' checkers running at once look each due claim up once (SPEC 3.7: deduplicated).
func TestCustomDomainChecksAreDeduplicatedAcrossReplicas(t *testing.T) {
	t.Parallel()
	h, d := domainHarness(t)
	names := []string{"a.example.com", "b.example.com", "c.example.com"}
	for i, n := range names {
		require.Equal(t, http.StatusCreated, h.putDomain(h.key, n, tokenA+string(rune('a'+i))).status)
	}
	before := map[string]int{}
	for _, n := range names {
		before[n] = d.Queries("_takoform-challenge." + n)
	}
	h.advance("6 seconds")
	// A slow resolver: each checker starts while the ones before it are still looking up.
	d.Delay(300 * time.Millisecond)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { _, _ = h.host.Domains.CheckDue(context.Background(), h.db, 100) })
		time.Sleep(50 * time.Millisecond)
	}
	wg.Wait()
	for _, n := range names {
		require.Equal(t, 1, d.Queries("_takoform-challenge."+n)-before[n], "%s looked up once", n)
	}
}

// A reservation may hold a verified custom hostname instead of a subdomain (SPEC 3.7): its origin
// is https://<hostname>, an endpoint on it is served by the edge at that name, and the claim
// cannot be deleted while the reservation holds it. A name the organization has not verified, a
// name another organization verified exactly (even under this one's wildcard), an offering that
// serves no custom domains, and a subdomain beside it are refused, at the derivation route and
// at PUT.
func TestAReservationHoldsAVerifiedCustomHostname(t *testing.T) {
	t.Parallel()
	h, d := domainHarness(t)
	h.verifyDomain(d, h.key, "*.example.com", tokenA)
	_, globexKey := h.newOrg("globex")
	h.verifyDomain(d, globexKey, "taken.example.com", tokenB)

	w := h.putWorker("prod", "api", workerToken, withOffering(workerBody(), "worker"))
	require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)
	body := func(hostname string) map[string]any {
		return map[string]any{"space": "prod", "workerName": "api", "hostname": hostname, "offeringId": "worker"}
	}
	for _, c := range []struct {
		body   map[string]any
		status int
		code   string
	}{
		{body("app.other.com"), http.StatusUnprocessableEntity, "domain_not_verified"},
		{body("deep.app.example.com"), http.StatusUnprocessableEntity, "domain_not_verified"},
		{body("taken.example.com"), http.StatusConflict, "domain_taken"},
		{body("*.example.com"), http.StatusUnprocessableEntity, "invalid_request"},
		{map[string]any{"space": "prod", "workerName": "api", "hostname": "app.example.com", "offeringId": "worker-plain"}, http.StatusUnprocessableEntity, "custom_domain_unsupported"},
		{map[string]any{"space": "prod", "workerName": "api", "hostname": "app.example.com", "subdomain": "app", "offeringId": "worker"}, http.StatusUnprocessableEntity, "invalid_request"},
	} {
		h.deriveLabel(h.key, c.body).problem(t, c.status, c.code)
		h.putReservation(h.key, "res-app", tokenC, c.body).problem(t, c.status, c.code)
	}
	require.Zero(t, h.rowCount("id = 'res-app'"))

	derived := h.deriveLabel(h.key, body("app.example.com"))
	require.Equal(t, http.StatusOK, derived.status, "body: %s", derived.body)
	require.Equal(t, "https://app.example.com", derived.json(t)["canonicalOrigin"])
	r := h.putReservation(h.key, "res-app", tokenC, body("app.example.com"))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	require.Equal(t, "https://app.example.com", r.json(t)["canonicalOrigin"])
	require.Equal(t, "app.example.com", r.json(t)["hostname"])
	replay := h.putReservation(h.key, "res-app", tokenC, body("app.example.com"))
	require.Equal(t, r.body, replay.body, "a replay")
	require.Equal(t, "true", replay.header.Get("Takoform-Replayed"))
	h.putReservation(h.key, "res-app", tokenC, map[string]any{"space": "prod", "workerName": "api", "subdomain": "app", "offeringId": "worker"}).
		problem(t, http.StatusConflict, "reservation_mismatch")

	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-app"})
	require.Equal(t, "https://app.example.com/", e["url"])
	require.Equal(t, "app.example.com", e["hostname"])
	status, answer, _ := h.runtime.Get(t, "app.example.com", "/")
	require.Equal(t, http.StatusOK, status, answer)
	require.True(t, strings.HasPrefix(answer, "hello"), answer)

	h.deleteDomain(h.key, "*.example.com", tokenA).problem(t, http.StatusConflict, "domain_in_use")
	require.Equal(t, "verified", h.domainStatus(h.key, "*.example.com"))
	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "api", endpointToken).status)
	h.waitReleasable("res-app", tokenC)
	require.Equal(t, http.StatusOK, h.deleteDomain(h.key, "*.example.com", tokenA).status, "once the reservation is released")
}

// waitReleasable releases reservation id once its fences allow (the endpoint's route removal
// closes its attestation).
func (h *harness) waitReleasable(id, token string) {
	h.t.Helper()
	require.Eventually(h.t, func() bool { return h.deleteReservation(h.key, id, token).status == http.StatusOK },
		30*time.Second, 100*time.Millisecond)
}

// A reservation taken while its domain was verified publishes nothing new once the domain is
// revoked: an endpoint create on it is refused and writes nothing (SPEC 3.7).
func TestNothingNewIsServedOnARevokedDomain(t *testing.T) {
	t.Parallel()
	h, d := domainHarness(t)
	name, _ := h.verifyDomain(d, h.key, "solo.example.com", tokenA)
	w := h.putWorker("prod", "api", workerToken, withOffering(workerBody(), "worker"))
	require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)
	r := h.putReservation(h.key, "res-solo", tokenB, map[string]any{"space": "prod", "workerName": "api", "hostname": "solo.example.com", "offeringId": "worker", "ttlSeconds": 2592000})
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)

	d.SetTXT(name)
	for range 7 {
		h.advance("1 day 1 second")
		h.checkDomains()
	}
	require.Equal(t, "revoked", h.domainStatus(h.key, "solo.example.com"))
	h.putEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-solo"}).
		problem(t, http.StatusUnprocessableEntity, "domain_not_verified")
	require.Zero(t, h.count(`SELECT count(*) FROM worker_endpoints`))
	require.Equal(t, "prepared", h.getReservation(h.key, "res-solo").json(t)["status"], "the refused create bound nothing")
}

// Two organizations whose records are both published verify the same name from checkers of
// several replicas at once, with the create path of a third claim racing them: exactly one
// organization holds it, whatever the order (SPEC 3.7: one organization per hostname).
func TestExactlyOneOrganizationVerifiesANameWhateverTheRace(t *testing.T) {
	t.Parallel()
	h, d := domainHarness(t)
	const name = "_takoform-challenge.race.example.com"
	type claimant struct{ key, token, value string }
	var claimants []claimant
	for i, org := range []string{"globex", "initech", "umbrella"} {
		_, key := h.newOrg(org)
		token := fmt.Sprintf("token-race-%02d-000000000", i)
		r := h.putDomain(key, "race.example.com", token)
		require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
		_, value := txtRecord(t, r.json(t))
		claimants = append(claimants, claimant{key, token, value})
	}
	values := []string{claimants[0].value, claimants[1].value, claimants[2].value}
	d.SetTXT(name, values...)
	d.Delay(100 * time.Millisecond)
	h.advance("6 seconds")
	// Each checker takes one claim, so the three lookups end, and their outcomes are recorded, at
	// the same moment.
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { _, _ = h.host.Domains.CheckDue(context.Background(), h.db, 1) })
	}
	// The caller's own organization claims it too, while the checkers look: its create finds the
	// record at once.
	_, acmeValue := func() (string, string) {
		r := h.putDomain(h.key, "race.example.com", tokenA)
		if r.status == http.StatusConflict {
			return "", ""
		}
		require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
		return txtRecord(t, r.json(t))
	}()
	wg.Wait()
	if acmeValue != "" {
		d.SetTXT(name, append(values, acmeValue)...)
	}
	for range 3 {
		h.advance("11 minutes")
		h.checkDomains()
	}
	require.Equal(t, 1, h.count(`SELECT count(*) FROM custom_domains WHERE hostname = 'race.example.com' AND status = 'verified'`))
	require.Zero(t, h.count(`SELECT count(*) FROM custom_domains WHERE hostname = 'race.example.com' AND status = 'failed'`))
	// Two checkers recording at the very same instant both pass the check in Go; the database's
	// unique index over verified claims is what refuses the second.
	_, err := h.db.Exec(context.Background(), `UPDATE custom_domains SET status = 'verified', verified_at = now()
		WHERE hostname = 'race.example.com' AND status = 'pending'`)
	require.ErrorContains(t, err, "custom_domains_verified_key")
}

// A revoked domain is let go (SPEC 3.7): the janitor deactivates, deletes the endpoint (its route
// removed) and releases the reservation standing on it, each under its owner's token in the
// destroy order, so the owner's own destroy later replays those answers; the name can then be
// verified and used by the organization that holds it now.
func TestARevokedDomainIsLetGoAndCanChangeHands(t *testing.T) {
	t.Parallel()
	h, d := domainHarness(t)
	name, _ := h.verifyDomain(d, h.key, "moving.example.com", tokenA)
	w := h.putWorker("prod", "api", workerToken, withOffering(workerBody(), "worker"))
	require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)
	r := h.putReservation(h.key, "res-moving", tokenB, map[string]any{"space": "prod", "workerName": "api", "hostname": "moving.example.com", "offeringId": "worker"})
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-moving"})
	a := h.putActivation("res-moving", tokenC, e["uid"].(string))
	require.Equal(t, http.StatusCreated, a.status, "body: %s", a.body)
	status, _, _ := h.runtime.Get(t, "moving.example.com", "/")
	require.Equal(t, http.StatusOK, status)

	// Nothing is let go while the claim is verified.
	h.host.Sweep(context.Background())
	require.Equal(t, http.StatusOK, h.get("/v1/spaces/prod/worker-endpoints/api").status)

	// The name changes hands: its record is gone for a week.
	d.SetTXT(name)
	for range 7 {
		h.advance("1 day 1 second")
		h.checkDomains()
	}
	require.Equal(t, "revoked", h.domainStatus(h.key, "moving.example.com"))
	require.Eventually(t, func() bool {
		h.host.Sweep(context.Background())
		return h.getReservation(h.key, "res-moving").status == http.StatusNotFound
	}, 30*time.Second, 200*time.Millisecond, "the reservation is released once the endpoint's attestation closed")
	require.Equal(t, http.StatusNotFound, h.get("/v1/spaces/prod/worker-endpoints/api").status)
	status, _, _ = h.runtime.Get(t, "moving.example.com", "/")
	require.Equal(t, http.StatusNotFound, status, "the route is removed")

	// The owner's destroy, in order, replays the janitor's answers.
	for _, r := range []reply{
		h.deleteActivation("res-moving", tokenC),
		h.deleteEndpoint("prod", "api", endpointToken),
		h.deleteReservation(h.key, "res-moving", tokenB),
	} {
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		require.Equal(t, "true", r.header.Get("Takoform-Replayed"))
	}
	require.Equal(t, http.StatusOK, h.deleteDomain(h.key, "moving.example.com", tokenA).status)

	// The new holder of the name verifies it and takes the origin.
	_, otherKey := h.newOrg("newco")
	other := h.putDomain(otherKey, "moving.example.com", "token-newco-claim-00001")
	require.Equal(t, http.StatusCreated, other.status, "body: %s", other.body)
	_, otherValue := txtRecord(t, other.json(t))
	d.SetTXT(name, otherValue)
	h.advance("6 seconds")
	h.checkDomains()
	require.Equal(t, "verified", h.domainStatus(otherKey, "moving.example.com"))
	taken := h.putReservation(otherKey, "res-newco", "token-newco-res-000001", map[string]any{"space": "web", "workerName": "front", "hostname": "moving.example.com", "offeringId": "worker"})
	require.Equal(t, http.StatusCreated, taken.status, "body: %s", taken.body)
}

// On wfp-managed a custom domain is a Cloudflare for SaaS custom hostname of the operator's zone
// plus the routing entry (SPEC 3.7): created through the SDK (a lost answer to the create makes
// no second one), Ready only once the custom hostname and its certificate read active and the
// dispatch worker answers for it, served at https://<name>/ by the stand-in's edge, and deleted
// with the endpoint. The claim's records point the name at the zone's CNAME target.
func TestACustomDomainOnWFPIsACloudflareForSaaSCustomHostname(t *testing.T) {
	t.Parallel()
	d, err := dnstest.Start()
	require.NoError(t, err)
	t.Cleanup(d.Close)
	h, s := setupCloudflareHost(t, func(o *options) { o.dnsResolver = d.Addr },
		func(c *cfstandin.Config) { c.CustomHostnameReadsToActive = 4 })
	claim := h.putDomain(h.key, "shop.example.org", tokenA)
	require.Equal(t, http.StatusCreated, claim.status, "body: %s", claim.body)
	require.Contains(t, claim.json(t)["dnsRecords"], map[string]any{"type": "CNAME", "name": "shop.example.org", "value": cfSaaSTarget, "offeringId": "wfp-worker"})
	name, value := txtRecord(t, claim.json(t))
	d.SetTXT(name, value)
	h.advance("6 seconds")
	h.checkDomains()
	require.Equal(t, "verified", h.domainStatus(h.key, "shop.example.org"))

	w := h.putWorker("prod", "shop", workerToken, wfpWorkerBody("shop-v1"))
	require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)
	r := h.putReservation(h.key, "res-shop", tokenB, map[string]any{"space": "prod", "workerName": "shop", "hostname": "shop.example.org", "offeringId": "wfp-worker"})
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	require.NoError(t, s.Inject(cfstandin.Fault{Kind: cfstandin.FaultLostAnswer, Method: http.MethodPost, PathContains: "/custom_hostnames"}))
	var e reply
	require.Eventually(t, func() bool {
		e = h.putEndpoint("prod", "shop", endpointToken, map[string]any{"worker": "shop", "offeringId": "wfp-endpoint", "originReservationId": "res-shop"})
		return e.status == http.StatusCreated
	}, 30*time.Second, 200*time.Millisecond, "the endpoint is created once a retry reads the lost create back")
	require.Equal(t, "https://shop.example.org/", e.json(t)["url"])
	creates := 0
	for _, req := range s.Requests() {
		if req.Method == http.MethodPost && strings.Contains(req.Path, "/custom_hostnames") && req.Applied {
			creates++
		}
	}
	require.Equal(t, 1, creates, "a lost answer to the create makes no second custom hostname")
	require.Eventually(t, func() bool {
		return h.get("/v1/spaces/prod/worker-endpoints/shop").json(t)["ready"] == true
	}, 30*time.Second, 200*time.Millisecond, "Ready once the custom hostname is active")
	require.Equal(t, map[string]bool{"shop.example.org": true}, s.CustomHostnames())
	status, body := eventually(t, s, "https://shop.example.org/", func(_ int, body string) bool { return body == "shop-v1" })
	require.Equal(t, http.StatusOK, status, body)

	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "shop", endpointToken).status)
	require.Empty(t, s.CustomHostnames(), "the custom hostname goes with the endpoint")
}

// A claim's delete and a reservation created under it serialize (SPEC 3.7: deleting a claim is
// refused while a reservation names it): the reservation's transaction holds the claim it stands
// under FOR SHARE, so a delete that comes meanwhile waits, then sees the reservation and answers
// domain_in_use. Without the lock both would commit, leaving a held name with no claim.
func TestADomainDeleteWaitsForAReservationBeingCreatedUnderIt(t *testing.T) {
	t.Parallel()
	h, d := domainHarness(t)
	h.verifyDomain(d, h.key, "busy.example.com", tokenA)

	ctx := context.Background()
	tx, err := h.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	// What the reservation create runs first: the covering claim, locked.
	_, err = dbsqlc.New(tx).CustomDomainCoveringLocked(ctx, dbsqlc.CustomDomainCoveringLockedParams{
		OrganizationID: h.org.ID, Hostname: "busy.example.com", Wildcard: "*.example.com"})
	require.NoError(t, err)
	deleted := make(chan reply, 1)
	go func() {
		r, err := h.try(req{method: http.MethodDelete, path: domainsPath + "busy.example.com", key: h.key, token: tokenA})
		if err != nil {
			r = reply{body: []byte(err.Error())}
		}
		deleted <- r
	}()
	select {
	case r := <-deleted:
		t.Fatalf("the delete did not wait for the reservation's transaction: %d %s", r.status, r.body)
	case <-time.After(500 * time.Millisecond):
	}
	_, err = tx.Exec(ctx, `INSERT INTO worker_endpoint_origin_reservations (organization_id, id, uid, format, space, worker_name,
		subdomain, canonical_origin, ttl_seconds, status, expires_at, offering_id, offering_digest, pack, installation, hostname, custom_domain)
		VALUES ($1, 'res-busy', gen_random_uuid(), 'takoserver.worker-endpoint-origin-reservation.v2', 'prod', 'api', '',
		'https://busy.example.com', 86400, 'prepared', now() + interval '1 day', 'worker', 'd', 'selfhost', 'local', 'busy.example.com', 'busy.example.com')`, h.org.ID)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	r := <-deleted
	r.problem(t, http.StatusConflict, "domain_in_use")
	require.Equal(t, "verified", h.domainStatus(h.key, "busy.example.com"))
}

// The other order of the same race: a delete holding the claim (FOR UPDATE, as Delete takes it)
// holds back a reservation create under it, which then proceeds once the delete rolled back. So the
// create really takes the claim's lock, not only the query it runs.
func TestAReservationCreateWaitsForADomainDeleteInFlight(t *testing.T) {
	t.Parallel()
	h, d := domainHarness(t)
	h.verifyDomain(d, h.key, "held.example.com", tokenA)
	w := h.putWorker("prod", "api", workerToken, withOffering(workerBody(), "worker"))
	require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)

	ctx := context.Background()
	tx, err := h.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = dbsqlc.New(tx).CustomDomainLock(ctx, dbsqlc.CustomDomainLockParams{OrganizationID: h.org.ID, Hostname: "held.example.com"})
	require.NoError(t, err)
	created := make(chan reply, 1)
	go func() {
		r, err := h.try(req{method: http.MethodPut, path: resPath + "res-held", key: h.key, token: tokenB,
			body: map[string]any{"space": "prod", "workerName": "api", "hostname": "held.example.com", "offeringId": "worker"}})
		if err != nil {
			r = reply{body: []byte(err.Error())}
		}
		created <- r
	}()
	select {
	case r := <-created:
		t.Fatalf("the reservation create did not wait for the claim's lock: %d %s", r.status, r.body)
	case <-time.After(500 * time.Millisecond):
	}
	require.NoError(t, tx.Rollback(ctx))
	r := <-created
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
}
