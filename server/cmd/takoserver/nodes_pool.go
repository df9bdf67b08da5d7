package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/nodepool"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// poolFlags are the flags every command on a pool's membership takes.
type poolFlags struct{ config, installation string }

func (f *poolFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.config, "config", os.Getenv("TAKOSERVER_CONFIG"), "the catalog the Host replicas run with (env TAKOSERVER_CONFIG)")
	cmd.Flags().StringVar(&f.installation, "installation", "", "the selfhost installation whose pool this is")
}

// load is the installation the flags name, which must be a selfhost one.
func (f *poolFlags) load() (catalog.Installation, error) {
	if f.config == "" || f.installation == "" {
		return catalog.Installation{}, errors.New("--config FILE and --installation NAME are required")
	}
	cat, err := catalog.Load(f.config)
	if err != nil {
		return catalog.Installation{}, err
	}
	inst, ok := cat.Installations[f.installation]
	if !ok || inst.Pack != catalog.PackSelfhost {
		return catalog.Installation{}, fmt.Errorf("the catalog has no selfhost installation %q", f.installation)
	}
	return inst, nil
}

// open loads the installation the flags name and opens the database, as every command on a
// pool's membership does first. The caller closes the pool.
func (f *poolFlags) open(cmd *cobra.Command, g *globals) (catalog.Installation, *pgxpool.Pool, error) {
	inst, err := f.load()
	if err != nil {
		return catalog.Installation{}, nil, err
	}
	db, err := g.outputAndPool(cmd.Context())
	return inst, db, err
}

// operator names who ran a command, for the pool's event ledger: --by, or the user and machine.
func operator(by string) string {
	if by != "" {
		return by
	}
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return name + "@" + host
}

