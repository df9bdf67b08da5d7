// Command cfstandin runs the Cloudflare API stand-in (internal/cloudflare/cfstandin) on its own,
// so that a catalog's apiBaseUrl can point at it (make demo-cloudflare) and anyone can try the
// Cloudflare packs without an account or the internet:
//
//	go run ./tools/cfstandin --listen 127.0.0.1:8787
//
// It prints, one KEY=VALUE a line, the API base URL, the edge address every worker hostname must
// resolve to (plain HTTP and TLS on one port), the edge CA certificate file, the token file and
// the account's settings, then serves until interrupted. The token is read from --token-file
// (which must be a 0600 file) or generated and written to a 0600 file in the state directory; it
// is never printed. Faults are armed and state is read over the admin routes
// (POST /__standin/faults, POST /__standin/block, GET /__standin/state, with the same token).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/cloudflare/cfstandin"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "cfstandin:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("cfstandin", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8787", "address of the API (base URL http://ADDR/client/v4/)")
	edgeListen := fs.String("edge-listen", "127.0.0.1:0", "address of the edge that serves worker hostnames")
	stateDir := fs.String("state-dir", "", "private directory (0700) for the generated token and the edge CA (default: a new temporary one)")
	tokenFile := fs.String("token-file", "", "file (mode 0600) holding the API token to accept (default: generate one into the state directory)")
	accountID := fs.String("account-id", "", "account id (default: random)")
	accountSubdomain := fs.String("account-subdomain", "takoform-demo", "the account's workers.dev subdomain (empty: none set up)")
	dispatchNamespace := fs.String("dispatch-namespace", "takoform", "dispatch namespace of the wfp-managed installation")
	routingKV := fs.String("routing-kv-namespace", "", "routing KV namespace id (default: random)")
	baseDomain := fs.String("base-domain", "workers.takoform.test", "base domain the wfp-managed edge serves")
	kvStale := fs.Duration("kv-stale", 60*time.Second, "how long edge reads of KV keep returning the old value")
	rateLimit := fs.Int("rate-limit", 1200, "requests per rate window per token")
	rateWindow := fs.Duration("rate-window", 5*time.Minute, "rate window")
	rateBlock := fs.Duration("rate-block", 5*time.Minute, "how long every call is refused after the limit is passed")
	workerdPath := fs.String("workerd", "", "workerd binary (default: $TAKOFORM_WORKERD, .tools/bin/workerd, PATH)")
	if err := fs.Parse(args); err != nil {
		return err
	}

	dir := *stateDir
	if dir == "" {
		d, err := os.MkdirTemp("", "cfstandin-")
		if err != nil {
			return err
		}
		dir = d
	} else if err := safedir.Ensure(dir, safedir.Current()); err != nil {
		return err
	}
	owner := safedir.Current()

	token, tokenPath, err := loadToken(*tokenFile, dir, owner)
	if err != nil {
		return err
	}
	bin, err := workerd.Find(*workerdPath)
	if err != nil {
		return err
	}
	if *accountID == "" {
		*accountID = randomHex(16)
	}
	if *routingKV == "" {
		*routingKV = randomHex(16)
	}
	s, err := cfstandin.Listen(cfstandin.Config{
		Token: token, AccountID: *accountID, AccountSubdomain: *accountSubdomain,
		DispatchNamespaces: []string{*dispatchNamespace}, KVNamespaces: []string{*routingKV},
		BaseDomain: *baseDomain, RoutingKVNamespace: *routingKV, RoutingDispatchNamespace: *dispatchNamespace,
		KVStale: *kvStale, RateLimit: *rateLimit, RateWindow: *rateWindow, RateBlock: *rateBlock, Workerd: bin,
	}, *listen, *edgeListen)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := safedir.WriteFile(dir, "edge-ca.pem", s.EdgeCACertPEM(), owner); err != nil {
		return err
	}
	fmt.Fprintf(out, "CFSTANDIN_API_BASE_URL=%s\n", s.BaseURL())
	fmt.Fprintf(out, "CFSTANDIN_EDGE_ADDR=%s\n", s.EdgeAddr())
	fmt.Fprintf(out, "CFSTANDIN_EDGE_CA_FILE=%s\n", filepath.Join(dir, "edge-ca.pem"))
	fmt.Fprintf(out, "CFSTANDIN_TOKEN_FILE=%s\n", tokenPath)
	fmt.Fprintf(out, "CFSTANDIN_ACCOUNT_ID=%s\n", *accountID)
	fmt.Fprintf(out, "CFSTANDIN_ACCOUNT_SUBDOMAIN=%s\n", *accountSubdomain)
	fmt.Fprintf(out, "CFSTANDIN_DISPATCH_NAMESPACE=%s\n", *dispatchNamespace)
	fmt.Fprintf(out, "CFSTANDIN_ROUTING_KV_NAMESPACE=%s\n", *routingKV)
	fmt.Fprintf(out, "CFSTANDIN_BASE_DOMAIN=%s\n", *baseDomain)
	if f, ok := out.(interface{ Sync() error }); ok {
		_ = f.Sync()
	}
	<-ctx.Done()
	return nil
}

// loadToken reads the token from path (a 0600 regular file), or generates one into dir.
func loadToken(path, dir string, owner safedir.Owner) (token, file string, err error) {
	if path == "" {
		token = randomHex(20)
		if err := safedir.WriteFile(dir, "api-token", []byte(token+"\n"), owner); err != nil {
			return "", "", err
		}
		return token, filepath.Join(dir, "api-token"), nil
	}
	info, err := os.Lstat(path)
	if err != nil {
		return "", "", err
	}
	if !info.Mode().IsRegular() || info.Mode().Perm()&0o077 != 0 {
		return "", "", fmt.Errorf("token file %s must be a regular file of mode 0600", path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", "", err
	}
	token = strings.TrimSpace(string(data))
	if token == "" {
		return "", "", errors.New("token file " + path + " is empty")
	}
	return token, path, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
