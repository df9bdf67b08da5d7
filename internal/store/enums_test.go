package store_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/takoform/terraform-provider-takoform/api"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

// goEnums is every PostgreSQL enum of the migrations with the values sqlc generated Go constants
// for. A migration that adds, renames or drops a value (or a whole enum) without `make generate`,
// or a type added here without its enum, fails TestEveryEnumValueHasItsGoConstant.
var goEnums = map[string][]string{
	"attestation_status":         values(dbsqlc.AllAttestationStatusValues()),
	"cron_tick_outcome":          values(dbsqlc.AllCronTickOutcomeValues()),
	"custom_domain_status":       values(dbsqlc.AllCustomDomainStatusValues()),
	"deployment_status":          values(dbsqlc.AllDeploymentStatusValues()),
	"effect_action":              values(dbsqlc.AllEffectActionValues()),
	"effect_status":              values(dbsqlc.AllEffectStatusValues()),
	"late_write_status":          values(dbsqlc.AllLateWriteStatusValues()),
	"node_reconciliation_action": values(dbsqlc.AllNodeReconciliationActionValues()),
	"runtime_node_state":         values(dbsqlc.AllRuntimeNodeStateValues()),
	"operation_status":           values(dbsqlc.AllOperationStatusValues()),
	"reservation_status":         values(dbsqlc.AllReservationStatusValues()),
	"resource_kind":              values(dbsqlc.AllResourceKindValues()),
	"resource_status":            values(dbsqlc.AllResourceStatusValues()),
	"runtime_input_status":       values(dbsqlc.AllRuntimeInputStatusValues()),
	"sealing_key_status":         values(dbsqlc.AllSealingKeyStatusValues()),
}

func values[S ~string](all []S) []string {
	out := make([]string, len(all))
	for i, v := range all {
		out[i] = string(v)
	}
	return out
}

// TestEveryEnumValueHasItsGoConstant reads the enums of a database the migrations built and holds
// them to the Go constants: the same types, and each with the same values in the same order.
func TestEveryEnumValueHasItsGoConstant(t *testing.T) {
	t.Parallel()
	rows, err := testdb.Pool(t).Query(context.Background(), `
		SELECT t.typname, array_agg(e.enumlabel::text ORDER BY e.enumsortorder)
		FROM pg_type t JOIN pg_enum e ON e.enumtypid = t.oid
		WHERE t.typnamespace = 'public'::regnamespace
		GROUP BY t.typname`)
	require.NoError(t, err)
	inDB := map[string][]string{}
	for rows.Next() {
		var name string
		var labels []string
		require.NoError(t, rows.Scan(&name, &labels))
		inDB[name] = labels
	}
	require.NoError(t, rows.Err())
	require.Equal(t, slices.Sorted(maps.Keys(goEnums)), slices.Sorted(maps.Keys(inDB)),
		"the migrations' enums and the Go constants name the same types (run make generate; list a new enum in goEnums)")
	for name, labels := range inDB {
		require.Equal(t, labels, goEnums[name], "enum %s: the migrations' values and the Go constants differ (run make generate)", name)
	}
}

// TestMigration16CarriesTheEndpointKindBothWays: the rows an endpoint left say worker-endpoint on
// the enum, endpoint on the text column migration 15 had, and worker-endpoint again after up.
func TestMigration16CarriesTheEndpointKindBothWays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t)
	db, err := store.OpenSQL(url)
	require.NoError(t, err)
	defer db.Close()
	_, err = db.ExecContext(ctx, `INSERT INTO organizations (id, name) VALUES ('org_aaaaaaaa', 'a')`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO deletion_attestations (uid, organization_id, resource_kind, status, closed_at)
		VALUES (gen_random_uuid(), 'org_aaaaaaaa', 'worker-endpoint', 'open', NULL), (gen_random_uuid(), 'org_aaaaaaaa', 'worker', 'closed', now())`)
	require.NoError(t, err)
	kinds := func() []string {
		rows, err := db.QueryContext(ctx, `SELECT resource_kind::text || '/' || pg_typeof(resource_kind)::text FROM deletion_attestations ORDER BY 1`)
		require.NoError(t, err)
		defer rows.Close()
		var out []string
		for rows.Next() {
			var s string
			require.NoError(t, rows.Scan(&s))
			out = append(out, s)
		}
		require.NoError(t, rows.Err())
		return out
	}
	require.Equal(t, []string{"worker-endpoint/resource_kind", "worker/resource_kind"}, kinds())
	m, err := store.Migrator(db)
	require.NoError(t, err)
	defer m.Close()
	require.NoError(t, m.Migrate(15))
	require.Equal(t, []string{"endpoint/text", "worker/text"}, kinds())
	require.NoError(t, m.Up())
	require.Equal(t, []string{"worker-endpoint/resource_kind", "worker/resource_kind"}, kinds())
}

// TestTheAPIListsEveryValueAStatusColumnHolds: each wire field that carries an enum column's value
// lists every value of that enum in api/openapi.yaml (it may list more, computed by the Host), so a
// client generated from the document can read whatever the Host answers.
func TestTheAPIListsEveryValueAStatusColumnHolds(t *testing.T) {
	t.Parallel()
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Enum []string `yaml:"enum"`
				} `yaml:"properties"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	require.NoError(t, yaml.Unmarshal(api.OpenAPI, &doc))
	for field, enum := range map[string]string{
		"Effect.status":            "effect_status",
		"Effect.action":            "effect_action",
		"Operation.status":         "operation_status",
		"Attestation.status":       "attestation_status",
		"Attestation.resourceKind": "resource_kind",
		"Reservation.status":       "reservation_status",
		"Preparation.status":       "runtime_input_status",
	} {
		schema, property, _ := strings.Cut(field, ".")
		listed := doc.Components.Schemas[schema].Properties[property].Enum
		require.NotEmpty(t, listed, "%s lists its values", field)
		for _, v := range goEnums[enum] {
			require.Contains(t, listed, v, "%s lists %s's value %q", field, enum, v)
		}
	}
}
