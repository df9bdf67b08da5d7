// Command takoserver is the Takoform Host: the API server, its admin commands, and `dev`, which
// runs everything on a private PostgreSQL cluster.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/customdomain"
	"github.com/takoform/terraform-provider-takoform/internal/host"
	"github.com/takoform/terraform-provider-takoform/internal/netlisten"
	"github.com/takoform/terraform-provider-takoform/internal/nodepool"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/quota"
	"github.com/takoform/terraform-provider-takoform/internal/sealing"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/server"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := rootCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "takoserver:", err)
		os.Exit(1)
	}
}

type globals struct {
	databaseURL string
	output      string
	logLevel    string
}

func rootCommand() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "takoserver",
		Short:         "The Takoform Host: reserves origins, owns every mutation, runs workers",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.databaseURL, "database-url", os.Getenv("TAKOSERVER_DATABASE_URL"), "PostgreSQL connection string (env TAKOSERVER_DATABASE_URL)")
	root.PersistentFlags().StringVar(&g.output, "output", "text", "output format of admin commands: text or json")
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	root.AddCommand(serveCommand(g), devCommand(g), migrateCommand(g), orgsCommand(g), keysCommand(g), brakeCommand(g))
	root.AddCommand(runtimeCommand(g), cloudflareCommand(g), nodesCommand(g))
	return root
}

func (g *globals) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(g.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})), nil
}

func (g *globals) checkOutput() error {
	if g.output != "text" && g.output != "json" {
		return fmt.Errorf("--output must be text or json")
	}
	return nil
}

func (g *globals) pool(ctx context.Context) (*pgxpool.Pool, error) {
	if g.databaseURL == "" {
		return nil, errors.New("no database: pass --database-url or set TAKOSERVER_DATABASE_URL")
	}
	return store.Open(ctx, g.databaseURL)
}

// outputAndPool checks --output, then opens the database: what every admin command that reads or
// writes the database does first.
func (g *globals) outputAndPool(ctx context.Context) (*pgxpool.Pool, error) {
	if err := g.checkOutput(); err != nil {
		return nil, err
	}
	return g.pool(ctx)
}

// print writes v as JSON with --output json, or text otherwise.
func (g *globals) print(w io.Writer, v any, text string) error {
	if g.output == "json" {
		enc := json.NewEncoder(w)
		return enc.Encode(v)
	}
	_, err := fmt.Fprintln(w, text)
	return err
}

type serveOptions struct {
	listen             string
	config             string
	sealingKeyFile     string
	tombstoneRetention time.Duration
	janitorEvery       time.Duration
	// listenWait is how long a busy --listen address is tried again (zero: once).
	listenWait time.Duration
	// cloudflareEdge, cloudflareEdgeCA: where the wfp-managed Ready probe reaches Cloudflare's
	// edge instead of DNS (a stand-in's edge, for demos), and the CA its certificate is from.
	cloudflareEdge, cloudflareEdgeCA string
	// dnsResolver is where custom domains' TXT records are looked up (host:port).
	dnsResolver string
}

func (o *serveOptions) flags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.listen, "listen", "127.0.0.1:8080", "address the API listens on, or fd:N for a listening socket the process inherits (systemd's socket activation)")
	cmd.Flags().StringVar(&o.config, "config", os.Getenv("TAKOSERVER_CONFIG"), "catalog file (JSON; env TAKOSERVER_CONFIG); the default catalog is one selfhost installation")
	cmd.Flags().StringVar(&o.sealingKeyFile, "sealing-key-file", os.Getenv("TAKOSERVER_SEALING_KEY_FILE"),
		"the sealing key-encryption key, the same file on every replica (env TAKOSERVER_SEALING_KEY_FILE; create it with: takoserver keys init-sealing --out FILE)")
	cmd.Flags().DurationVar(&o.tombstoneRetention, "tombstone-retention", 30*24*time.Hour, "how long ownership tombstones are kept (a late replay of a deleted object's request is refused while its tombstone lasts)")
	cmd.Flags().StringVar(&o.cloudflareEdge, "cloudflare-edge", "", "send the wfp-managed Ready probe to this address instead of resolving the hostname (a Cloudflare stand-in's edge, for demos and tests)")
	cmd.Flags().StringVar(&o.cloudflareEdgeCA, "cloudflare-edge-ca", "", "PEM file of the CA the --cloudflare-edge address's certificate is from")
	cmd.Flags().StringVar(&o.dnsResolver, "dns-resolver", os.Getenv("TAKOSERVER_DNS_RESOLVER"), "the recursive DNS resolver (host:port) custom domains' TXT records are looked up through (env TAKOSERVER_DNS_RESOLVER; default: the first nameserver of /etc/resolv.conf)")
	cmd.Flags().DurationVar(&o.janitorEvery, "janitor-every", time.Minute, "how often the janitor recovers abandoned requests, collects orphans, releases Host-minted reservations of deleted workers and purges tombstones")
	cmd.Flags().DurationVar(&o.listenWait, "listen-wait", 30*time.Second, "how long a --listen address in use (the previous process still stopping) is tried again before the start fails")
}

