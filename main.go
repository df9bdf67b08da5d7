// Command terraform-provider-takoform is the Takoform provider for Terraform and OpenTofu.
package main

import (
	"context"
	"flag"
	"log"
	"os"
	runtimedebug "runtime/debug"
	"strings"

	"github.com/hashicorp/terraform-plugin-framework/providerserver"

	"github.com/takoform/terraform-provider-takoform/provider"
)

// version is set by the release build (-ldflags "-X main.version=...").
var version = "dev"

// quietUnlessAsked turns the plugin SDK's logging off at the source when no TF_LOG* variable
// asks for logs: the CLI would discard every line, but the SDK would still format each TRACE line
// and ship it over the plugin's stderr, nearly half the provider's time in a no-op plan. The
// provider's own logger (tflog) reads its level from a variable named after the provider's type,
// TF_LOG_PROVIDER_TAKOFORM, and logs at TRACE without it: one line per Host request, which the CLI
// also parses and drops.
func quietUnlessAsked() {
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "TF_LOG") || strings.HasPrefix(kv, "TF_ACC_LOG") {
			return
		}
	}
	for _, name := range []string{"TF_LOG_PROVIDER", providerLogVariable(provider.Address), "TF_LOG_SDK", "TF_LOG_SDK_PROTO", "TF_LOG_SDK_FRAMEWORK"} {
		_ = os.Setenv(name, "OFF")
	}
}

// providerLogVariable is the variable terraform-plugin-go reads the level of a provider's own
// logger from: TF_LOG_PROVIDER_ and the provider's type, upper case, with "-" as "_".
func providerLogVariable(address string) string {
	typ := address[strings.LastIndex(address, "/")+1:]
	return "TF_LOG_PROVIDER_" + strings.ToUpper(strings.ReplaceAll(typ, "-", "_"))
}

func main() {
	var debug bool
	flag.BoolVar(&debug, "debug", false, "run the provider with support for debuggers like delve")
	flag.Parse()

	// A plan sends the provider hundreds of short requests, each allocating its schema-typed
	// values; collecting garbage less often is most of a no-op plan's provider time. The memory
	// this costs is a few MiB. GOGC in the environment still wins.
	if os.Getenv("GOGC") == "" {
		runtimedebug.SetGCPercent(400)
	}
	quietUnlessAsked()

	err := providerserver.Serve(context.Background(), provider.New(version), providerserver.ServeOpts{
		Address:         provider.Address,
		Debug:           debug,
		ProtocolVersion: 6,
	})
	if err != nil {
		log.Fatal(err.Error())
	}
}
