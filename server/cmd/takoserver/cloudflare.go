package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare"
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
			done, err := cloudflare.InstallDispatch(cmd.Context(), inst)
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

// cloudflareEdgeClient is the client of the wfp-managed Ready probe: nil (a plain client) unless
// addr names where every hostname is sent instead (a stand-in's edge), trusting caFile's CA.
func cloudflareEdgeClient(addr, caFile string) (*http.Client, error) {
	if addr == "" {
		if caFile != "" {
			return nil, errors.New("--cloudflare-edge-ca needs --cloudflare-edge")
		}
		return nil, nil
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--cloudflare-edge-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--cloudflare-edge-ca %s holds no PEM certificate", caFile)
		}
		tlsConfig.RootCAs = pool
	}
	var d net.Dialer
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		},
		TLSClientConfig: tlsConfig,
	}}, nil
}