func serveCommand(g *globals) *cobra.Command {
	o := &serveOptions{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Migrate the database and serve the API",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := g.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if g.databaseURL == "" {
				return errors.New("no database: pass --database-url or set TAKOSERVER_DATABASE_URL")
			}
			return serve(cmd.Context(), log, g.databaseURL, *o, nil, nil)
		},
	}
	o.flags(cmd)
	return cmd
}

// serve migrates, then answers on o.listen until ctx ends. ready, when set, is called once the
// listener is open. cat, when set, is the catalog to use without a --config.
func serve(ctx context.Context, log *slog.Logger, databaseURL string, o serveOptions, cat *catalog.Catalog, ready func(addr string)) error {
	if cat == nil {
		cat = catalog.Default()
	}
	if o.config != "" {
		var err error
		if cat, err = catalog.Load(o.config); err != nil {
			return err
		}
	}
	if o.tombstoneRetention < time.Hour {
		return errors.New("--tombstone-retention must be at least an hour")
	}
	kek, err := sealing.LoadKEK(o.sealingKeyFile)
	if err != nil {
		return err
	}
	db, err := store.Open(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer db.Close()
	// A binary older than the database's schema refuses before it touches anything.
	if err := store.CheckSchema(ctx, db); err != nil {
		return err
	}
	if err := store.MigrateUp(databaseURL); err != nil {
		return err
	}
	// Objects placed on a selfhost offering before pools carry a digest that covered runtimeUrl.
	if moved, err := nodepool.MoveDigests(ctx, db, cat); err != nil {
		return err
	} else if moved > 0 {
		log.Info("offering digests moved to their pools' (SPEC 6.2)", "rows", moved)
	}
	// Every replica tells a pool's members the pool's recorded fence, whatever its catalog says.
	for _, inst := range cat.Installations {
		if inst.Pack != catalog.PackSelfhost {
			continue
		}
		fence, recorded, err := nodepool.Fence(ctx, db, inst)
		if err != nil {
			return err
		}
		if recorded && fence != inst.Fence() {
			log.Warn("this catalog's fenceSeconds differs from the pool's; the pool's is used (takoserver nodes set-fence changes it)",
				"installation", inst.Name, "catalog", int64(inst.Fence().Seconds()), "pool", int64(fence.Seconds()))
		}
	}
	// A replica whose key-encryption key cannot unwrap the current data key refuses to start.
	ring, err := sealing.OpenRing(ctx, db, kek)
	if err != nil {
		return err
	}
	l, err := netlisten.Listen(ctx, o.listen, o.listenWait, func(err error) {
		log.Warn("listen address in use; trying again", "address", o.listen, "for", o.listenWait.String(), "error", err.Error())
	})
	if err != nil {
		return fmt.Errorf("listen on %s: %w", o.listen, err)
	}
	log.Info("takoserver listening", "address", l.Addr().String())
	if ready != nil {
		ready(l.Addr().String())
	}
	// A Host keeps nothing on disk: its backends are APIs, its authority is PostgreSQL.
	edge, err := cloudflareEdgeClient(o.cloudflareEdge, o.cloudflareEdgeCA)
	if err != nil {
		return err
	}
	h := host.New(host.Config{DB: db, Catalog: cat, Logger: log, SealingRing: ring, TombstoneRetention: o.tombstoneRetention, CloudflareEdge: edge,
		DNSResolver: &customdomain.Resolver{Server: o.dnsResolver}})
	srv := server.New(server.Config{Host: h, JanitorEvery: o.janitorEvery})
	return srv.Serve(ctx, l)
}

func migrateCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "migrate", Short: "Apply or inspect database migrations"}
	withMigrator := func(fn func(m *migrate.Migrate) error) error {
		if g.databaseURL == "" {
			return errors.New("no database: pass --database-url or set TAKOSERVER_DATABASE_URL")
		}
		db, err := store.OpenSQL(g.databaseURL)
		if err != nil {
			return err
		}
		defer db.Close()
		m, err := store.Migrator(db)
		if err != nil {
			return err
		}
		defer m.Close()
		return fn(m)
	}
	var steps int
	down := &cobra.Command{
		Use:   "down",
		Short: "Roll back migrations (one step unless --steps says more)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if steps < 1 {
				return errors.New("--steps must be at least 1")
			}
			return withMigrator(func(m *migrate.Migrate) error {
				if err := m.Steps(-steps); err != nil && !errors.Is(err, migrate.ErrNoChange) {
					return fmt.Errorf("migrate down: %w", err)
				}
				return reportVersion(g, cmd.OutOrStdout(), m)
			})
		},
	}
	down.Flags().IntVar(&steps, "steps", 1, "how many migrations to roll back")
	cmd.AddCommand(
		&cobra.Command{
			Use: "up", Short: "Apply every pending migration", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return withMigrator(func(m *migrate.Migrate) error {
					if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
						return fmt.Errorf("migrate up: %w", err)
					}
					return reportVersion(g, cmd.OutOrStdout(), m)
				})
			},
		},
		down,
		&cobra.Command{
			Use: "version", Short: "Print the applied migration version", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return withMigrator(func(m *migrate.Migrate) error { return reportVersion(g, cmd.OutOrStdout(), m) })
			},
		},
	)
	return cmd
}

