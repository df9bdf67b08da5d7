package customdomain

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/api/apitypes"
	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/quota"
	"github.com/takoform/terraform-provider-takoform/internal/sealing"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
	"github.com/takoform/terraform-provider-takoform/internal/wire"
)

// Timings of SPEC 3.7: a pending claim is looked at again with backoff and fails after a week
// unverified; a verified one is looked at daily and revoked after seven absent looks in a row.
const (
	PendingFor          = 7 * 24 * time.Hour
	VerifiedEvery       = 24 * time.Hour
	AbsentChecksRevoke  = 7
	firstPendingBackoff = 5 * time.Second
	maxPendingBackoff   = 10 * time.Minute
	// unknownRetry is how soon a verified claim is looked at again after the resolver failed.
	unknownRetry = time.Hour
)

// Request is the body of PUT /v1/custom-domains/{hostname}: nothing (the hostname is the path's).
type Request struct{}

// Service reads and changes custom domain claims.
type Service struct {
	Catalog  *catalog.Catalog
	Ring     *sealing.Ring
	Resolver *Resolver
}

// Domain is one stored claim.
type Domain struct {
	dbsqlc.CustomDomain
}

// Projection is the public view of a claim.
type Projection = apitypes.CustomDomain

// Project renders d for org with its ownership token ("" on a delete's answer).
func (s *Service) Project(org auth.Organization, d Domain, token string) Projection {
	n := nameOf(d.Hostname)
	p := Projection{Hostname: d.Hostname, Status: string(d.Status), Revision: d.Revision,
		DNSRecords: []apitypes.DNSRecord{{Type: "TXT", Name: n.ChallengeName(), Value: s.Ring.DomainChallenge(org.ID, d.Hostname)}},
		Conditions: []apitypes.DomainCondition{}}
	for _, o := range s.Catalog.Visible(catalog.Organization{ID: org.ID, Name: org.Name}) {
		if o.CustomDomains == nil {
			continue
		}
		typ, value := o.CustomDomains.RoutingRecord()
		id := o.ID
		p.DNSRecords = append(p.DNSRecords, apitypes.DNSRecord{Type: typ, Name: d.Hostname, Value: value, OfferingID: &id})
	}
	if d.VerifiedAt != nil {
		v := d.VerifiedAt.UTC().Format(time.RFC3339)
		p.VerifiedAt = &v
	}
	if d.Message != "" {
		c := apitypes.DomainCondition{Type: "LastCheck", Message: d.Message}
		if d.CheckedAt != nil {
			at := d.CheckedAt.UTC().Format(time.RFC3339)
			c.CheckedAt = &at
		}
		if d.Status == dbsqlc.CustomDomainStatusPending || d.Status == dbsqlc.CustomDomainStatusVerified {
			next := d.NextCheckAt.UTC().Format(time.RFC3339)
			c.NextCheckAt = &next
		}
		p.Conditions = append(p.Conditions, c)
	}
	if token != "" {
		p.OwnershipToken = &token
	}
	return p
}

// nameOf splits a stored hostname (checked when it was claimed).
func nameOf(hostname string) Name {
	base, wildcard := strings.CutPrefix(hostname, "*.")
	return Name{Hostname: hostname, Base: base, Wildcard: wildcard}
}

// Available refuses a Host without a sealing key: the TXT value is made under a sealed secret.
func (s *Service) Available() error {
	if s == nil || s.Ring == nil {
		return apierr.New(apierr.NotImplemented, "custom domains need the Host's sealing key (serve --sealing-key-file): their DNS challenge is made under a sealed secret")
	}
	return nil
}

// Get reads one claim of the organization with its owning token, taking no lock and writing
// nothing.
func (s *Service) Get(ctx context.Context, db dbsqlc.DBTX, org auth.Organization, hostname string) (Domain, string, error) {
	row, err := dbsqlc.New(db).CustomDomainRead(ctx, dbsqlc.CustomDomainReadParams{OrganizationID: org.ID, Hostname: hostname})
	if errors.Is(err, pgx.ErrNoRows) {
		return Domain{}, "", apierr.New(apierr.NotFound, "no custom domain %q", hostname)
	}
	if err != nil {
		return Domain{}, "", fmt.Errorf("custom domain: get: %w", err)
	}
	return Domain{row.CustomDomain}, row.OwnershipToken, nil
}

// look is one lookup of a claim's record, with what it found in words.
type look struct {
	outcome Outcome
	message string
}

func (s *Service) lookUp(ctx context.Context, org auth.Organization, n Name) look {
	o, msg := s.Resolver.Check(ctx, n.ChallengeName(), s.Ring.DomainChallenge(org.ID, n.Hostname))
	return look{o, msg}
}

