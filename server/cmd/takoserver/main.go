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
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/golang-migrate/migrate/v4"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
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
	root.AddCommand(runtimeCommand(g))
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
	listen   string
	stateDir string
	config   string
}

func (o *serveOptions) flags(cmd *cobra.Command, defaultStateDir string) {
	cmd.Flags().StringVar(&o.listen, "listen", "127.0.0.1:8080", "address the API listens on")
	cmd.Flags().StringVar(&o.stateDir, "state-dir", defaultStateDir, "private directory for the key ring and runtime files (SPEC 6.3)")
	cmd.Flags().StringVar(&o.config, "config", "", "catalog file (JSON); the default catalog is one selfhost installation")
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
			return serve(cmd.Context(), log, g.databaseURL, *o, nil)
		},
	}
	o.flags(cmd, filepath.Join(".takoform", "state"))
	return cmd
}

// serve migrates, then answers on o.listen until ctx ends. ready, when set, is called once the
// listener is open.
func serve(ctx context.Context, log *slog.Logger, databaseURL string, o serveOptions, ready func(addr string)) error {
	cat := catalog.Default()
	if o.config != "" {
		var err error
		if cat, err = catalog.Load(o.config); err != nil {
			return err
		}
	}
	if err := safedir.Ensure(o.stateDir, safedir.Current()); err != nil {
		return err
	}
	ring, err := sealing.LoadRing(filepath.Join(o.stateDir, "keys"))
	if err != nil {
		return err
	}
	if err := store.MigrateUp(databaseURL); err != nil {
		return err
	}
	db, err := store.Open(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer db.Close()
	l, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", o.listen, err)
	}
	log.Info("takoserver listening", "address", l.Addr().String())
	if ready != nil {
		ready(l.Addr().String())
	}
	srv := server.New(server.Config{DB: db, Catalog: cat, Logger: log, StateDir: o.stateDir, SealingRing: ring})
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
			if err := g.checkOutput(); err != nil {
				return err
			}
			db, err := g.pool(cmd.Context())
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
	})
	return cmd
}

func keysCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "keys", Short: "Manage organization API keys"}
	var org string
	var scopes []string
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
			key, err := auth.CreateKey(cmd.Context(), db, org, scopes)
			if err != nil {
				return err
			}
			text := fmt.Sprintf("created key %s for organization %s with scopes %s\n%s\nThis is the only time the key is shown.",
				key.ID, org, strings.Join(key.Scopes, ","), key.Key)
			return g.print(cmd.OutOrStdout(), key, text)
		},
	}
	create.Flags().StringVar(&org, "org", "", "organization name")
	create.Flags().StringSliceVar(&scopes, "scope", nil, "scope to grant (repeatable): resources:read, resources:write; default both")
	var stateDir string
	rotate := &cobra.Command{
		Use:   "rotate-sealing",
		Short: "Make a fresh sealing key current (previous keys keep opening prepared and claimed rows, up to a bound)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			ring, err := sealing.LoadRing(filepath.Join(stateDir, "keys"))
			if err != nil {
				return err
			}
			id, err := ring.Rotate()
			if err != nil {
				return err
			}
			return g.print(cmd.OutOrStdout(), map[string]any{"current": id, "maxPrevious": sealing.MaxPreviousKeys},
				fmt.Sprintf("sealing key %s is current; restart or signal every Host sharing this state directory's key ring", id))
		},
	}
	rotate.Flags().StringVar(&stateDir, "state-dir", filepath.Join(".takoform", "state"), "the Host's private state directory")
	cmd.AddCommand(create, rotate, &cobra.Command{
		Use: "revoke ID", Short: "Revoke an API key at once", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			db, err := g.pool(cmd.Context())
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
	return &cobra.Command{
		Use:   "brake deployment|lifecycle on|off",
		Short: "Engage or release a brake",
		Long: `The deployment brake makes every graph-changing mutation (PUT and DELETE of reservations,
activations, workers and endpoints) answer 423 while reads continue. The lifecycle brake stops
runtime restarts.`,
		Args:      cobra.ExactArgs(2),
		ValidArgs: []string{"deployment", "lifecycle"},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			name, state := args[0], args[1]
			if name != "deployment" && name != "lifecycle" {
				return fmt.Errorf("unknown brake %q: deployment or lifecycle", name)
			}
			if state != "on" && state != "off" {
				return fmt.Errorf("brake state must be on or off, not %q", state)
			}
			db, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			var engaged bool
			if err := db.QueryRow(cmd.Context(), store.Q("BrakeSet"), pgx.NamedArgs{"name": name, "engaged": state == "on"}).Scan(&name, &engaged); err != nil {
				return fmt.Errorf("set brake: %w", err)
			}
			return g.print(cmd.OutOrStdout(), map[string]any{"brake": name, "engaged": engaged}, fmt.Sprintf("%s brake %s", name, state))
		},
	}
}
