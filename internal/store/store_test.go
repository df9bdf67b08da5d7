package store_test

import (
	"context"
	"regexp"
	"sort"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

var namedParam = regexp.MustCompile(`@([a-z_]+)`)

// TestEveryQueryPrepares parses and plans every named query against the migrated schema, so a
// typo or a type mismatch fails here instead of in a request.
func TestEveryQueryPrepares(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	names := store.QueryNames()
	sort.Strings(names)
	require.NotEmpty(t, names)
	for _, name := range names {
		sql := store.Q(name)
		// Rewrite @name parameters the way pgx.NamedArgs does: one $n per distinct name.
		index := map[string]int{}
		rewritten := namedParam.ReplaceAllStringFunc(sql, func(m string) string {
			key := m[1:]
			if _, ok := index[key]; !ok {
				index[key] = len(index) + 1
			}
			return "$" + strconv.Itoa(index[key])
		})
		_, err := conn.Conn().Prepare(ctx, name, rewritten)
		require.NoError(t, err, "query %s", name)
	}
}