// Put claims hostname for the organization, or answers its owner's changed request with the claim
// looked up again. The record is looked up first, outside any transaction (a slow resolver holds
// no row), and the claim is created verified when it is there and nobody else verified the name.
func (s *Service) Put(ctx context.Context, m *ownership.Mutation, org auth.Organization, n Name, token string) (ownership.Response, error) {
	l := s.lookUp(ctx, org, n)
	return ownership.CommitObject(ctx, m,
		func(tx pgx.Tx) (Domain, error) { return s.create(ctx, tx, org, n, l) },
		func(tx pgx.Tx) (Domain, error) { return s.recheck(ctx, tx, m, org, n, l) },
		func(d Domain, created bool) ownership.Response {
			return ownership.Answer(created, wire.JSON(s.Project(org, d, token)), d.UID)
		})
}

func (s *Service) create(ctx context.Context, tx pgx.Tx, org auth.Organization, n Name, l look) (Domain, error) {
	q := dbsqlc.New(tx)
	taken, err := q.CustomDomainVerifiedElsewhere(ctx, dbsqlc.CustomDomainVerifiedElsewhereParams{OrganizationID: org.ID, Hostname: n.Hostname})
	if err != nil {
		return Domain{}, fmt.Errorf("custom domain: create: %w", err)
	}
	if taken {
		return Domain{}, errTaken(n.Hostname)
	}
	held, err := q.CustomDomainCountLocked(ctx, org.ID)
	if err != nil {
		return Domain{}, fmt.Errorf("custom domain: create: %w", err)
	}
	ceiling, err := quota.Ceiling(ctx, tx, org.ID, quota.CustomDomains, s.Catalog.Quotas.CustomDomains)
	if err != nil {
		return Domain{}, fmt.Errorf("custom domain: create: %w", err)
	}
	if int(held) >= ceiling {
		return Domain{}, apierr.New(apierr.QuotaExceeded, "the organization holds %d custom domains and its ceiling is %d: delete one, or ask an operator to raise it (takoserver orgs quota --custom-domains)", held, ceiling).
			With("quota", map[string]any{"resource": "customDomains", "ceiling": ceiling, "used": held})
	}
	status, next := dbsqlc.CustomDomainStatusPending, firstPendingBackoff
	if l.outcome == Present {
		status, next = dbsqlc.CustomDomainStatusVerified, VerifiedEvery
	}
	row, err := q.CustomDomainCreate(ctx, dbsqlc.CustomDomainCreateParams{
		OrganizationID: org.ID, Hostname: n.Hostname, UID: uuid.Must(uuid.NewV7()), Status: status, Message: l.message,
		NextCheckSeconds: next.Seconds(), PendingSeconds: PendingFor.Seconds(),
	})
	switch {
	case store.IsUniqueViolation(err, "custom_domains_verified_key"):
		return Domain{}, errTaken(n.Hostname)
	case errors.Is(err, pgx.ErrNoRows):
		return Domain{}, apierr.New(apierr.OwnershipConflict, "custom domain %q is already claimed by this organization under another ownership token", n.Hostname)
	case err != nil:
		return Domain{}, fmt.Errorf("custom domain: create: %w", err)
	}
	return Domain{row}, nil
}

func errTaken(hostname string) error {
	return apierr.New(apierr.DomainTaken, "custom domain %q is verified by another organization; a name has one holder at a time", hostname)
}

// recheck answers the owner's changed request: the claim, with the lookup made for it recorded
// when the claim is still waiting for one (pending, or failed after a week unverified).
func (s *Service) recheck(ctx context.Context, tx pgx.Tx, m *ownership.Mutation, org auth.Organization, n Name, l look) (Domain, error) {
	q := dbsqlc.New(tx)
	row, err := q.CustomDomainLock(ctx, dbsqlc.CustomDomainLockParams{OrganizationID: org.ID, Hostname: n.Hostname})
	if errors.Is(err, pgx.ErrNoRows) {
		return Domain{}, apierr.New(apierr.NotFound, "no custom domain %q", n.Hostname)
	}
	if err != nil {
		return Domain{}, fmt.Errorf("custom domain: recheck: %w", err)
	}
	if err := m.CheckRevision(row.Revision); err != nil {
		return Domain{}, err
	}
	if row.Status != dbsqlc.CustomDomainStatusPending && row.Status != dbsqlc.CustomDomainStatusFailed {
		return Domain{row}, nil
	}
	if l.outcome == Present {
		taken, err := q.CustomDomainVerifiedElsewhere(ctx, dbsqlc.CustomDomainVerifiedElsewhereParams{OrganizationID: org.ID, Hostname: n.Hostname})
		if err != nil {
			return Domain{}, fmt.Errorf("custom domain: recheck: %w", err)
		}
		if taken {
			return Domain{}, errTaken(n.Hostname)
		}
	}
	next := transition(row, l, false)
	row, err = q.CustomDomainSetState(ctx, next.params(row))
	if store.IsUniqueViolation(err, "custom_domains_verified_key") {
		return Domain{}, errTaken(n.Hostname)
	}
	if err != nil {
		return Domain{}, fmt.Errorf("custom domain: recheck: %w", err)
	}
	return Domain{row}, nil
}