func reportVersion(g *globals, w io.Writer, m *migrate.Migrate) error {
	if err := g.checkOutput(); err != nil {
		return err
	}
	v, dirty, err := m.Version()
	if errors.Is(err, migrate.ErrNilVersion) {
		return g.print(w, map[string]any{"version": 0, "dirty": false}, "version 0 (no migrations applied)")
	}
	if err != nil {
		return fmt.Errorf("read migration version: %w", err)
	}
	text := fmt.Sprintf("version %d", v)
	if dirty {
		text += " (dirty: a migration failed part-way; fix it by hand, then force the version)"
	}
	return g.print(w, map[string]any{"version": v, "dirty": dirty}, text)
}

func orgsCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "orgs", Short: "Manage organizations"}
	cmd.AddCommand(&cobra.Command{
		Use: "create NAME", Short: "Create an organization", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			db, err := g.outputAndPool(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			org, err := auth.CreateOrganization(cmd.Context(), db, args[0])
			if err != nil {
				return err
			}
			return g.print(cmd.OutOrStdout(), org, fmt.Sprintf("created organization %s (id %s)", org.Name, org.ID))
		},
	}, quotaCommand(g), countersCommand(g))
	return cmd
}

// countersCommand checks (and with --recount repairs) the quota counters of every organization.
func countersCommand(g *globals) *cobra.Command {
	var recount bool
	cmd := &cobra.Command{
		Use:   "counters [--recount]",
		Short: "Check that the quota counters match what every organization holds; --recount repairs them",
		Long: `counters compares, for every organization and resource, the quota counters a create decides on far
below its ceiling (kept by row triggers) with what the rows say it holds, and lists each difference.
There is none unless a write got past the triggers (a data-only restore without them, a trigger
disabled by hand). --recount makes every organization's counters again from its rows first, holding
writers of workers, endpoints, reservations and runtime inputs off while it runs (a moment on a small
database). The command fails while a difference remains.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			ctx := cmd.Context()
			db, err := g.pool(ctx)
			if err != nil {
				return err
			}
			defer db.Close()
			out := countersReport{Drift: []quota.Drift{}}
			if recount {
				if out.Recounted, err = quota.Recount(ctx, db); err != nil {
					return err
				}
			}
			drift, err := quota.CheckCounters(ctx, db)
			if err != nil {
				return err
			}
			out.Drift = append(out.Drift, drift...)
			text := "the quota counters match every organization's rows"
			if recount {
				text = fmt.Sprintf("recounted (%d counter rows written); ", out.Recounted) + text
			}
			if len(drift) > 0 {
				text = fmt.Sprintf("%d difference(s) between the quota counters and the rows (run with --recount to repair):", len(drift))
				for _, d := range drift {
					text += fmt.Sprintf("\n  %s %-14s counters %d, rows %d", d.OrganizationID, d.Resource.Name(), d.Counters, d.Rows)
				}
			}
			if err := g.print(cmd.OutOrStdout(), out, text); err != nil {
				return err
			}
			if len(drift) > 0 {
				return fmt.Errorf("the quota counters differ from the rows for %d organization resource(s)", len(drift))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&recount, "recount", false, "make every organization's counters again from its rows first")
	return cmd
}

// countersReport is what orgs counters prints with --output json.
type countersReport struct {
	Recounted int64         `json:"recounted,omitempty"`
	Drift     []quota.Drift `json:"drift"`
}

// ceilingFlag is a ceiling on the command line: a number, or "default" for the catalog's.
type ceilingFlag struct {
	set   bool
	value *int
}

func (f *ceilingFlag) String() string {
	switch {
	case !f.set:
		return ""
	case f.value == nil:
		return "default"
	}
	return strconv.Itoa(*f.value)
}

func (f *ceilingFlag) Set(s string) error {
	if s == "default" {
		f.set, f.value = true, nil
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > quota.MaxCeiling {
		return fmt.Errorf("a ceiling is a number from 0 to %d, or default", quota.MaxCeiling)
	}
	f.set, f.value = true, &n
	return nil
}

func (f *ceilingFlag) Type() string { return "N|default" }

// quotaReport is what orgs quota prints with --output json.
type quotaReport struct {
	Organization auth.Organization      `json:"organization"`
	Quotas       map[string]quota.Usage `json:"quotas"`
}

func quotaCommand(g *globals) *cobra.Command {
	var config string
	flags := map[quota.Resource]*ceilingFlag{}
	cmd := &cobra.Command{
		Use:   "quota ORG [--workers N] [--endpoints N] [--reservations N] [--runtime-inputs N] [--custom-domains N]",
		Short: "Show an organization's ceilings, or override them",
		Long: `quota shows the organization's effective ceilings and what it holds of each. Each flag overrides
one ceiling for this organization (0 refuses every create of it), or with "default" returns it to the
catalog's default (the config file's "quotas", else the built-in defaults). Pass the --config the Host
replicas run with, so that the defaults shown are theirs. A ceiling below what the organization holds
leaves everything standing and refuses creates until it holds less. Every Host replica applies a
change on the next create.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			cat := catalog.Default()
			if config != "" {
				var err error
				if cat, err = catalog.Load(config); err != nil {
					return err
				}
			}
			ctx := cmd.Context()
			db, err := g.pool(ctx)
			if err != nil {
				return err
			}
			defer db.Close()
			org, err := auth.OrganizationByName(ctx, db, args[0])
			if err != nil {
				return err
			}
			err = store.WithTx(ctx, db, func(tx pgx.Tx) error {
				for _, r := range quota.Overridable {
					if f := flags[r]; f.set {
						if err := quota.Set(ctx, tx, org.ID, r, f.value); err != nil {
							return err
						}
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
			usage, err := quota.Report(ctx, db, cat.Quotas, org.ID)
			if err != nil {
				return err
			}
			out := quotaReport{Organization: org, Quotas: map[string]quota.Usage{}}
			text := "organization " + org.Name
			for _, u := range usage {
				out.Quotas[u.Resource.Name()] = u
				source := "the catalog's default"
				switch {
				case u.Override:
					source = "set for this organization"
				case config == "":
					source = "built-in default: pass --config or set TAKOSERVER_CONFIG to show the catalog's"
				}
				text += fmt.Sprintf("\n  %-14s %d of %d (%s)", u.Resource.Name(), u.Used, u.Ceiling, source)
			}
			return g.print(cmd.OutOrStdout(), out, text)
		},
	}
	cmd.Flags().StringVar(&config, "config", os.Getenv("TAKOSERVER_CONFIG"), "the catalog file the Host replicas run with, whose quotas are the defaults (env TAKOSERVER_CONFIG)")
	for _, f := range []struct {
		r    quota.Resource
		flag string
		what string
	}{
		{quota.Workers, "workers", "workers (deleted ones do not count)"},
		{quota.Endpoints, "endpoints", "endpoints (deleted ones do not count)"},
		{quota.Reservations, "reservations", "live reservations, Host-minted ones included (released and expired ones do not count)"},
		{quota.RuntimeInputs, "runtime-inputs", "pending runtime inputs (prepared or claimed; settled, aborted and expired ones do not count)"},
		{quota.CustomDomains, "custom-domains", "custom-domain claims, of any status"},
	} {
		flags[f.r] = &ceilingFlag{}
		cmd.Flags().Var(flags[f.r], f.flag, "ceiling on "+f.what+", or default")
	}
	return cmd
}

func keysCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "keys", Short: "Manage organization API keys"}
	var org string
	var scopes []string
	var expiresIn time.Duration
	create := &cobra.Command{
		Use: "create", Short: "Issue an API key (shown once)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			if org == "" {
				return errors.New("--org is required")
			}
			db, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			key, err := auth.CreateExpiringKey(cmd.Context(), db, org, scopes, expiresIn)
			if err != nil {
				return err
			}
			text := fmt.Sprintf("created key %s for organization %s with scopes %s\n%s\nThis is the only time the key is shown.",
				key.ID, org, strings.Join(key.Scopes, ","), key.Key)
			if key.ExpiresAt != nil {
				text += "\nIt stops working at " + *key.ExpiresAt + "."
			}
			return g.print(cmd.OutOrStdout(), key, text)
		},
	}
	create.Flags().StringVar(&org, "org", "", "organization name")
	create.Flags().StringSliceVar(&scopes, "scope", nil, "scope to grant (repeatable): resources:read, resources:write; default both")
	create.Flags().DurationVar(&expiresIn, "expires-in", 0, "the key stops working this long after its creation (for example 2160h); default never")
	var listOrg string
	list := &cobra.Command{
		Use: "list [--org ORG]", Short: "List API keys: id, organization, scopes, creation, revocation, expiry and last use (never a secret)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			db, err := g.outputAndPool(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			keys, err := auth.ListKeys(cmd.Context(), db, listOrg)
			if err != nil {
				return err
			}
			text := fmt.Sprintf("%-22s %-16s %-32s %-21s %-21s %-21s %s", "ID", "ORGANIZATION", "SCOPES", "CREATED", "LAST USED", "EXPIRES", "REVOKED")
			or := func(s *string, none string) string {
				if s == nil {
					return none
				}
				return *s
			}
			for _, k := range keys {
				text += fmt.Sprintf("\n%-22s %-16s %-32s %-21s %-21s %-21s %s", k.ID, k.Organization, strings.Join(k.Scopes, ","), k.CreatedAt,
					or(k.LastUsedAt, "never"), or(k.ExpiresAt, "never"), or(k.RevokedAt, "-"))
			}
			return g.print(cmd.OutOrStdout(), keys, text)
		},
	}
	list.Flags().StringVar(&listOrg, "org", "", "only this organization's keys")
	var out string
	initSealing := &cobra.Command{
		Use:   "init-sealing --out FILE",
		Short: "Write a new sealing key-encryption key (32 random bytes, base64) to FILE with mode 0600; never overwrites",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			if out == "" {
				return errors.New("--out is required")
			}
			kek, err := sealing.WriteKEKFile(out)
			if err != nil {
				return err
			}
			return g.print(cmd.OutOrStdout(), map[string]any{"file": out, "kekId": kek.ID},
				fmt.Sprintf("wrote sealing key-encryption key %s to %s (mode 0600)\nGive every Host replica this same file (--sealing-key-file) and keep a copy safe: without it nothing sealed can be opened.", kek.ID, out))
		},
	}
	initSealing.Flags().StringVar(&out, "out", "", "file to create")
	var keyFile string
	rotate := &cobra.Command{
		Use:   "rotate-sealing",
		Short: "Make a fresh sealing data key current, in one database write",
		Long: `rotate-sealing makes a fresh data key current in PostgreSQL, wrapped by the key-encryption key.
Every Host replica seals with it from its next seal on; no restart is needed. The previous data keys
(up to three) keep opening runtime inputs sealed under them; older ones are destroyed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			kek, err := sealing.LoadKEK(keyFile)
			if err != nil {
				return err
			}
			db, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			id, retired, err := sealing.Rotate(cmd.Context(), db, kek)
			if err != nil {
				return err
			}
			return g.print(cmd.OutOrStdout(), map[string]any{"current": id, "retired": retired, "maxPrevious": sealing.MaxPreviousKeys},
				fmt.Sprintf("sealing key %s is current; every Host replica seals with it from its next seal on (no restart needed); %d previous key(s) still open what they sealed, %d retired", id, sealing.MaxPreviousKeys, retired))
		},
	}
	rotate.Flags().StringVar(&keyFile, "sealing-key-file", os.Getenv("TAKOSERVER_SEALING_KEY_FILE"), "the sealing key-encryption key (env TAKOSERVER_SEALING_KEY_FILE)")
	var newKEKFile string
	rewrap := &cobra.Command{
		Use:   "rewrap --new-kek FILE",
		Short: "Wrap every sealing data key under a new key-encryption key, in one transaction (retires a leaked one)",
		Long: `rewrap unwraps every sealing data key and runtime-input commitment secret with the current
key-encryption key (--sealing-key-file) and wraps it under the new one (--new-kek, written by
keys init-sealing), in one transaction. Nothing sealed changes, and replicas still running with the
current key keep serving from the keys they unwrapped at start; restart each with --sealing-key-file
set to the new file, then destroy the old one. A rotate-sealing with the old file after it writes
nothing and says so (the rotation is a compare-and-swap on the key-encryption key). Running it
again changes nothing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			current, err := sealing.LoadKEK(keyFile)
			if err != nil {
				return err
			}
			if newKEKFile == "" {
				return errors.New("--new-kek is required (create it with: takoserver keys init-sealing --out FILE)")
			}
			next, err := sealing.LoadKEK(newKEKFile)
			if err != nil {
				return err
			}
			db, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			n, err := sealing.Rewrap(cmd.Context(), db, current, next)
			if err != nil {
				return err
			}
			return g.print(cmd.OutOrStdout(), map[string]any{"rewrapped": n, "kekId": next.ID},
				fmt.Sprintf("%d key(s) re-wrapped under key-encryption key %s; restart every Host replica with --sealing-key-file %s, then destroy the old file", n, next.ID, newKEKFile))
		},
	}
	rewrap.Flags().StringVar(&keyFile, "sealing-key-file", os.Getenv("TAKOSERVER_SEALING_KEY_FILE"), "the current key-encryption key (env TAKOSERVER_SEALING_KEY_FILE)")
	rewrap.Flags().StringVar(&newKEKFile, "new-kek", "", "the new key-encryption key file (keys init-sealing --out FILE)")
	cmd.AddCommand(create, list, rewrap, initSealing, rotate, &cobra.Command{
		Use: "revoke ID", Short: "Revoke an API key: every Host refuses it within a second", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			db, err := g.outputAndPool(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			if err := auth.RevokeKey(cmd.Context(), db, args[0]); err != nil {
				return err
			}
			return g.print(cmd.OutOrStdout(), map[string]any{"id": args[0], "revoked": true}, "revoked key "+args[0])
		},
	})
	return cmd
}

