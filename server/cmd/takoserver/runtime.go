package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/egress"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/orgproc"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/sandbox"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
)

// runtimeCommand is `takoserver runtime`: the runtime node (SPEC 5), and its admin commands.
func runtimeCommand(g *globals) *cobra.Command {
	var cfg runtime.Config
	var edgeFlags edgeLimitFlags
	cmd := &cobra.Command{
		Use:   "runtime",
		Short: "Run the runtime node: workers in workerd, served at their hostnames by its edge",
		Long: `runtime runs a runtime node. It keeps its desired state (scripts, secret deliveries sealed
under its own key, routes, brakes) in its private state directory, runs one workerd process per
incarnation, and serves workers through its edge by Host header. The Host's selfhost backend drives
it over the admin API with the bearer token in <state-dir>/admin-token. It keeps serving while no
Host runs, and serves again after a restart. Interrupt it to stop every workerd process; the desired
state stays for the next start.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := g.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			cfg.Logger = log
			if cfg.Edge.TrustedProxies, err = edge.ParseTrustedProxies(edgeFlags.trustedProxies); err != nil {
				return err
			}
			cfg.Edge.MaxHeaderBytes, cfg.Edge.MaxBodyBytes = edgeFlags.headerKiB<<10, edgeFlags.bodyMiB<<20
			cfg.Ready = func(info runtime.Info) {
				fmt.Fprintf(cmd.ErrOrStderr(), "takoserver runtime: admin API %s (token in %s), edge %s\n", info.AdminURL, info.TokenFile, info.EdgeAddr)
				printEdgeTLS(cmd.ErrOrStderr(), info)
			}
			return runtime.Run(cmd.Context(), cfg)
		},
	}
	cmd.PersistentFlags().StringVar(&cfg.StateDir, "state-dir", runtime.DefaultStateDir, "the runtime's private state directory (SPEC 6.3)")
	cmd.Flags().StringVar(&cfg.SealingKeyFile, "sealing-key-file", os.Getenv("TAKOSERVER_RUNTIME_SEALING_KEY_FILE"),
		"the runtime's own sealing key, outside the state directory (env TAKOSERVER_RUNTIME_SEALING_KEY_FILE; create one with `takoserver runtime init-sealing-key --out FILE`)")
	cmd.Flags().StringVar(&cfg.PreviousSealingKeyFile, "previous-sealing-key-file", "",
		"the sealing key --sealing-key-file replaces: deliveries sealed under it are sealed again under the new key at start, so no worker loses its secrets; drop it once the node has started")
	cmd.Flags().StringVar(&cfg.PoolKeyFile, "pool-key-file", os.Getenv("TAKOSERVER_RUNTIME_POOL_KEY_FILE"),
		"the private key of the node's pool (env TAKOSERVER_RUNTIME_POOL_KEY_FILE; `takoserver nodes init-pool-key` writes one): the node opens with it the secret deliveries the Host sealed to the pool")
	cmd.Flags().StringVar(&cfg.PreviousPoolKeyFile, "previous-pool-key-file", "",
		"the pool key --pool-key-file replaces (a rotation): blobs sealed to it still open until `takoserver nodes rotate-pool-key` has sealed them again to the new key; then drop it")
	cmd.Flags().StringVar(&cfg.AdminListen, "admin-listen", adminapi.DefaultAdminListen, "address of the admin API (a non-loopback address needs --admin-tls-cert and --admin-tls-key), or fd:N for a listening socket the node inherits (systemd's socket activation)")
	cmd.Flags().StringVar(&cfg.EdgeListen, "edge-listen", adminapi.DefaultEdgeListen, "address of the edge that serves workers by Host header, or fd:N for a listening socket the node inherits: it outlives the node's restarts, so none refuses a connection")
	cmd.Flags().DurationVar(&cfg.ListenWait, "listen-wait", 30*time.Second, "how long a listen address in use (the previous process still stopping) is tried again before the start fails")
	cmd.Flags().StringVar(&cfg.Workerd, "workerd", "", "workerd binary (default: $TAKOFORM_WORKERD, .tools/bin/workerd, or workerd on PATH; make workerd installs the pinned one)")
	cmd.Flags().StringVar(&cfg.AdminTLSCert, "admin-tls-cert", "", "TLS certificate (PEM) of the admin API")
	cmd.Flags().StringVar(&cfg.AdminTLSKey, "admin-tls-key", "", "TLS key (PEM) of the admin API")
	cmd.Flags().StringArrayVar(&cfg.EgressDeny, "egress-deny", nil, "a network (CIDR) no worker's fetch() may reach, beyond non-public ranges and this node's own addresses (repeatable)")
	cmd.Flags().IntVar(&cfg.SubrequestLimit, "subrequest-limit", egress.DefaultSubrequestLimit, "concurrent subrequests each worker may have in flight")
	cmd.Flags().IntVar(&cfg.SubrequestsPerRequest, "subrequests-per-request", egress.DefaultSubrequestsPerRequest, "subrequests each request a worker serves may make (its ctx.waitUntil work included, which ends 30 s after the response)")
	cmd.Flags().DurationVar(&cfg.LivenessPeriod, "liveness-period", time.Second, "how often each organization's process is probed; three missed probes in a row kill and restart it, so a worker in a loop stalls its organization's other workers for about three periods")
	cmd.Flags().DurationVar(&cfg.StalledSuspectFor, "stalled-suspect-for", time.Minute, "how long an organization keeps the least CPU weight after liveness killed its process for a stalled worker (from its first missed probe it has it anyway): a loop asked again at once yields the CPU to other organizations from its start; a negative value turns it off")
	cmd.Flags().DurationVar(&cfg.DrainGrace, "drain-grace", 0, "on SIGTERM or SIGINT, how long the node keeps serving after its edge's GET /healthz began to answer 503, so that a load balancer takes it out before it stops (behind one, set it past the balancer's check interval times its failure threshold)")
	cmd.Flags().DurationVar(&cfg.LoadAllowance, "load-allowance", orgproc.LoadAllowance, "how long loading a worker (its compile and top-level code) may hold its organization's process before missed liveness probes count toward a kill: a 10 MiB bundle takes a few hundred milliseconds on an idle node, seconds on a busy one")
	cmd.Flags().IntVar(&cfg.HeapLimitMB, "heap-limit-mb", orgproc.DefaultHeapLimitMB, "V8's heap limit of each worker's isolate in MB; a worker past it ends its organization's process (offerings of this node promise 128)")
	cmd.Flags().DurationVar(&cfg.RecycleSecretsAfter, "recycle-secrets-after", 10*time.Minute, "how long after a worker's secrets were replaced or it was deleted its organization's process is recycled, so that the values leave memory (at most an hour)")
	cmd.Flags().StringVar(&cfg.ChannelsDir, "channels-dir", "", "where each organization's process gets the directory of its sockets to the node; every component of its path must be traversable by the organizations' uids (default: a 0711 directory under the temporary directory named after the state directory)")
	cmd.Flags().StringVar(&cfg.AdminClientCA, "admin-client-ca", "", "CA certificate(s) (PEM): the admin API then requires a client certificate issued by one (mutual TLS; needs --admin-tls-cert)")
	sandboxFlags(cmd.Flags(), &cfg)
	edgeTLSFlags(cmd.Flags(), &cfg.EdgeTLS)
	edgeFlags.add(cmd.Flags(), &cfg.Edge)
	cmd.AddCommand(runtimeBrakeCommand(g, &cfg.StateDir), runtimeStatusCommand(g, &cfg.StateDir), runtimeInitSealingKeyCommand(g),
		runtimeBackupCommand(g, &cfg.StateDir), runtimeRestoreCommand(g, &cfg.StateDir))
	return cmd
}

// runtimeInitSealingKeyCommand is `takoserver runtime init-sealing-key --out FILE`.
func runtimeInitSealingKeyCommand(g *globals) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "init-sealing-key --out FILE",
		Short: "Write a fresh sealing key for a runtime node (never overwrites)",
		Long: `init-sealing-key writes 32 random bytes (standard base64, mode 0600) to FILE: the key under
which a runtime node seals the secret deliveries in its state directory. Keep FILE outside the
state directory (the node refuses to start otherwise) and pass it with --sealing-key-file.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			if out == "" {
				return errors.New("--out FILE is required")
			}
			if err := state.WriteSealingKeyFile(out); err != nil {
				return err
			}
			return g.print(cmd.OutOrStdout(), map[string]any{"sealingKeyFile": out},
				fmt.Sprintf("wrote a runtime sealing key to %s (mode 0600)\nStart the node with --sealing-key-file %s, and keep a copy safe: without it no delivery can be opened.", out, out))
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "where to write the key (outside the runtime's state directory)")
	return cmd
}

