package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/pgcluster"
	"github.com/takoform/terraform-provider-takoform/internal/poolkey"
	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
	"github.com/takoform/terraform-provider-takoform/internal/sealing"
	"github.com/takoform/terraform-provider-takoform/internal/store"
)

const (
	devOrganization = "dev"
	devDatabase     = "takoform"
	devKeyFile      = "api-key"
	devEnvFile      = "env"
	// devSealingKeyFile is the sealing key-encryption key dev generates in its directory.
	devSealingKeyFile = "sealing-key"
	// devRuntimeSealingKeyFile is the embedded runtime node's own sealing key, which dev generates
	// in its directory: outside the runtime's state directory (SPEC 5.1).
	devRuntimeSealingKeyFile = "runtime-sealing-key"
	// devPoolKeyFile is the pool key of the default catalog's installation (devInstallation).
	devPoolKeyDir   = "pool"
	devPoolKeyFile  = "pool-key"
	devInstallation = "selfhost"
	// devRuntimeStateDir is the embedded runtime node's state directory in dev's directory.
	devRuntimeStateDir = "runtime"
)

func devCommand(g *globals) *cobra.Command {
	o := &serveOptions{}
	var dir string
	rt := runtime.Config{}
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the Host and a runtime node on a private PostgreSQL cluster in .takoform/dev (no server needed)",
		Long: `dev runs everything on one machine with nothing to install beyond PostgreSQL's binaries and
workerd. It starts a PostgreSQL cluster from this machine's PostgreSQL binaries in the dev directory
(created on first use, kept between runs), migrates it, generates the sealing key-encryption key
once, makes sure organization "dev" and an API key exist (the key goes to a 0600 file), starts a
runtime node (workerd, its admin API and its edge) and serves the API until interrupted. It then
stops the runtime node's processes and the cluster. One dev runs per directory at a time; a cluster
that an earlier dev left running when it was killed is taken over and stopped like its own.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := g.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			rt.Logger = log.With("component", "runtime")
			return runDev(cmd, log, dir, *o, rt)
		},
	}
	cmd.Flags().StringVar(&dir, "dir", filepath.Join(".takoform", "dev"), "private directory for the dev cluster and key")
	cmd.Flags().StringVar(&rt.StateDir, "runtime-state-dir", "", "the embedded runtime node's private state directory (default <dir>/runtime, beside the key that seals its deliveries)")
	cmd.Flags().StringVar(&rt.SealingKeyFile, "runtime-sealing-key-file", "", "the embedded runtime node's sealing key (default <dir>/runtime-sealing-key, created when absent)")
	cmd.Flags().StringVar(&rt.PoolKeyFile, "runtime-pool-key-file", "", "the pool key of the default catalog's installation (default <dir>/pool/pool-key, created when absent): the Host keeps each delivery sealed to it, so a node whose state directory is lost gets its secrets back")
	cmd.Flags().StringVar(&rt.AdminListen, "admin-listen", adminapi.DefaultAdminListen, "address of the embedded runtime node's admin API")
	cmd.Flags().StringVar(&rt.EdgeListen, "edge-listen", adminapi.DefaultEdgeListen, "address of the embedded runtime node's edge, where workers answer")
	cmd.Flags().StringVar(&rt.Workerd, "workerd", "", "workerd binary (default: $TAKOFORM_WORKERD, .tools/bin/workerd, or workerd on PATH)")
	cmd.Flags().BoolVar(&rt.InsecureNoSandbox, "insecure-no-sandbox", false, "run workers as this user without the OS sandbox (dev falls back to it by itself where it cannot sandbox)")
	edgeTLSFlags(cmd.Flags(), &rt.EdgeTLS)
	o.flags(cmd)
	return cmd
}

func runDev(cmd *cobra.Command, log *slog.Logger, dir string, o serveOptions, rt runtime.Config) error {
	ctx := cmd.Context()
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	cluster, err := pgcluster.Open(ctx, dir, pgcluster.Options{})
	if err != nil {
		return err
	}
	// One dev per directory: its lock is held until this process ends, however it ends, so a
	// cluster found running with the lock free was left by a dev that was killed.
	unlock, err := lockDevDir(cluster.Dir)
	if err != nil {
		return err
	}
	defer unlock()
	if cluster.Running(ctx) {
		fmt.Fprintf(cmd.ErrOrStderr(), "takoserver dev: the PostgreSQL cluster in %s was left running by an earlier takoserver dev that did not stop; using it, and stopping it when this one stops\n", cluster.Dir)
	}
	if err := cluster.Start(ctx, devDatabase); err != nil {
		return err
	}
	{
		// Stop the cluster, even when interrupted: a fresh context, bounded.
		defer func() {
			stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			if err := cluster.Stop(stopCtx); err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), "takoserver dev: stop PostgreSQL:", err)
			} else {
				fmt.Fprintln(cmd.ErrOrStderr(), "takoserver dev: PostgreSQL stopped")
			}
		}()
	}
	databaseURL := cluster.URL(devDatabase)
	if err := store.MigrateUp(databaseURL); err != nil {
		return err
	}
	keyPath, err := ensureDevKey(ctx, cluster, databaseURL)
	if err != nil {
		return err
	}
	if o.sealingKeyFile == "" {
		// The embedded default generates its sealing key-encryption key once, beside the cluster.
		o.sealingKeyFile = filepath.Join(cluster.Dir, devSealingKeyFile)
		if _, err := os.Stat(o.sealingKeyFile); errors.Is(err, os.ErrNotExist) {
			if _, err := sealing.WriteKEKFile(o.sealingKeyFile); err != nil {
				return err
			}
		}
	}
	// The runtime node runs in-process beside the Host; the default catalog's selfhost
	// installation points at it. Its sealing key is dev's to create, beside dev's other keys and
	// outside the runtime's state directory (a key an earlier version left there is moved once).
	// The runtime's state lives in dev's directory by default, with the database whose workers it
	// runs and the key its deliveries are sealed under: a fresh directory is a fresh node, never
	// one left holding scripts no database knows and deliveries no key opens.
	if rt.StateDir == "" {
		rt.StateDir = filepath.Join(cluster.Dir, devRuntimeStateDir)
	}
	if rt.SealingKeyFile == "" {
		rt.SealingKeyFile = filepath.Join(cluster.Dir, devRuntimeSealingKeyFile)
	}
	rt.CreateSealingKey = true
	// The default catalog's installation gets a pool key (SPEC 6.2), created once beside the
	// runtime's sealing key: a dev node whose state directory is deleted gets its workers'
	// secrets back from the Host.
	var poolPublic string
	if rt.PoolKeyFile == "" {
		// In a private directory of the node's own user (dev's directory may belong to the
		// cluster's).
		dir := filepath.Join(cluster.Dir, devPoolKeyDir)
		if err := safedir.Ensure(dir, safedir.Current()); err != nil {
			return err
		}
		rt.PoolKeyFile = filepath.Join(dir, devPoolKeyFile)
		if _, err := os.Stat(rt.PoolKeyFile); errors.Is(err, os.ErrNotExist) {
			key, err := poolkey.Generate(devInstallation)
			if err != nil {
				return err
			}
			if err := poolkey.WriteFile(rt.PoolKeyFile, key); err != nil {
				return err
			}
		}
	}
	if key, err := poolkey.ReadFile(rt.PoolKeyFile); err != nil {
		return err
	} else if key.Pool == devInstallation {
		poolPublic = key.Public().String()
	}
	node, err := runtime.Start(rt)
	if errors.Is(err, runtime.ErrCannotSandbox) {
		// On a laptop (not root, or no bubblewrap) dev still runs, and says so loudly.
		fmt.Fprintf(cmd.ErrOrStderr(), "\n*** takoserver dev: %v\n*** RUNNING WITHOUT THE OS SANDBOX: every worker runs as your user and can read the others' secrets. Fine for your own code only.\n\n", err)
		rt.InsecureNoSandbox = true
		node, err = runtime.Start(rt)
	}
	if err != nil {
		return listenHint(err)
	}
	defer func() {
		if err := node.Close(); err != nil {
			fmt.Fprintln(cmd.ErrOrStderr(), "takoserver dev: stop the runtime node:", err)
		}
	}()
	info := node.Info()
	// The default catalog's origins carry the edge's scheme: https:// only when asked (--edge-tls-*).
	cat := catalog.DefaultWithEdge(info.AdminURL, info.TokenFile, info.EdgeAddr, info.EdgeScheme)
	if poolPublic != "" {
		if err := cat.SetPoolKey(devInstallation, poolPublic); err != nil {
			return err
		}
	}
	serveErr := serve(ctx, log, databaseURL, o, cat, func(addr string) {
		endpoint := "http://" + addr
		env := fmt.Sprintf("export TAKOFORM_ENDPOINT=%s\nexport TAKOFORM_API_KEY=\"$(cat %s)\"\nexport TAKOSERVER_DATABASE_URL='%s'\nexport TAKOSERVER_SEALING_KEY_FILE=%s\n", endpoint, keyPath, databaseURL, o.sealingKeyFile)
		if err := safedir.WriteFile(cluster.Dir, devEnvFile, []byte(env), cluster.Owner); err != nil {
			fmt.Fprintln(cmd.ErrOrStderr(), "takoserver dev: write env file:", err)
		}
		fmt.Fprintf(cmd.OutOrStdout(), `
takoserver dev is serving at %s (organization %q).
Workers answer at the runtime node's edge, %s (%s://<hostname>:<port>/).
The API key is in %s (mode 0600). Point a provider or curl at the Host with:

    source %s

or by hand:

    export TAKOFORM_ENDPOINT=%s
    export TAKOFORM_API_KEY="$(cat %s)"

Press Ctrl-C to stop; the PostgreSQL cluster in %s stops too, its data kept for the next run.

`, endpoint, devOrganization, info.EdgeAddr, info.EdgeScheme, keyPath, filepath.Join(cluster.Dir, devEnvFile), endpoint, keyPath, cluster.Dir)
	})
	if errors.Is(serveErr, context.Canceled) {
		return nil
	}
	if errors.Is(serveErr, syscall.EADDRINUSE) {
		return fmt.Errorf("%w: another program listens there; pick another address with --listen", serveErr)
	}
	return serveErr
}

// listenHint names the flag that moves a listener whose address is taken.
func listenHint(err error) error {
	if !errors.Is(err, syscall.EADDRINUSE) {
		return err
	}
	switch msg := err.Error(); {
	case strings.Contains(msg, "admin API"):
		return fmt.Errorf("%w: another program listens there; pick another address with --admin-listen", err)
	case strings.Contains(msg, "edge"):
		return fmt.Errorf("%w: another program listens there; pick another address with --edge-listen (or --edge-http-listen)", err)
	}
	return err
}

// devLockFile is held (flock) by the takoserver dev using a directory.
const devLockFile = "dev.lock"

// lockDevDir takes dir's dev lock, or says which process holds it.
func lockDevDir(dir string) (func(), error) {
	path := filepath.Join(dir, devLockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		return nil, fmt.Errorf("another takoserver dev (pid %s) is using %s: stop it first, or give this one another --dir", strings.TrimSpace(string(holder)), dir)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() { f.Close() }, nil
}

// ensureDevKey makes sure organization dev exists and the key file holds a working key, issuing
// a new key only when the stored one is missing or no longer authenticates.
func ensureDevKey(ctx context.Context, cluster *pgcluster.Cluster, databaseURL string) (string, error) {
	db, err := store.Open(ctx, databaseURL)
	if err != nil {
		return "", err
	}
	defer db.Close()
	if _, err := auth.OrganizationByName(ctx, db, devOrganization); err != nil {
		if _, err := auth.CreateOrganization(ctx, db, devOrganization); err != nil {
			return "", err
		}
	}
	keyPath := filepath.Join(cluster.Dir, devKeyFile)
	if raw, err := safedir.ReadFile(cluster.Dir, devKeyFile, cluster.Owner); err == nil {
		if p, err := auth.Authenticate(ctx, db, strings.TrimSpace(string(raw))); err == nil && p.Organization.Name == devOrganization {
			return keyPath, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	key, err := auth.CreateKey(ctx, db, devOrganization, nil)
	if err != nil {
		return "", err
	}
	if err := safedir.WriteFile(cluster.Dir, devKeyFile, []byte(key.Key+"\n"), cluster.Owner); err != nil {
		return "", err
	}
	return keyPath, nil
}