// change is a claim's next state after one lookup.
type change struct {
	status  dbsqlc.CustomDomainStatus
	message string
	absent  int32
	next    time.Duration
}

func (c change) params(row dbsqlc.CustomDomain) dbsqlc.CustomDomainSetStateParams {
	return dbsqlc.CustomDomainSetStateParams{OrganizationID: row.OrganizationID, Hostname: row.Hostname, UID: row.UID,
		Status: c.status, Message: c.message, AbsentInARow: c.absent, NextCheckSeconds: c.next.Seconds()}
}

// transition is SPEC 3.7's rule for one lookup of a claim: pending becomes verified when the
// record is there, and failed when a week passed without; verified stays so while the record is
// there, and is revoked on the seventh absent lookup in a row (a resolver error counts for
// nothing either way). expired says the claim's week of pending is over.
func transition(row dbsqlc.CustomDomain, l look, expired bool) change {
	c := change{status: row.Status, message: l.message, absent: row.AbsentInARow}
	switch row.Status {
	case dbsqlc.CustomDomainStatusPending, dbsqlc.CustomDomainStatusFailed:
		switch {
		case l.outcome == Present:
			c.status, c.absent, c.next = dbsqlc.CustomDomainStatusVerified, 0, VerifiedEvery
		case expired || row.Status == dbsqlc.CustomDomainStatusFailed:
			c.status = dbsqlc.CustomDomainStatusFailed
			if expired {
				c.message = "not verified within 7 days; the last lookup: " + l.message + ". Publish the record, then delete the claim and claim it again (OpenTofu replaces a failed takoform_custom_domain by itself)"
			}
		default:
			c.next = min(maxPendingBackoff, firstPendingBackoff<<min(row.Checks, 16))
		}
	case dbsqlc.CustomDomainStatusVerified:
		switch l.outcome {
		case Present:
			c.absent, c.next = 0, VerifiedEvery
		case Absent:
			c.absent, c.next = row.AbsentInARow+1, VerifiedEvery
			if c.absent >= AbsentChecksRevoke {
				c.status = dbsqlc.CustomDomainStatusRevoked
				c.message = fmt.Sprintf("revoked: the record was absent on %d daily lookups in a row (the last: %s); nothing new is served on it", c.absent, l.message)
			} else {
				c.message = fmt.Sprintf("%s (absent on %d lookup(s) in a row; revoked at %d)", l.message, c.absent, AbsentChecksRevoke)
			}
		default:
			c.next = unknownRetry
		}
	}
	return c
}

// Delete lets the organization's claim go, refused while a reservation that still holds its origin
// names it (409 domain_in_use).
func (s *Service) Delete(ctx context.Context, m *ownership.Mutation, org auth.Organization, hostname string) (ownership.Response, error) {
	return m.Commit(ctx, func(tx pgx.Tx) (ownership.Response, error) {
		q := dbsqlc.New(tx)
		row, err := q.CustomDomainLock(ctx, dbsqlc.CustomDomainLockParams{OrganizationID: org.ID, Hostname: hostname})
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && row.UID != m.Current.UID) {
			return ownership.Response{}, apierr.New(apierr.NotFound, "no custom domain %q", hostname)
		}
		if err != nil {
			return ownership.Response{}, fmt.Errorf("custom domain: delete: %w", err)
		}
		if err := m.CheckRevision(row.Revision); err != nil {
			return ownership.Response{}, err
		}
		inUse, err := q.CustomDomainInUse(ctx, dbsqlc.CustomDomainInUseParams{OrganizationID: org.ID, Hostname: &hostname})
		if err != nil {
			return ownership.Response{}, fmt.Errorf("custom domain: delete: %w", err)
		}
		if inUse {
			return ownership.Response{}, apierr.New(apierr.DomainInUse, "a reservation of this organization holds an origin on custom domain %q; release it first (destroy the endpoint that uses it, then its reservation)", hostname)
		}
		if _, err := q.CustomDomainDelete(ctx, dbsqlc.CustomDomainDeleteParams{OrganizationID: org.ID, Hostname: hostname, UID: row.UID}); err != nil {
			return ownership.Response{}, fmt.Errorf("custom domain: delete: %w", err)
		}
		return ownership.Answer(false, wire.JSON(s.Project(org, Domain{row}, "")), row.UID), nil
	})
}