// sandboxFlags are the OS sandbox and cgroup ceilings of every incarnation (SPEC 5.1).
func sandboxFlags(fs *pflag.FlagSet, cfg *runtime.Config) {
	cfg.Sandbox.UIDs = sandbox.DefaultUIDRange
	fs.Var(&cfg.Sandbox.UIDs, "sandbox-uid-range", "uids given to organizations, one each, kept across restarts (never root nor the node's own)")
	fs.StringVar(&cfg.Sandbox.Bwrap, "bwrap", "", "bubblewrap binary (default: bwrap on PATH)")
	fs.Var(mebibytes{bytes: &cfg.Sandbox.Limits.MemoryBytes, def: sandbox.DefaultMemoryBytes}, "sandbox-memory-mib", "memory ceiling in MiB of a sandboxed process that names none, swap included (an organization's process has its own: a base and an allowance per worker it holds)")
	fs.Int64Var(&cfg.Sandbox.Limits.Pids, "sandbox-pids", sandbox.DefaultPids, "ceiling on the processes and threads of each organization's process")
	fs.IntVar(&cfg.Sandbox.Limits.CPUWeight, "sandbox-cpu-weight", sandbox.DefaultCPUWeight, "CPU weight of every organization (1-10000; equal for all, so organizations share the CPU equally under contention)")
	fs.Float64Var(&cfg.Sandbox.Limits.CPUMax, "sandbox-cpu-max", 0, "CPUs each organization's process may use at most (0: no ceiling beyond the weight)")
	fs.Var(mebibytes{bytes: &cfg.Sandbox.Limits.OrgMemoryBytes}, "sandbox-org-memory-mib", "memory ceiling in MiB of all of one organization's processes together, and of any one of them (default: a quarter of the machine's memory, at least 1 GiB)")
	fs.Int64Var(&cfg.Sandbox.Limits.OrgPids, "sandbox-org-pids", 0, "ceiling on the tasks of all of one organization's processes together (default: 16 processes' worth)")
	fs.BoolVar(&cfg.InsecureNoSandbox, "insecure-no-sandbox", false, "run every worker as this node's own user, without namespaces or ceilings, where the node cannot sandbox (never for code you do not trust)")
}

