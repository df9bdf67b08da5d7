// Package quota enforces the per-organization ceilings of SPEC 5.1: how many workers, endpoints,
// live reservations and pending runtime inputs one organization may hold. The defaults come from
// the catalog; an operator overrides them per organization (takoserver orgs quota).
//
// The ceiling holds in the database, across any number of Host replicas. A create takes one of its
// organization's 16 slots of the resource (a transaction-level advisory lock) and inserts in the
// same transaction, so at most 16 creates of one organization and resource are in flight. Far
// below the ceiling the step decides on counters that the tables' row triggers keep (migration
// 18): what the organization holds, summed from a few shards, whatever it holds; with fewer than
// 32 to spare it counts its rows, and near the ceiling it takes all 16 slots first, so the count
// is exact and two creates at ceiling-1 never both pass. Deletes take no slot: a create that
// counts before a delete commits refuses, which errs on the safe side.
package quota

import (
	"context"
	"fmt"
	"slices"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// Resource is what a ceiling bounds.
type Resource string

// The resources a ceiling bounds, as stored in organization_quotas.
const (
	Endpoints     Resource = "endpoints"
	Reservations  Resource = "reservations"
	RuntimeInputs Resource = "runtime_inputs"
	Workers       Resource = "workers"
	// CustomDomains are an organization's custom-domain claims (SPEC 3.7). They have no counter
	// shards: a claim's create counts them under a lock of the organization's own.
	CustomDomains Resource = "custom_domains"
)

// Resources lists every resource the quota step counts with counter shards, in lock order.
var Resources = []Resource{Endpoints, Reservations, RuntimeInputs, Workers}

// Overridable lists every resource an organization's ceiling may be overridden for.
var Overridable = append(slices.Clone(Resources), CustomDomains)

// Name is r as the API, the config file's "quotas" and the admin command's JSON spell it.
func (r Resource) Name() string {
	switch r {
	case RuntimeInputs:
		return "runtimeInputs"
	case CustomDomains:
		return "customDomains"
	}
	return string(r)
}

// MarshalText writes r's Name.
func (r Resource) MarshalText() ([]byte, error) { return []byte(r.Name()), nil }

// noun names r in a sentence.
func (r Resource) noun() string {
	switch r {
	case RuntimeInputs:
		return "pending runtime inputs"
	case Reservations:
		return "live reservations"
	}
	return string(r)
}

// Ceilings are the ceilings of one organization, or the catalog's defaults.
type Ceilings struct {
	Workers       int
	Endpoints     int
	Reservations  int
	RuntimeInputs int
	CustomDomains int
}

// Built-in defaults. A worker is a process on a runtime node (its memory, and its organization's
// share of CPU), so the worker ceiling bounds what one organization takes of a node; an endpoint
// needs a worker; each endpoint holds a reservation (minted or supplied) and a
// replacement briefly holds two, hence twice as many reservations; a runtime input is pending only
// between its PUT and its worker's apply.
const (
	DefaultWorkers       = 100
	DefaultEndpoints     = 100
	DefaultReservations  = 200
	DefaultRuntimeInputs = 100
	DefaultCustomDomains = 20
	// MaxCeiling bounds any ceiling (the column's check says the same).
	MaxCeiling = 1_000_000
)

// Defaults are the built-in defaults, used where the catalog sets none.
func Defaults() Ceilings {
	return Ceilings{Workers: DefaultWorkers, Endpoints: DefaultEndpoints, Reservations: DefaultReservations, RuntimeInputs: DefaultRuntimeInputs,
		CustomDomains: DefaultCustomDomains}
}

// Of returns the ceiling of r.
func (c Ceilings) Of(r Resource) int {
	switch r {
	case Workers:
		return c.Workers
	case Endpoints:
		return c.Endpoints
	case Reservations:
		return c.Reservations
	case RuntimeInputs:
		return c.RuntimeInputs
	case CustomDomains:
		return c.CustomDomains
	}
	panic("quota: unknown resource " + string(r))
}

func held(u dbsqlc.QuotaUsageRow, r Resource) int64 {
	switch r {
	case Workers:
		return u.Workers
	case Endpoints:
		return u.Endpoints
	case Reservations:
		return u.Reservations
	case RuntimeInputs:
		return u.RuntimeInputs
	}
	panic("quota: unknown resource " + string(r))
}

// Hold locks the organization's quota rows of rs for the rest of tx without counting. A create
// that may bound several resources (an endpoint that mints its reservation) takes them all first,
// before any other row lock, so that creates never wait on each other in two orders.
func Hold(ctx context.Context, tx dbsqlc.DBTX, org string, rs ...Resource) error {
	_, err := lock(ctx, tx, org, rs)
	return err
}

func lock(ctx context.Context, tx dbsqlc.DBTX, org string, rs []Resource) ([]dbsqlc.QuotaLockRow, error) {
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = string(r)
	}
	slices.Sort(names)
	rows, err := dbsqlc.New(tx).QuotaLock(ctx, dbsqlc.QuotaLockParams{OrganizationID: org, Resources: slices.Compact(names)})
	if err != nil {
		return nil, fmt.Errorf("quota: lock: %w", err)
	}
	return rows, nil
}

