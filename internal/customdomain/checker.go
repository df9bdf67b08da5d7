package customdomain

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// checkLease is how long a claim taken for a check is kept from other replicas' checkers: longer
// than a lookup can take, so that a name is looked up once per turn across replicas.
const checkLease = time.Minute

// DB is what the checker works through: a pool.
type DB interface {
	store.Beginner
	dbsqlc.DBTX
}

// CheckDue looks up to max claims whose next check is due up, and records each outcome (SPEC 3.7:
// pending ones with backoff, verified ones daily). Claims are taken in one statement that moves
// their next check on, so that replicas running this at once look each name up once. It returns
// how many it checked.
func (s *Service) CheckDue(ctx context.Context, db DB, max int) (int, error) {
	// The lease outlasts the whole batch, each lookup taking up to the resolver's timeout.
	lease := checkLease + time.Duration(max)*s.Resolver.timeout()
	rows, err := dbsqlc.New(db).CustomDomainsDue(ctx, dbsqlc.CustomDomainsDueParams{MaxClaims: int32(max), LeaseSeconds: lease.Seconds()})
	if err != nil {
		return 0, fmt.Errorf("custom domain: claims due: %w", err)
	}
	var errs []error
	for _, due := range rows {
		n := nameOf(due.Hostname)
		l := s.lookUp(ctx, auth.Organization{ID: due.OrganizationID}, n)
		if err := s.record(ctx, db, due, l); err != nil {
			errs = append(errs, err)
		}
	}
	return len(rows), errors.Join(errs...)
}

// errVerifiedMeanwhile ends a record whose claim another organization verified in the same
// instant: its transaction is rolled back, and the next look says so.
var errVerifiedMeanwhile = errors.New("custom domain: verified by another organization meanwhile")

// record writes one lookup's outcome on the claim it was made for, unless the claim changed
// meanwhile (deleted and claimed again, or decided by its owner's PUT).
func (s *Service) record(ctx context.Context, db store.Beginner, due dbsqlc.CustomDomainsDueRow, l look) error {
	err := store.WithTx(ctx, db, func(tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		row, err := q.CustomDomainLock(ctx, dbsqlc.CustomDomainLockParams{OrganizationID: due.OrganizationID, Hostname: due.Hostname})
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("custom domain: record a check: %w", err)
		}
		if row.UID != due.UID || row.Checks != due.Checks || row.Status != due.Status {
			return nil
		}
		c := transition(row, l, due.PendingExpired)
		if c.status == dbsqlc.CustomDomainStatusVerified && row.Status != dbsqlc.CustomDomainStatusVerified {
			taken, err := q.CustomDomainVerifiedElsewhere(ctx, dbsqlc.CustomDomainVerifiedElsewhereParams{OrganizationID: row.OrganizationID, Hostname: row.Hostname})
			if err != nil {
				return fmt.Errorf("custom domain: record a check: %w", err)
			}
			if taken {
				// The first organization to verify holds the name: this claim waits, and fails
				// after its week unless that one lets the name go.
				c = transition(row, look{Absent, "the record is there, but another organization verified this name first"}, due.PendingExpired)
			}
		}
		if _, err := q.CustomDomainSetState(ctx, c.params(row)); err != nil {
			if store.IsUniqueViolation(err, "custom_domains_verified_key") {
				return errVerifiedMeanwhile
			}
			return fmt.Errorf("custom domain: record a check: %w", err)
		}
		return nil
	})
	if errors.Is(err, errVerifiedMeanwhile) {
		return nil
	}
	return err
}