// routingNodes are the admin URLs of the pool's nodes that may route.
func routingNodes(ctx context.Context, db dbsqlc.DBTX, inst catalog.Installation) ([]string, error) {
	members, err := nodepool.Members{DB: db}.Members(ctx, inst)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range members {
		if m.MayRoute() {
			out = append(out, m.URL)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("every node of pool %s was retired: add one first (takoserver nodes add)", inst.Name)
	}
	return out, nil
}

// nodesListCommand is `takoserver nodes list`.
func nodesListCommand(g *globals) *cobra.Command {
	var f poolFlags
	cmd := &cobra.Command{
		Use:   "list --config FILE --installation NAME",
		Short: "List the nodes of a selfhost pool and their states",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			inst, db, err := f.open(cmd, g)
			if err != nil {
				return err
			}
			defer db.Close()
			nodes, err := nodepool.List(cmd.Context(), db, inst)
			if err != nil {
				return err
			}
			var text strings.Builder
			tw := tabwriter.NewWriter(&text, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tSTATE\tEPOCH\tURL\tFENCED SINCE")
			for _, n := range nodes {
				fenced := "-"
				if n.FencedSince != nil {
					fenced = n.FencedSince.UTC().Format(time.RFC3339)
				}
				state := n.State
				if n.Implicit {
					state += " (the catalog's runtimeUrl)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", n.Name, state, n.Epoch, n.URL, fenced)
			}
			tw.Flush()
			return g.print(cmd.OutOrStdout(), map[string]any{"installation": inst.Name, "nodes": nodes}, strings.TrimRight(text.String(), "\n"))
		},
	}
	f.register(cmd)
	return cmd
}

// nodesAddCommand is `takoserver nodes add NAME --url URL`.
func nodesAddCommand(g *globals) *cobra.Command {
	var f poolFlags
	var url, by string
	cmd := &cobra.Command{
		Use:   "add NAME --url URL --config FILE --installation NAME",
		Short: "Add a runtime node to a selfhost pool",
		Long: `add makes the runtime node whose admin API is at URL a member of the pool, joining. It takes the
installation's runtimeTokenFile and TLS files, as every member does. From then on every change of
the installation's workers and endpoints goes to it, and the Host's node reconciler (a step of the
janitor) writes it every live worker and route and names it every kept pool delivery again, so
that its workers' secrets come back with no tenant action. Once one sweep finds it up to date, it
reads serving.

Every worker of a pool runs on every member: a worker is Ready when it is Ready on every serving
member, and its deletion completes when every member that may route confirmed it. A pool of
several nodes needs the catalog's poolPublicKey (secrets reach the nodes sealed to it).

The node must answer, and hold the pool's key when the catalog names one. Give it the
installation's admin token before its first start (copy the token file to <state-dir>/admin-token,
0600), and the pool's key (--pool-key-file).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			inst, err := f.load()
			if err != nil {
				return err
			}
			if url == "" {
				return errors.New("--url URL (the node's admin API) is required")
			}
			ctx := cmd.Context()
			probe := inst
			probe.RuntimeURL = url
			if err := catalog.ValidateRuntimeChannel(&probe); err != nil {
				return err
			}
			c, err := selfhost.NewFromConfig(selfhost.Config{URL: url, TokenFile: inst.RuntimeTokenFile,
				CAFile: inst.RuntimeCAFile, ClientCertFile: inst.RuntimeClientCertFile, ClientKeyFile: inst.RuntimeClientKeyFile})
			if err != nil {
				return err
			}
			st, err := c.Status(ctx)
			if err != nil {
				return fmt.Errorf("ask the node at %s what it holds: %w (nothing was changed)", url, err)
			}
			held := 0
			for _, sc := range st.Scripts {
				if sc.Present {
					held++
				}
			}
			for _, r := range st.Routes {
				if r.Present {
					held++
				}
			}
			if held > 0 {
				return fmt.Errorf("the node at %s holds %d scripts and routes from before: a node joins a pool empty (start it on a new state directory; nothing was changed)", url, held)
			}
			if inst.PoolPublicKey != "" {
				held, err := c.Pool(ctx)
				if err != nil {
					return fmt.Errorf("ask the node which pool key it holds: %w (nothing was changed)", err)
				}
				if held.Pool != inst.Name || (held.PublicKey != inst.PoolPublicKey && held.PreviousPublicKey != inst.PoolPublicKey) {
					return fmt.Errorf("the node at %s holds pool %q's key %q, not the catalog's %s: start it with the pool's --pool-key-file (nothing was changed)",
						url, held.Pool, held.PublicKey, inst.PoolPublicKey)
				}
			}
			db, err := g.outputAndPool(ctx)
			if err != nil {
				return err
			}
			defer db.Close()
			n, err := nodepool.Add(ctx, db, inst, args[0], url, operator(by))
			if err != nil {
				return err
			}
			text := fmt.Sprintf("node %s (%s) joined pool %s at epoch %d; the node reconciler brings it up to date, then it reads serving (takoserver nodes list)",
				n.Name, n.URL, inst.Name, n.Epoch)
			// Told at once that it is joining: its health check fails until it serves.
			if members, err := (nodepool.Members{DB: db}).Members(ctx, inst); err == nil {
				if _, err := selfhost.Tell(ctx, inst, members, n.Name); err != nil {
					text += fmt.Sprintf(" (telling it it joins failed: %v; the node reconciler tells it)", err)
				}
			}
			if lacking, err := dbsqlc.New(db).WorkersWithoutPoolBlob(ctx, inst.Name); err == nil && lacking > 0 {
				// Delivered before the pool key was set: the Host kept nothing to name again.
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: %d live workers of %s hold secrets delivered before the pool key was set; the new node cannot get them, and those workers read not Ready on it until their runtime inputs are delivered again (bump bindings_wo_version)\n",
					lacking, inst.Name)
			}
			return g.print(cmd.OutOrStdout(), n, text)
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&url, "url", "", "the node's admin API (as runtimeUrl would name it)")
	cmd.Flags().StringVar(&by, "by", "", "who adds it, for the pool's ledger (default: user@host)")
	return cmd
}

// nodesDrainCommand is `takoserver nodes drain NAME`.
func nodesDrainCommand(g *globals) *cobra.Command {
	var f poolFlags
	var by string
	var lastNode bool
	cmd := &cobra.Command{
		Use:   "drain NAME --config FILE --installation NAME",
		Short: "Take a node out of its pool's service: its health check fails, then it serves nothing",
		Long: `drain starts a node's way out of the pool. It leaves the Ready set at once, its edge's GET /healthz
fails as soon as it is told (at once, and again by every sweep of the node reconciler), and it keeps
serving workers for the pool's fenceSeconds (default 300) while load balancers take it out; then
its edge serves nothing. It still receives every change and must confirm every absence, so
deletions wait for it until it is removed or retired. It refuses the pool's last serving node
unless --last-node says so.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			inst, db, err := f.open(cmd, g)
			if err != nil {
				return err
			}
			defer db.Close()
			ctx := cmd.Context()
			n, err := nodepool.Drain(ctx, db, inst, args[0], operator(by), lastNode)
			if err != nil {
				return err
			}
			members, err := nodepool.Members{DB: db}.Members(ctx, inst)
			if err != nil {
				return err
			}
			tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if _, err := selfhost.Tell(tctx, inst, members, n.Name); err != nil {
				return fmt.Errorf("node %s is draining in the pool, but telling it failed: %w (run drain again; the node reconciler tells it too)", n.Name, err)
			}
			fence, _, err := nodepool.Fence(ctx, db, inst)
			if err != nil {
				return err
			}
			return g.print(cmd.OutOrStdout(), n, fmt.Sprintf("node %s of pool %s is draining: its health check fails now, and it stops serving in %d s",
				n.Name, inst.Name, int64(fence.Seconds())))
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&by, "by", "", "who drains it, for the pool's ledger (default: user@host)")
	cmd.Flags().BoolVar(&lastNode, "last-node", false, "drain the pool's last serving node: every worker of the pool stops once the fence has passed")
	return cmd
}

// nodesRemoveCommand is `takoserver nodes remove NAME`.
func nodesRemoveCommand(g *globals) *cobra.Command {
	var f poolFlags
	var by string
	cmd := &cobra.Command{
		Use:   "remove NAME --config FILE --installation NAME",
		Short: "Take a drained node out of its pool, once it holds nothing",
		Long: `remove ends a drain: once the node has been draining for the pool's fenceSeconds and its edge
serves nothing, it takes every script and route off the node (each by its worker's or endpoint's
UID), reads back that the node holds nothing, and takes the node out of the pool. From then on its
absences are not needed. The node is told it was removed, and serves nothing until it is wiped and
added again under a new name.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			inst, db, err := f.open(cmd, g)
			if err != nil {
				return err
			}
			defer db.Close()
			ctx := cmd.Context()
			n, err := nodepool.Removable(ctx, db, inst, args[0])
			if err != nil {
				return err
			}
			c, err := selfhost.NewFromConfig(selfhost.Config{URL: n.URL, TokenFile: inst.RuntimeTokenFile,
				CAFile: inst.RuntimeCAFile, ClientCertFile: inst.RuntimeClientCertFile, ClientKeyFile: inst.RuntimeClientKeyFile})
			if err != nil {
				return err
			}
			place, err := c.Membership(ctx)
			if err != nil {
				return fmt.Errorf("ask node %s at %s whether it still serves: %w (nothing was changed; a node that never answers again is retired: nodes retire --lost)", n.Name, n.URL, err)
			}
			if place.Routes {
				fence, _, err := nodepool.Fence(ctx, db, inst)
				if err != nil {
					return err
				}
				return fmt.Errorf("node %s still serves workers (it was not told of its drain, or its fence has not passed on its clock): run nodes drain %s again and wait %d s (nothing was changed)",
					n.Name, n.Name, int64(fence.Seconds()))
			}
			takenOff, err := takeEverythingOff(ctx, c)
			if err != nil {
				return fmt.Errorf("take everything off node %s: %w (%d objects taken off; run remove again)", n.Name, err, takenOff)
			}
			// A Host replica may still hold a read of the pool from before the drain: once every
			// such read has expired, the node must still hold nothing.
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(nodepool.CacheTTL + time.Second):
			}
			again, err := takeEverythingOff(ctx, c)
			if err != nil || again > 0 {
				return fmt.Errorf("node %s was written again after everything was taken off it (%d objects; %v): run remove again (it is not removed)", n.Name, again, err)
			}
			removed, err := nodepool.Remove(ctx, db, inst, n.Name, operator(by), takenOff)
			if err != nil {
				return err
			}
			members, err := nodepool.Members{DB: db}.Members(ctx, inst)
			if err == nil {
				_, err = selfhost.Tell(ctx, inst, members, removed.Name)
			}
			note := ""
			if err != nil {
				note = fmt.Sprintf(" (telling it failed: %v; the node reconciler tells it when it answers)", err)
			}
			return g.print(cmd.OutOrStdout(), removed, fmt.Sprintf("node %s left pool %s: %d scripts and routes taken off it, and it holds nothing%s", removed.Name, inst.Name, takenOff, note))
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&by, "by", "", "who removes it, for the pool's ledger (default: user@host)")
	return cmd
}

// takeEverythingOff deletes every script and route the node holds, each by its own UID, and
// reads back that it holds nothing. It answers how many it took off.
func takeEverythingOff(ctx context.Context, c *selfhost.Client) (int, error) {
	st, err := c.Status(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range st.Routes {
		if r.Present {
			if _, err := c.DeleteRoute(ctx, r.Hostname, r.ScriptName, r.EndpointUID); err != nil {
				return n, fmt.Errorf("route %s: %w", r.Hostname, err)
			}
			n++
		}
	}
	for _, sc := range st.Scripts {
		if sc.Present {
			if _, err := c.DeleteScript(ctx, sc.ScriptName, sc.WorkerUID); err != nil {
				return n, fmt.Errorf("script %s: %w", sc.ScriptName, err)
			}
			n++
		}
	}
	st, err = c.Status(ctx)
	if err != nil {
		return n, err
	}
	for _, sc := range st.Scripts {
		if sc.Present {
			return n, fmt.Errorf("it holds script %s again (a change was written to it meanwhile)", sc.ScriptName)
		}
	}
	for _, r := range st.Routes {
		if r.Present {
			return n, fmt.Errorf("it holds route %s again (a change was written to it meanwhile)", r.Hostname)
		}
	}
	return n, nil
}

// nodesSetFenceCommand is `takoserver nodes set-fence SECONDS`.
func nodesSetFenceCommand(g *globals) *cobra.Command {
	var f poolFlags
	var by string
	cmd := &cobra.Command{
		Use:   "set-fence SECONDS --config FILE --installation NAME",
		Short: "Change the pool's fenceSeconds for every Host replica and node command",
		Long: `set-fence changes how long the pool waits for a node out of DNS and the load balancers: a
drained node serves on that long, and a lost node is retired only that long after it was fenced.
The pool keeps one value in the database, recorded from the catalog by its first node command, so
that every Host replica and every command uses the same one whatever their catalogs say; members
are told the new value at the next sweep. Set the catalogs' fenceSeconds to it too.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			seconds, err := strconv.ParseInt(args[0], 10, 32)
			if err != nil || seconds < 1 {
				return fmt.Errorf("the fence is a whole number of seconds, at least 1 (got %q)", args[0])
			}
			inst, db, err := f.open(cmd, g)
			if err != nil {
				return err
			}
			defer db.Close()
			was, err := nodepool.SetFence(cmd.Context(), db, inst, time.Duration(seconds)*time.Second, operator(by))
			if err != nil {
				return err
			}
			out := map[string]any{"installation": inst.Name, "fenceSeconds": seconds, "was": int64(was.Seconds())}
			return g.print(cmd.OutOrStdout(), out, fmt.Sprintf("pool %s: fenceSeconds %d (was %d); members are told at the next sweep", inst.Name, seconds, int64(was.Seconds())))
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&by, "by", "", "who changes it, kept beside it (default: user@host)")
	return cmd
}

// nodesRetireCommand is `takoserver nodes retire --lost NAME --fenced-since TIME`.
func nodesRetireCommand(g *globals) *cobra.Command {
	var f poolFlags
	var lost, fencedSince, by string
	var lastNode bool
	cmd := &cobra.Command{
		Use:   "retire --lost NAME --fenced-since TIME --config FILE --installation NAME",
		Short: "Take a node that will never answer again out of a selfhost pool",
		Long: `retire --lost is for a runtime node that is gone for good (its machine or disk lost). By running it
you attest that the node has been fenced since TIME: out of DNS and every load balancer, so that no
client can reach its edge. The Host refuses before TIME plus the pool's fenceSeconds (default 300),
records who attested it and when, and moves the pool's epoch on. It refuses a node that answers
(stop it first), and the pool's last node that may route without --last-node.

From then on the node's absences count as confirmed: its workers' and endpoints' deletions complete
(tofu destroy works, and a worker can move to another offering), and their origins are released
under the usual witnesses. Add a node in its place (takoserver nodes add) to serve them again: the
reconciler writes it every live worker and route, and their kept pool deliveries.

A retired node must never serve again: wipe its state directory before it is started anywhere.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			inst, err := f.load()
			if err != nil {
				return err
			}
			if lost == "" || fencedSince == "" {
				return errors.New("--lost NAME and --fenced-since TIME (RFC 3339) are required: only a node lost for good can be retired")
			}
			since, err := time.Parse(time.RFC3339, fencedSince)
			if err != nil {
				return fmt.Errorf("--fenced-since %q is not an RFC 3339 time (2026-12-04T17:00:00Z)", fencedSince)
			}
			ctx := cmd.Context()
			db, err := g.outputAndPool(ctx)
			if err != nil {
				return err
			}
			defer db.Close()
			members, err := nodepool.Members{DB: db}.Members(ctx, inst)
			if err != nil {
				return err
			}
			for _, m := range members {
				if m.Name != lost || !m.MayRoute() {
					continue
				}
				// A node that answers is not lost: its absences must be its own. A refusal of the
				// token is an answer; a node that cannot be reached, or a proxy in front of it
				// answering 5xx, is not.
				c, err := selfhost.NewFromConfig(selfhost.Config{URL: m.URL, TokenFile: inst.RuntimeTokenFile,
					CAFile: inst.RuntimeCAFile, ClientCertFile: inst.RuntimeClientCertFile, ClientKeyFile: inst.RuntimeClientKeyFile})
				if err != nil {
					return err
				}
				c.Attempts = 1
				pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				_, err = c.Status(pctx)
				cancel()
				var refused *selfhost.ProblemError
				if err == nil || (errors.As(err, &refused) && refused.StatusCode < 500) {
					return fmt.Errorf("node %s answers at %s: it is not lost. Stop it (and wipe its state directory) first, or drain and remove it (nothing was changed)", lost, m.URL)
				}
			}
			n, err := nodepool.Retire(ctx, db, inst, lost, since, operator(by), lastNode)
			if err != nil {
				return err
			}
			return g.print(cmd.OutOrStdout(), n, fmt.Sprintf("node %s (%s) of pool %s is retired as lost, fenced since %s; the pool's epoch is now %d. Its absences count as confirmed from now on.",
				n.Name, n.URL, inst.Name, n.FencedSince.UTC().Format(time.RFC3339), n.Epoch))
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&lost, "lost", "", "the node that is lost for good")
	cmd.Flags().StringVar(&fencedSince, "fenced-since", "", "since when it has been out of DNS and every load balancer (RFC 3339)")
	cmd.Flags().StringVar(&by, "by", "", "who attests it, for the pool's ledger (default: user@host)")
	cmd.Flags().BoolVar(&lastNode, "last-node", false, "retire the pool's last node that may route (its workers stop until a node is added)")
	return cmd
}