// edgeLimitFlags are the edge's limits (SPEC 5.1) that are not a duration.
type edgeLimitFlags struct {
	headerKiB      int
	bodyMiB        int64
	trustedProxies []string
}

func (f *edgeLimitFlags) add(fs *pflag.FlagSet, l *edge.Limits) {
	fs.DurationVar(&l.IdleTimeout, "edge-idle-timeout", edge.DefaultIdleTimeout, "the edge closes a kept-alive client connection idle this long")
	fs.DurationVar(&l.HeaderTimeout, "edge-header-timeout", edge.DefaultHeaderTimeout, "how long a request's line and headers may take to arrive")
	fs.DurationVar(&l.BodyTimeout, "edge-body-timeout", edge.DefaultBodyTimeout, "how long a request's whole body may take to arrive (408 beyond)")
	fs.DurationVar(&l.ResponseTimeout, "edge-response-timeout", edge.DefaultResponseTimeout, "a request's total time: a worker that has not answered by then is answered 504, an answer still streaming is cut off")
	fs.IntVar(&f.headerKiB, "edge-max-header-kib", edge.DefaultMaxHeaderBytes>>10, "request line and headers, in KiB (431 beyond)")
	fs.Int64Var(&f.bodyMiB, "edge-max-body-mib", edge.DefaultMaxBodyBytes>>20, "request body, in MiB, counted as it streams (413 beyond)")
	fs.IntVar(&l.MaxConns, "edge-max-conns", edge.DefaultMaxConns, "client connections the edge holds at once, every listener together (never more than half of what the descriptor limit leaves after 4,096 kept for the node); one more is closed unread")
	fs.IntVar(&l.MaxConnsPerSource, "edge-max-conns-per-source", edge.DefaultMaxConnsPerSource, "client connections of one source address (an IPv6 /64) the edge holds at once; a --trusted-proxy peer is held to the total only")
	fs.StringArrayVar(&f.trustedProxies, "trusted-proxy", nil, "a proxy (CIDR or address) in front of the edge whose X-Forwarded-For/-Proto/-Host, X-Real-IP and Forwarded headers are believed; everyone else's are replaced (repeatable)")
}

