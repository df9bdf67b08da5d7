package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/takoform/terraform-provider-takoform/internal/poolkey"
)

// nodesCommand is `takoserver nodes`: the runtime nodes of a selfhost installation's pool (SPEC
// 6.2).
func nodesCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "The runtime nodes of a selfhost pool",
	}
	cmd.AddCommand(nodesInitPoolKeyCommand(g))
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