// Check is the quota step of a create of one r, in one statement: it takes one of the
// organization's slots of r (all of them when the count comes near the ceiling, so that the count
// is then exact), counts what the organization holds of r once they are granted, and refuses with
// quota_exceeded, naming the ceiling, its value and the count, when one more would pass the
// ceiling. Creates far below the ceiling take different slots and do not wait for each other. The
// caller inserts in the same transaction; a refusal ends it, so nothing of the create is left.
func Check(ctx context.Context, tx dbsqlc.DBTX, defaults Ceilings, org string, r Resource) error {
	row, err := dbsqlc.New(tx).QuotaCheck(ctx, dbsqlc.QuotaCheckParams{OrganizationID: org, Resource: string(r), DefaultCeiling: int32(defaults.Of(r))})
	if err != nil {
		return fmt.Errorf("quota: check: %w", err)
	}
	if row.Used >= int64(row.Ceiling) {
		return Exceeded(r, int(row.Ceiling), row.Used)
	}
	return nil
}

// Exceeded is the refusal of a create past the ceiling of r: 429 quota_exceeded, with a quota
// member naming the ceiling, its value and how many the organization holds.
func Exceeded(r Resource, ceiling int, n int64) *apierr.Error {
	return apierr.New(apierr.QuotaExceeded, "the organization holds %d %s and its ceiling is %d: delete one, or ask an operator to raise it (takoserver orgs quota)", n, r.noun(), ceiling).
		With("quota", map[string]any{"resource": r.Name(), "ceiling": ceiling, "used": n})
}

// Usage is one resource's ceiling for an organization and what it holds.
type Usage struct {
	Resource Resource `json:"resource"`
	Ceiling  int      `json:"ceiling"`
	// Override is true when an operator set the ceiling for this organization, false when it is
	// the catalog's default.
	Override bool  `json:"override"`
	Used     int64 `json:"used"`
}

// Report returns the organization's effective ceilings (its overrides, else defaults) and what it
// holds of each resource, taking no lock.
func Report(ctx context.Context, db dbsqlc.DBTX, defaults Ceilings, org string) ([]Usage, error) {
	q := dbsqlc.New(db)
	overrides, err := q.QuotaOverrides(ctx, org)
	if err != nil {
		return nil, fmt.Errorf("quota: overrides: %w", err)
	}
	usage, err := q.QuotaUsage(ctx, org)
	if err != nil {
		return nil, fmt.Errorf("quota: count: %w", err)
	}
	domains, err := q.CustomDomainsHeld(ctx, org)
	if err != nil {
		return nil, fmt.Errorf("quota: count: %w", err)
	}
	out := make([]Usage, 0, len(Overridable))
	for _, r := range Overridable {
		u := Usage{Resource: r, Used: int64(domains)}
		if r != CustomDomains {
			u.Used = held(usage, r)
		}
		u.Ceiling, u.Override = overridden(overrides, r, defaults.Of(r))
		out = append(out, u)
	}
	return out, nil
}

// Ceiling is the organization's ceiling of r: its override, else the default given.
func Ceiling(ctx context.Context, db dbsqlc.DBTX, org string, r Resource, byDefault int) (int, error) {
	overrides, err := dbsqlc.New(db).QuotaOverrides(ctx, org)
	if err != nil {
		return 0, fmt.Errorf("quota: overrides: %w", err)
	}
	ceiling, _ := overridden(overrides, r, byDefault)
	return ceiling, nil
}

