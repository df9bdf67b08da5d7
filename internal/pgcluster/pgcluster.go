// Package pgcluster runs a private PostgreSQL cluster from the machine's PostgreSQL binaries. It
// backs `takoserver dev` and the test helper: no server has to exist beforehand.
//
// PostgreSQL refuses to run as root, so when this process is root the cluster runs as an
// unprivileged user (TAKOFORM_PG_USER, default "postgres"), and that user owns the cluster's
// directory. Otherwise the cluster runs as this process's own user.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/safedir"
)

// Superuser is the database role initdb creates for the cluster.
const Superuser = "takoform"

// maxSocketPath is the longest unix socket path the kernel accepts, less some slack.
const maxSocketPath = 100

// Options choose how a cluster listens.
type Options struct {
	// Port is the TCP port on 127.0.0.1, or 0 to listen on the unix socket only.
	Port int
	// Settings are extra `-c name=value` server settings.
	Settings map[string]string
}

// Cluster is one PostgreSQL data directory with its socket and log, all under Dir.
type Cluster struct {
	Dir   string
	Owner safedir.Owner
	bin   string
	opts  Options
	runAs *syscall.Credential
}

// BinDir finds the directory holding initdb, pg_ctl and postgres: PATH first, then the newest
// /usr/lib/postgresql/*/bin.
func BinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			dir := filepath.Dir(real)
			if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
				return dir, nil
			}
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(matches, func(i, j int) bool { return versionOf(matches[i]) > versionOf(matches[j]) })
	for _, m := range matches {
		dir := filepath.Dir(m)
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
			return dir, nil
		}
	}
	return "", errors.New("no PostgreSQL server binaries found: install them (Debian: apt-get install postgresql) or put initdb and pg_ctl on PATH")
}

func versionOf(initdb string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(filepath.Dir(initdb))), 64)
	return v
}

// ClusterOwner is the user that must own and run a cluster started by this process.
func ClusterOwner() (safedir.Owner, *syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return safedir.Current(), nil, nil
	}
	name := os.Getenv("TAKOFORM_PG_USER")
	if name == "" {
		name = "postgres"
	}
	u, err := user.Lookup(name)
	if err != nil {
		return safedir.Owner{}, nil, fmt.Errorf("running as root, PostgreSQL needs an unprivileged user to run as: %w (create user %q or set TAKOFORM_PG_USER)", err, name)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if uid == 0 {
		return safedir.Owner{}, nil, fmt.Errorf("TAKOFORM_PG_USER %q is root; PostgreSQL refuses to run as root", name)
	}
	return safedir.Owner{UID: uid, GID: gid}, &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// Open prepares dir as the cluster's private directory (SPEC 6.3) and initialises a data directory
// in it on first use. An existing cluster is reused.
func Open(ctx context.Context, dir string, opts Options) (*Cluster, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	owner, cred, err := ClusterOwner()
	if err != nil {
		return nil, err
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, Owner: owner, bin: bin, opts: opts, runAs: cred}
	if len(c.socketPath()) > maxSocketPath {
		return nil, fmt.Errorf("cluster directory %s is too deep for a unix socket path (%d > %d characters); use a shorter path", dir, len(c.socketPath()), maxSocketPath)
	}
	if err := safedir.Ensure(dir, owner); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(c.dataDir(), "PG_VERSION")); err == nil {
		return c, nil
	}
	if err := safedir.Ensure(c.runDir(), owner); err != nil {
		return nil, err
	}
	if err := c.run(ctx, filepath.Join(bin, "initdb"), "-D", c.dataDir(), "-U", Superuser, "--auth=trust",
		"-E", "UTF8", "--locale=C", "--no-instructions", "--no-sync"); err != nil {
		return nil, fmt.Errorf("initdb: %w", err)
	}
	return c, nil
}

func (c *Cluster) dataDir() string { return filepath.Join(c.Dir, "data") }
func (c *Cluster) runDir() string  { return filepath.Join(c.Dir, "run") }
func (c *Cluster) logFile() string { return filepath.Join(c.Dir, "postgres.log") }
func (c *Cluster) socketPath() string {
	return filepath.Join(c.runDir(), ".s.PGSQL."+strconv.Itoa(c.port()))
}

func (c *Cluster) port() int {
	if c.opts.Port != 0 {
		return c.opts.Port
	}
	return 5432
}

// Running reports whether the cluster's postmaster is up.
func (c *Cluster) Running(ctx context.Context) bool {
	return c.run(ctx, filepath.Join(c.bin, "pg_ctl"), "-D", c.dataDir(), "status") == nil
}

// Start starts the cluster unless it is already running, then makes sure database exists.
func (c *Cluster) Start(ctx context.Context, database string) error {
	if err := safedir.Ensure(c.runDir(), c.Owner); err != nil {
		return err
	}
	if !c.Running(ctx) {
		listen := "''"
		if c.opts.Port != 0 {
			listen = "127.0.0.1"
		}
		settings := []string{
			"-k " + c.runDir(),
			"-p " + strconv.Itoa(c.port()),
			"-c listen_addresses=" + listen,
			"-c unix_socket_permissions=0700",
		}
		for k, v := range c.opts.Settings {
			settings = append(settings, "-c "+k+"="+v)
		}
		sort.Strings(settings[4:])
		if err := c.run(ctx, filepath.Join(c.bin, "pg_ctl"), "-D", c.dataDir(), "-l", c.logFile(),
			"-w", "-t", "60", "-o", strings.Join(settings, " "), "start"); err != nil {
			return fmt.Errorf("start PostgreSQL (log: %s): %w", c.logFile(), err)
		}
	}
	return c.createDatabase(ctx, database)
}

// Stop stops the cluster with a fast shutdown, waiting for it to finish.
func (c *Cluster) Stop(ctx context.Context) error {
	if !c.Running(ctx) {
		return nil
	}
	return c.run(ctx, filepath.Join(c.bin, "pg_ctl"), "-D", c.dataDir(), "-m", "fast", "-w", "-t", "60", "stop")
}

// URL is a connection string for database on this cluster.
func (c *Cluster) URL(database string) string {
	q := url.Values{}
	q.Set("sslmode", "disable")
	if c.opts.Port != 0 {
		return (&url.URL{Scheme: "postgres", User: url.User(Superuser), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(c.opts.Port)), Path: "/" + database, RawQuery: q.Encode()}).String()
	}
	q.Set("host", c.runDir())
	q.Set("port", strconv.Itoa(c.port()))
	q.Set("user", Superuser)
	return (&url.URL{Scheme: "postgres", Path: "/" + database, RawQuery: q.Encode()}).String()
}

func (c *Cluster) createDatabase(ctx context.Context, database string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("connect to the cluster: %w", err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", database).Scan(&exists); err != nil {
		return fmt.Errorf("look up database %s: %w", database, err)
	}
	if exists {
		return nil
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{database}.Sanitize()); err != nil {
		return fmt.Errorf("create database %s: %w", database, err)
	}
	return nil
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = c.Dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if c.runAs != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.runAs}
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	// The postmaster outlives pg_ctl; never wait long on an inherited pipe.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", filepath.Base(name), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// FreePort asks the kernel for a free loopback TCP port.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
