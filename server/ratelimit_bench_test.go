package server_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

// BenchmarkRateBucket measures what the choice in ratelimit.go weighs: the database work of an
// authenticated request (its key looked up, as on a key-cache miss) against the same plus a token
// bucket kept in PostgreSQL (one UPDATE per request, each its own commit), from one client and
// from many clients of one key at once. The test cluster runs without fsync, which hides the WAL
// flush at each commit: point TAKOFORM_TEST_DATABASE_URL at a PostgreSQL with its default
// durability and run
// go test -run '^$' -bench BenchmarkRateBucket -benchtime 2000x ./server/
func BenchmarkRateBucket(b *testing.B) {
	ctx := context.Background()
	for _, bench := range []struct {
		name   string
		bucket bool
	}{{"authenticate", false}, {"authenticate+postgres-bucket", true}} {
		b.Run(bench.name, func(b *testing.B) {
			db, err := pgxpool.New(ctx, testdb.URL(b))
			require.NoError(b, err)
			defer db.Close()
			_, err = auth.CreateOrganization(ctx, db, "acme")
			require.NoError(b, err)
			key, err := auth.CreateKey(ctx, db, "acme", nil)
			require.NoError(b, err)
			_, err = db.Exec(ctx, `CREATE TABLE key_buckets (key_id text PRIMARY KEY, tokens float8 NOT NULL, at timestamptz NOT NULL)`)
			require.NoError(b, err)
			_, err = db.Exec(ctx, `INSERT INTO key_buckets VALUES ($1, 200, clock_timestamp())`, key.ID)
			require.NoError(b, err)
			request := func() error {
				p, err := auth.Authenticate(ctx, db, key.Key)
				if err != nil || !bench.bucket {
					return err
				}
				// The refill and the spend in one statement, as a shared bucket would do it.
				_, err = db.Exec(ctx, `UPDATE key_buckets
					SET tokens = least(200, tokens + extract(epoch FROM clock_timestamp() - at) * 1e9) - 1, at = clock_timestamp()
					WHERE key_id = $1`, p.KeyID)
				return err
			}
			b.Run("serial", func(b *testing.B) {
				for b.Loop() {
					if err := request(); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("parallel", func(b *testing.B) {
				b.SetParallelism(8)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := request(); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		})
	}
}