// mebibytes is a flag in MiB kept in bytes.
// mebibytes is a flag of a byte count given in MiB. Its default, when it has one, is the flag's
// own (def); zero means its help text says what happens instead.
type mebibytes struct {
	bytes *int64
	def   int64
}

func (m mebibytes) String() string {
	switch {
	case m.bytes != nil && *m.bytes != 0:
		return strconv.FormatInt(*m.bytes>>20, 10)
	case m.def != 0:
		return strconv.FormatInt(m.def>>20, 10)
	}
	return "" // no "(default …)" beside a help text that says what it is
}

func (m mebibytes) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return fmt.Errorf("%q is not a positive number of MiB", s)
	}
	*m.bytes = n << 20
	return nil
}

func (mebibytes) Type() string { return "mib" }

// adminClientFlags are how the runtime's admin commands reach a node.
type adminClientFlags struct {
	url       string
	tokenFile string
	tls       selfhost.Config
}

func (f *adminClientFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.url, "admin-url", adminapi.DefaultAdminURL, "the runtime node's admin API")
	cmd.Flags().StringVar(&f.tokenFile, "token-file", "", "the admin token file (default <state-dir>/admin-token)")
	cmd.Flags().StringVar(&f.tls.CAFile, "ca-file", "", "CA (PEM) that issued the admin API's certificate (https:// admin URL)")
	cmd.Flags().StringVar(&f.tls.ClientCertFile, "client-cert", "", "client certificate (PEM) for an admin API that requires one")
	cmd.Flags().StringVar(&f.tls.ClientKeyFile, "client-key", "", "key (PEM) of --client-cert")
}

func (f *adminClientFlags) client(stateDir string) (*selfhost.Client, error) {
	cfg := f.tls
	cfg.URL, cfg.TokenFile = f.url, f.tokenFile
	if cfg.TokenFile == "" {
		cfg.TokenFile = filepath.Join(stateDir, adminapi.TokenFileName)
	}
	return selfhost.NewFromConfig(cfg)
}

func runtimeBrakeCommand(g *globals, stateDir *string) *cobra.Command {
	var f adminClientFlags
	var scope adminapi.BrakeScope
	cmd := &cobra.Command{
		Use:   "brake lifecycle on|off",
		Short: "Engage or release the runtime's lifecycle brake (stops restarts; never stops serving)",
		Long: `With the lifecycle brake on, a workerd process in its scope that dies stays down; what is
serving keeps serving. The scope is the whole runtime, one organization (--org), or one worker
(--org, --space and --worker). Releasing a brake releases exactly that scope.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			if args[0] != "lifecycle" {
				return fmt.Errorf("the runtime has one brake, lifecycle, not %q (the deployment brake is the Host's: takoserver brake deployment)", args[0])
			}
			if args[1] != "on" && args[1] != "off" {
				return fmt.Errorf("brake state must be on or off, not %q", args[1])
			}
			if !scope.Valid() {
				return errors.New("scope: --org alone, or --org with both --space and --worker, or nothing for the whole runtime")
			}
			c, err := f.client(*stateDir)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			brakes, err := c.SetLifecycleBrake(ctx, args[1] == "on", scope)
			if err != nil {
				return err
			}
			return g.print(cmd.OutOrStdout(), map[string]any{"brake": "lifecycle", "engaged": args[1] == "on", "scope": scope, "lifecycle": brakes.Lifecycle},
				fmt.Sprintf("lifecycle brake %s (%s); engaged: %s", args[1], scopeName(scope), scopesText(brakes.Lifecycle)))
		},
	}
	f.add(cmd)
	cmd.Flags().StringVar(&scope.Organization, "org", "", "organization label of the scripts in scope")
	cmd.Flags().StringVar(&scope.Space, "space", "", "space label (with --org and --worker)")
	cmd.Flags().StringVar(&scope.Worker, "worker", "", "worker label (with --org and --space)")
	return cmd
}

func runtimeStatusCommand(g *globals, stateDir *string) *cobra.Command {
	var f adminClientFlags
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the runtime's scripts, routes, incidents and brakes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			c, err := f.client(*stateDir)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			st, err := c.Status(ctx)
			if err != nil {
				return err
			}
			var b strings.Builder
			for _, s := range st.Scripts {
				fmt.Fprintf(&b, "script %s generation %d: ready=%t reason=%s", s.ScriptName, s.Generation, s.Ready, s.Reason)
				if s.Incarnation != nil {
					fmt.Fprintf(&b, " incarnation=%s state=%s restarts=%d", s.Incarnation.ID, s.Incarnation.State, s.Incarnation.Restarts)
				}
				if s.Incident {
					fmt.Fprintf(&b, " INCIDENT: %s", s.IncidentMessage)
				}
				b.WriteByte('\n')
			}
			for _, r := range st.Routes {
				fmt.Fprintf(&b, "route %s -> %s (endpoint %s): ready=%t\n", r.Hostname, r.ScriptName, r.EndpointUID, r.Ready)
			}
			fmt.Fprintf(&b, "lifecycle brakes: %s\nsandbox: %s", scopesText(st.Brakes.Lifecycle), st.Sandbox)
			return g.print(cmd.OutOrStdout(), st, b.String())
		},
	}
	f.add(cmd)
	return cmd
}

func runtimeBackupCommand(g *globals, stateDir *string) *cobra.Command {
	var f adminClientFlags
	var out string
	cmd := &cobra.Command{
		Use:   "backup --out FILE",
		Short: "Write a consistent backup of a running node's state (take one before each upgrade)",
		Long: `backup asks a running node for a consistent snapshot of its state directory and writes it to
FILE (a gzipped tar, mode 0600, never overwritten): its scripts, routes, brakes and bundles, and
its secret deliveries sealed as they are at rest (under the node's sealing key, which is not in
it, so keep the key file too). The admin token is not in it. The node keeps serving meanwhile.

A restore (takoserver runtime restore) is how a node goes back to an earlier runtime release, or
comes back from a lost disk: it serves what the backup held at once, and the Hosts' janitors then
put it back to what their ledger says (README, "Restores and the node reconciler"); secrets
delivered after the backup are not in it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			if out == "" {
				return errors.New("--out FILE is required")
			}
			c, err := f.client(*stateDir)
			if err != nil {
				return err
			}
			file, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return fmt.Errorf("backup: %w (a backup never overwrites a file)", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Minute)
			defer cancel()
			err = c.Backup(ctx, file)
			if closeErr := file.Close(); err == nil {
				err = closeErr
			}
			if err != nil {
				_ = os.Remove(out)
				return fmt.Errorf("backup: %w", err)
			}
			info, err := os.Stat(out)
			if err != nil {
				return err
			}
			return g.print(cmd.OutOrStdout(), map[string]any{"backup": out, "bytes": info.Size()},
				fmt.Sprintf("wrote the runtime node's backup to %s (%d bytes)", out, info.Size()))
		},
	}
	f.add(cmd)
	cmd.Flags().StringVar(&out, "out", "", "where to write the backup")
	return cmd
}