func brakeCommand(g *globals) *cobra.Command {
	var org, space, worker string
	cmd := &cobra.Command{
		Use:   "brake deployment on|off [--org ORG [--space S --worker W]]",
		Short: "Engage or release a deployment brake: on the whole Host, one organization, or one worker",
		Long: `A deployment brake makes every graph-changing mutation in its scope (PUT and DELETE of
reservations, activations, runtime inputs, workers and endpoints) answer 423 while reads continue and
everything outside the scope is untouched. The lifecycle brake, which stops runtime restarts, belongs
to the runtime node: takoserver runtime brake lifecycle on|off.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			name, state := args[0], args[1]
			if name == "lifecycle" {
				return errors.New("the lifecycle brake belongs to the runtime node: takoserver runtime brake lifecycle on|off")
			}
			if name != "deployment" {
				return fmt.Errorf("unknown brake %q: deployment", name)
			}
			if state != "on" && state != "off" {
				return fmt.Errorf("brake state must be on or off, not %q", state)
			}
			if (space == "") != (worker == "") || (space != "" && org == "") {
				return errors.New("--space and --worker go together, and need --org")
			}
			db, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			brake := ownership.DeploymentBrake{Space: space, Worker: worker}
			if org != "" {
				o, err := auth.OrganizationByName(cmd.Context(), db, org)
				if err != nil {
					return err
				}
				brake.OrganizationID = o.ID
			}
			if err := ownership.SetDeploymentBrake(cmd.Context(), db, brake, state == "on"); err != nil {
				return fmt.Errorf("set brake: %w", err)
			}
			scope := "the whole Host"
			if org != "" {
				scope = "organization " + org
				if space != "" {
					scope = fmt.Sprintf("worker %s/%s of organization %s", space, worker, org)
				}
			}
			return g.print(cmd.OutOrStdout(), map[string]any{"brake": name, "engaged": state == "on", "scope": brake.Scope()},
				fmt.Sprintf("deployment brake %s for %s", state, scope))
		},
	}
	cmd.Flags().StringVar(&org, "org", "", "limit the brake to this organization")
	cmd.Flags().StringVar(&space, "space", "", "limit the brake to this worker's space (with --worker)")
	cmd.Flags().StringVar(&worker, "worker", "", "limit the brake to this worker (with --space)")
	return cmd
}
