// Package testdb gives each test its own migrated PostgreSQL database, cloned in milliseconds from
// a template that is migrated once per migration hash (peterldowns/pgtestdb).
//
// The server is TAKOFORM_TEST_DATABASE_URL when set; otherwise a throwaway cluster is started from
// the machine's PostgreSQL binaries once per test binary and removed when it exits. Packages that
// use it call Main from TestMain. Under CI=true a missing PostgreSQL fails the run instead of
// skipping.
package testdb

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver pgtestdb uses
	"github.com/peterldowns/pgtestdb"

	"github.com/takoform/terraform-provider-takoform/internal/pgcluster"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/migrations"
)

var (
	startOnce sync.Once
	config    pgtestdb.Config
	startErr  error
	cluster   *pgcluster.Cluster
	tempRoot  string
)

// Main runs the package's tests and then stops the throwaway cluster, if one was started.
func Main(m *testing.M) {
	code := m.Run()
	if cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := cluster.Stop(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "testdb: stop cluster:", err)
		}
		cancel()
		if code == 0 {
			os.RemoveAll(tempRoot)
		} else {
			fmt.Fprintln(os.Stderr, "testdb: cluster kept for inspection in", tempRoot)
		}
	}
	os.Exit(code)
}

func start() (pgtestdb.Config, error) {
	if raw := os.Getenv("TAKOFORM_TEST_DATABASE_URL"); raw != "" {
		return configFromURL(raw)
	}
	if _, err := pgcluster.BinDir(); err != nil {
		return pgtestdb.Config{}, err
	}
	root, err := os.MkdirTemp("", "takoform-testdb-")
	if err != nil {
		return pgtestdb.Config{}, err
	}
	// The cluster may run as another user (see pgcluster); it must be able to reach its directory.
	if err := os.Chmod(root, 0o755); err != nil {
		return pgtestdb.Config{}, err
	}
	tempRoot = root
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// The port is free when asked for and taken when PostgreSQL binds it: another test process
	// can take it in between (seen in CI, "could not bind IPv4 address: Address already in
	// use"). A start that meets that is tried again on another port, in a cluster of its own.
	for attempt := 1; ; attempt++ {
		port, err := pgcluster.FreePort()
		if err != nil {
			return pgtestdb.Config{}, err
		}
		dir := filepath.Join(root, "pg")
		if attempt > 1 {
			dir = filepath.Join(root, fmt.Sprintf("pg-%d", attempt))
		}
		c, err := pgcluster.Open(ctx, dir, pgcluster.Options{
			Port: port,
			// A throwaway cluster: durability buys nothing here.
			Settings: map[string]string{"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off", "max_connections": "300"},
		})
		if err != nil {
			return pgtestdb.Config{}, err
		}
		err = c.Start(ctx, "postgres")
		if err != nil && attempt < 4 && portTaken(dir) {
			continue
		}
		if err != nil {
			return pgtestdb.Config{}, err
		}
		cluster = c
		return configFromURL(c.URL("postgres"))
	}
}

// portTaken reports whether the cluster in dir failed to start because its port was taken.
func portTaken(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "postgres.log"))
	return err == nil && strings.Contains(string(b), "Address already in use")
}

func configFromURL(raw string) (pgtestdb.Config, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return pgtestdb.Config{}, errors.New("TAKOFORM_TEST_DATABASE_URL is not a URL")
	}
	password, _ := u.User.Password()
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	db := u.Path
	if len(db) > 1 {
		db = db[1:]
	} else {
		db = "postgres"
	}
	return pgtestdb.Config{
		DriverName: "pgx",
		Host:       u.Hostname(),
		Port:       port,
		User:       u.User.Username(),
		Password:   password,
		Database:   db,
		Options:    u.RawQuery,
	}, nil
}

func ensureStarted(t testing.TB) pgtestdb.Config {
	t.Helper()
	startOnce.Do(func() { config, startErr = start() })
	if startErr != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("no PostgreSQL for tests: %v", startErr)
		}
		t.Fatalf("no PostgreSQL for tests (CI=true never skips): %v", startErr)
	}
	return config
}

// URL creates a fresh, fully migrated database for this test and returns its connection string.
// The database is dropped when the test passes and kept for inspection when it fails.
func URL(t testing.TB) string {
	t.Helper()
	conf := ensureStarted(t)
	return pgtestdb.Custom(t, conf, migrator{}).URL()
}

// Pool returns a pool on a fresh, fully migrated database for this test.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), URL(t))
	if err != nil {
		t.Fatalf("connect to test database: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// migrator migrates pgtestdb's template database with the embedded migrations.
type migrator struct{}

func (migrator) Hash() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := migrations.FS.ReadFile(path)
		if err != nil {
			return err
		}
		h.Write([]byte(path + "\x00" + strconv.Itoa(len(body)) + "\x00"))
		h.Write(body)
		return nil
	})
	return hex.EncodeToString(h.Sum(nil)), err
}

func (migrator) Migrate(_ context.Context, db *sql.DB, _ pgtestdb.Config) error {
	m, err := store.Migrator(db)
	if err != nil {
		return err
	}
	// Closing releases the migrator's connection: a template with a session open cannot be cloned.
	defer m.Close()
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return err
	}
	return nil
}
