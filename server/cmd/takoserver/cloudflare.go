package main

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
)

// cloudflareCommand holds what an operator runs against a Cloudflare installation (SPEC 8).
func cloudflareCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cloudflare",
		Short: "Operate the Cloudflare installations of the catalog",
	}
	cmd.AddCommand(installDispatchCommand(g))
	return cmd
}

func installDispatchCommand(g *globals) *cobra.Command {
	var config, installation string
	cmd := &cobra.Command{
		Use:   "install-dispatch --installation NAME --config FILE",
		Short: "Install or update the dispatch worker of a wfp-managed installation",
		Long: `install-dispatch uploads the product's dispatch worker to the installation's Cloudflare account as
its dispatchWorkerName, bound to its routing KV namespace (ROUTES) and its dispatch namespace
(DISPATCHER), or leaves it when it already runs this version with these bindings. Run it once when
the installation is set up and again after each upgrade of takoserver. The wildcard route
*.<baseDomain>/* to the dispatch worker and the base domain's certificate are the operator's
one-time setup. Pass the --config the Host replicas run with; the API token is read from the
installation's apiTokenFile and never printed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			if config == "" {
				return errors.New("--config must name the catalog file the Host runs with")
			}
			cat, err := catalog.Load(config)
			if err != nil {
				return err
			}
			inst, ok := cat.Installations[installation]
			if !ok {
				return fmt.Errorf("installation %q is not in the catalog %s", installation, config)
			}
			done, err := backend.InstallDispatch(cmd.Context(), inst)
			if err != nil {
				return fmt.Errorf("install-dispatch: %w", err)
			}
			if g.output == "json" {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(done)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "installation %s: dispatch worker %s %s on account %s (routing KV namespace %s, dispatch namespace %s, routing cache %d s)\n",
				done.Installation, done.Script, done.Action, done.AccountID, done.RoutingKV, done.DispatchNamespace, done.CacheTTLSeconds)
			return err
		},
	}
	cmd.Flags().StringVar(&config, "config", "", "catalog file (JSON), the one `takoserver serve --config` reads")
	cmd.Flags().StringVar(&installation, "installation", "", "the wfp-managed installation")
	_ = cmd.MarkFlagRequired("installation")
	return cmd
}