// overridden is the ceiling of r the overrides set, and whether they set one, else byDefault.
func overridden(overrides []dbsqlc.QuotaOverridesRow, r Resource, byDefault int) (int, bool) {
	for _, o := range overrides {
		if o.Resource == string(r) && o.Ceiling != nil {
			return int(*o.Ceiling), true
		}
	}
	return byDefault, false
}

// Set overrides the organization's ceiling of r, or with nil returns it to the catalog's default.
// A ceiling below what the organization holds leaves everything standing and refuses creates
// until it holds less.
func Set(ctx context.Context, db dbsqlc.DBTX, org string, r Resource, ceiling *int) error {
	if !slices.Contains(Overridable, r) {
		return fmt.Errorf("quota: unknown resource %q", r)
	}
	var c *int32
	if ceiling != nil {
		if *ceiling < 0 || *ceiling > MaxCeiling {
			return fmt.Errorf("a ceiling must be between 0 and %d", MaxCeiling)
		}
		v := int32(*ceiling)
		c = &v
	}
	if err := dbsqlc.New(db).QuotaSet(ctx, dbsqlc.QuotaSetParams{OrganizationID: org, Resource: string(r), Ceiling: c}); err != nil {
		return fmt.Errorf("quota: set: %w", err)
	}
	return nil
}

// CheckScripts is the script-ceiling step of a worker create on a Cloudflare installation (SPEC
// 8): an account (or dispatch namespace) holds at most ceiling scripts across every organization
// the installation is sold to. It takes one of the installation's slots (all of them near the
// ceiling, so that the count is then exact across Host replicas), counts the installation's
// workers that may hold a script, and refuses with 429 quota_exceeded at the ceiling. The
// refusal names the installation and its ceiling, never another organization's workers.
func CheckScripts(ctx context.Context, tx dbsqlc.DBTX, installation string, ceiling int) error {
	used, err := dbsqlc.New(tx).InstallationScriptCheck(ctx, dbsqlc.InstallationScriptCheckParams{Installation: installation, Ceiling: int32(ceiling)})
	if err != nil {
		return fmt.Errorf("quota: scripts: %w", err)
	}
	if used >= int64(ceiling) {
		return apierr.New(apierr.QuotaExceeded, "installation %s holds its ceiling of %d scripts across every organization it serves: no new worker fits on it until one is deleted; ask an operator for another offering", installation, ceiling).
			With("quota", map[string]any{"resource": "installationScripts", "ceiling": ceiling})
	}
	return nil
}

// Drift is an organization's resource whose counter shards (what the quota step reads far below
// the ceiling) do not sum to what its rows' statuses say it holds.
type Drift struct {
	OrganizationID string   `json:"organizationId"`
	Resource       Resource `json:"resource"`
	// Counters is what the counter shards sum to, Rows what the rows' statuses say it holds.
	Counters int64 `json:"counters"`
	Rows     int64 `json:"rows"`
}

// CheckCounters returns every drift between the counters and the rows, read under one snapshot:
// none, as long as every write goes through the tables' row triggers (migration 18).
func CheckCounters(ctx context.Context, db dbsqlc.DBTX) ([]Drift, error) {
	rows, err := dbsqlc.New(db).QuotaUsageDrift(ctx)
	if err != nil {
		return nil, fmt.Errorf("quota: check the counters: %w", err)
	}
	out := make([]Drift, len(rows))
	for i, r := range rows {
		out[i] = Drift{OrganizationID: r.OrganizationID, Resource: Resource(r.Resource), Counters: r.Counted, Rows: r.Held}
	}
	return out, nil
}

// Recount makes every organization's counters again from its rows, holding writers of the four
// tables off while it runs (an operator's repair, takoserver orgs counters --recount), and
// returns how many counter rows it wrote.
func Recount(ctx context.Context, db dbsqlc.DBTX) (int64, error) {
	n, err := dbsqlc.New(db).QuotaUsageRecount(ctx)
	if err != nil {
		return 0, fmt.Errorf("quota: recount the counters: %w", err)
	}
	return n, nil
}
