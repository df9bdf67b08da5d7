package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/poolkey"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// nodesCommand is `takoserver nodes`: the runtime nodes of a selfhost installation's pool (SPEC
// 6.2).
func nodesCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "The runtime nodes of a selfhost pool",
	}
	cmd.AddCommand(nodesListCommand(g), nodesAddCommand(g), nodesDrainCommand(g), nodesRemoveCommand(g), nodesRetireCommand(g), nodesSetFenceCommand(g), nodesInitPoolKeyCommand(g), nodesRotatePoolKeyCommand(g))
	return cmd
}

// rotateReport is what nodes rotate-pool-key prints with --output json.
type rotateReport struct {
	Installation string `json:"installation"`
	PoolKey      string `json:"poolPublicKey"`
	Resealed     int    `json:"resealed"`
	Changed      int    `json:"changed"`
}

// nodesRotatePoolKeyCommand is `takoserver nodes rotate-pool-key --config FILE --installation NAME`.
func nodesRotatePoolKeyCommand(g *globals) *cobra.Command {
	var config, installation string
	cmd := &cobra.Command{
		Use:   "rotate-pool-key --config FILE --installation NAME",
		Short: "Seal every pool blob of an installation again to its new pool key, through its nodes",
		Long: `rotate-pool-key seals every delivery blob the Host keeps for a selfhost installation again to the
pool's new key. The Host cannot open a blob: the node does it, with the key it replaces, and answers
the blob sealed again. In order:

  1. takoserver nodes init-pool-key --pool NAME --out NEW
  2. restart each of the installation's nodes with --pool-key-file NEW --previous-pool-key-file OLD
  3. put NEW's public key in the catalog's "poolPublicKey", and restart the Host replicas
  4. takoserver nodes rotate-pool-key --config CATALOG --installation NAME
  5. restart each node with --pool-key-file NEW alone, and destroy OLD

It refuses to run until every node of the pool that may route holds the key the catalog names
(step 2 and 3); the first of them seals the blobs again. A blob whose row
changed meanwhile (a newer delivery settled) is left as it is, and counted. Run it again to be sure:
a blob already sealed to the new key is sealed to it again, harmlessly.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			if config == "" || installation == "" {
				return errors.New("--config FILE and --installation NAME are required")
			}
			cat, err := catalog.Load(config)
			if err != nil {
				return err
			}
			inst, ok := cat.Installations[installation]
			if !ok || inst.Pack != catalog.PackSelfhost || inst.PoolPublicKey == "" {
				return fmt.Errorf("the catalog has no selfhost installation %q with a poolPublicKey", installation)
			}
			ctx := cmd.Context()
			db, err := g.pool(ctx)
			if err != nil {
				return err
			}
			defer db.Close()
			urls, err := routingNodes(ctx, db, inst)
			if err != nil {
				return err
			}
			// Every member that may route must hold the new key before any blob is sealed to it.
			var c *selfhost.Client
			for _, url := range urls {
				nc, err := selfhost.NewFromConfig(selfhost.Config{URL: url, TokenFile: inst.RuntimeTokenFile,
					CAFile: inst.RuntimeCAFile, ClientCertFile: inst.RuntimeClientCertFile, ClientKeyFile: inst.RuntimeClientKeyFile})
				if err != nil {
					return err
				}
				held, err := nc.Pool(ctx)
				if err != nil {
					return fmt.Errorf("ask the node at %s which pool key it holds: %w", url, err)
				}
				if held.Pool != installation || held.PublicKey != inst.PoolPublicKey {
					return fmt.Errorf("the node at %s holds %q of pool %q, not the catalog's %s: restart it with --pool-key-file NEW --previous-pool-key-file OLD first",
						url, held.PublicKey, held.Pool, inst.PoolPublicKey)
				}
				if c == nil {
					c = nc
				}
			}
			q := dbsqlc.New(db)
			rows, err := q.PoolBlobsOfInstallation(ctx, &installation)
			if err != nil {
				return err
			}
			out := rotateReport{Installation: installation, PoolKey: inst.PoolPublicKey}
			for _, r := range rows {
				again, err := c.Reseal(ctx, adminapi.Reseal{WorkerUID: r.WorkerUID.String(), DeliveryID: r.MaterialSetID.String(), Sealed: r.PoolBlob})
				if err != nil {
					return fmt.Errorf("seal the blob of delivery %s again (%d sealed again so far; run it again): %w", r.MaterialSetID, out.Resealed, err)
				}
				n, err := q.PoolBlobReplace(ctx, dbsqlc.PoolBlobReplaceParams{Sealed: again.Sealed, OrganizationID: r.OrganizationID, OperationID: r.OperationID, Previous: r.PoolBlob})
				if err != nil {
					return err
				}
				if n == 0 {
					out.Changed++
					continue
				}
				out.Resealed++
			}
			return g.print(cmd.OutOrStdout(), out, fmt.Sprintf("sealed %d pool blobs of installation %s again to %s (%d changed meanwhile and were left as they are)\n"+
				"Once the node has restarted with --pool-key-file NEW alone, the old key may be destroyed.", out.Resealed, installation, inst.PoolPublicKey, out.Changed))
		},
	}
	cmd.Flags().StringVar(&config, "config", os.Getenv("TAKOSERVER_CONFIG"), "the catalog the Host replicas run with (env TAKOSERVER_CONFIG)")
	cmd.Flags().StringVar(&installation, "installation", "", "the selfhost installation whose pool key was rotated")
	return cmd
}

// nodesInitPoolKeyCommand is `takoserver nodes init-pool-key --pool NAME --out FILE`.
func nodesInitPoolKeyCommand(g *globals) *cobra.Command {
	var pool, out string
	cmd := &cobra.Command{
		Use:   "init-pool-key --pool NAME --out FILE",
		Short: "Write a new key pair for a pool of runtime nodes (never overwrites)",
		Long: `init-pool-key writes a pool's private key (X25519, for HPKE) to FILE, a new 0600 file in a 0700
directory, and prints its public key. NAME is the selfhost installation's name in the catalog.

Give FILE to every node of the pool (takoserver runtime --pool-key-file FILE), as the Host is given
its sealing key, and put the public key in the installation's "poolPublicKey". From then on the Host
seals each secret delivery to the pool when it hands it over, keeps that blob (which it can never
open again) in PostgreSQL, and names it again to a node that lost its state: a node replaced or
restored gets its workers' secrets back with no tenant action.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			if pool == "" || out == "" {
				return errors.New("--pool NAME and --out FILE are required")
			}
			key, err := poolkey.Generate(pool)
			if err != nil {
				return err
			}
			if err := poolkey.WriteFile(out, key); err != nil {
				return err
			}
			public := key.Public().String()
			return g.print(cmd.OutOrStdout(), map[string]any{"pool": pool, "poolKeyFile": out, "poolPublicKey": public},
				fmt.Sprintf("wrote the private key of pool %s to %s (mode 0600)\nIn the catalog, on installation %q: \"poolPublicKey\": %q\n"+
					"Start every node of the pool with --pool-key-file %s, and keep a copy safe: without it no pool delivery can be opened.",
					pool, out, pool, public, out))
		},
	}
	cmd.Flags().StringVar(&pool, "pool", "", "the selfhost installation's name in the catalog")
	cmd.Flags().StringVar(&out, "out", "", "where to write the private key (a new file in a 0700 directory)")
	return cmd
}