func runtimeRestoreCommand(g *globals, stateDir *string) *cobra.Command {
	var from string
	var replace bool
	cmd := &cobra.Command{
		Use:   "restore --from FILE [--state-dir DIR] [--replace]",
		Short: "Unpack a backup into a stopped node's state directory",
		Long: `restore unpacks a backup (takoserver runtime backup) into the state directory, which no running
node may hold. The directory is created (0700) when absent; an existing one keeps its admin token,
so the Hosts' token files stay right, and one that already holds a desired state needs --replace.
Start the node on it with the sealing key it had when the backup was taken. The restored node
serves what the backup held; the Hosts' janitors then write back what it lacks and take down what
their ledger has deleted since.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			if from == "" {
				return errors.New("--from FILE is required")
			}
			file, err := os.Open(from)
			if err != nil {
				return err
			}
			defer file.Close()
			if err := state.Restore(file, *stateDir, state.RestoreOptions{Replace: replace}); err != nil {
				return err
			}
			return g.print(cmd.OutOrStdout(), map[string]any{"restored": from, "stateDir": *stateDir},
				fmt.Sprintf("restored %s into %s; start the node on it", from, *stateDir))
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "the backup to restore")
	cmd.Flags().BoolVar(&replace, "replace", false, "replace the desired state the directory already holds")
	return cmd
}

func scopeName(s adminapi.BrakeScope) string {
	switch {
	case s.Worker != "":
		return fmt.Sprintf("worker %s/%s/%s", s.Organization, s.Space, s.Worker)
	case s.Organization != "":
		return "organization " + s.Organization
	default:
		return "whole runtime"
	}
}

func scopesText(scopes []adminapi.BrakeScope) string {
	if len(scopes) == 0 {
		return "none"
	}
	names := make([]string, len(scopes))
	for i, s := range scopes {
		names[i] = scopeName(s)
	}
	return strings.Join(names, ", ")
}
