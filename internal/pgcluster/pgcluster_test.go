package pgcluster

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestClusterStartsStopsAndIsReused(t *testing.T) {
	if _, err := BinDir(); err != nil && os.Getenv("CI") == "" {
		t.Skip(err)
	}
	ctx := context.Background()
	base, err := os.MkdirTemp("", "tkpg-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(base, 0o755))
	t.Cleanup(func() { os.RemoveAll(base) })
	dir := filepath.Join(base, "c")

	c, err := Open(ctx, dir, Options{})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx, "app"))
	t.Cleanup(func() { _ = c.Stop(context.Background()) })

	conn, err := pgx.Connect(ctx, c.URL("app"))
	require.NoError(t, err)
	require.NoError(t, conn.Ping(ctx))
	conn.Close(ctx)

	// A second Open of the same directory reuses the data directory, and Start on a running
	// cluster is a no-op.
	again, err := Open(ctx, dir, Options{})
	require.NoError(t, err)
	require.NoError(t, again.Start(ctx, "app"))
	require.NoError(t, again.Stop(ctx))
	require.False(t, c.Running(ctx))

	// After a clean stop the same cluster starts again with its data.
	require.NoError(t, c.Start(ctx, "app"))
	require.True(t, c.Running(ctx))
}

func TestOpenRefusesUnsafeDirectory(t *testing.T) {
	if _, err := BinDir(); err != nil && os.Getenv("CI") == "" {
		t.Skip(err)
	}
	dir := filepath.Join(t.TempDir(), "open")
	require.NoError(t, os.Mkdir(dir, 0o777))
	require.NoError(t, os.Chmod(dir, 0o777))
	_, err := Open(context.Background(), dir, Options{})
	require.ErrorContains(t, err, "refusing unsafe private path")
}
