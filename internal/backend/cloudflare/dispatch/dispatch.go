// Package dispatch holds the dispatch worker of a `wfp-managed` installation (SPEC 8): the one
// script the installation's base-domain route reaches, which looks the hostname up in the routing
// KV namespace and dispatches to the tenant's script in the dispatch namespace. Its source is part
// of the product (worker.js, embedded here); `takoserver cloudflare install-dispatch` uploads it.
//
// workerd has no dispatch-namespace binding, so tests (and the Cloudflare stand-in) run the worker
// with a `wrapped` binding in its place (shim.js): WorkerdConfig renders such a config.
package dispatch

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/catalog"
)

// Source is the dispatch worker's ES module.
//
//go:embed worker.js
var Source []byte

// shimSource is the dispatch-namespace stand-in for workerd.
//
//go:embed shim.js
var shimSource []byte

// Shim is the dispatch-namespace stand-in for workerd (the internal module
// "takoform-dispatch:shim" of a wrapped binding whose inner binding NAMESPACE runs the scripts).
func Shim() []byte { return append([]byte(nil), shimSource...) }

// The dispatch worker's module and binding names.
const (
	MainModule = "worker.js"
	// CompatibilityDate is the date the worker is written against.
	CompatibilityDate = "2025-01-01"
	// RoutesBinding is the routing KV namespace.
	RoutesBinding = "ROUTES"
	// DispatcherBinding is the dispatch namespace.
	DispatcherBinding = "DISPATCHER"
	// CacheTTLBinding is the plain-text cacheTtl, in seconds, of routing KV reads.
	CacheTTLBinding = "ROUTE_CACHE_TTL"
	// ContractBinding is the plain-text contract version the uploaded source implements.
	ContractBinding = "TAKOFORM_DISPATCH_CONTRACT"
	// BindingEntrypoint is the named entrypoint (a WorkerEntrypoint class) that callers' service
	// bindings name, with props BindingProps.
	BindingEntrypoint = "Binding"
)

// Contract is the dispatch worker contract this source implements: 1 routed hostnames with the
// entry's cpuMs; 2 adds the Binding entrypoint and the script entries it reads. The Host reads the
// installed worker's ContractBinding back before it uploads a caller's binding to the entrypoint,
// so an older dispatch worker never silently breaks a binding.
const Contract = 2

// BindingProps are the props of a caller's service binding to BindingEntrypoint: the callee's
// script and the worker UID the binding was made for. The Host sets them at upload; the tenant's
// code cannot change them.
type BindingProps struct {
	CalleeScript string `json:"calleeScript"`
	CalleeUID    string `json:"calleeUid"`
}

// ScriptKeyPrefix prefixes a script entry's key in the routing KV namespace (no hostname holds a
// colon, so it never meets a route).
const ScriptKeyPrefix = "script:"

// ScriptKey is the routing KV key of scriptName's entry.
func ScriptKey(scriptName string) string { return ScriptKeyPrefix + scriptName }

// ScriptEntry is the value of a script entry: the worker UID that holds the script and its
// limits.cpuMs, which binding calls to it are dispatched with (0: none).
type ScriptEntry struct {
	WorkerUID string `json:"workerUid"`
	CPUMs     int64  `json:"cpuMs"`
}

// ProbeHeader asks the dispatch worker for the hostname's route without dispatching (SPEC 8's
// Ready witness on wfp-managed): it answers {hostname, endpointUid} from the lookup alone.
const ProbeHeader = "Takoform-Dispatch-Probe"

// MinCacheTTL is Cloudflare's smallest cacheTtl for KV reads, in seconds; the worker uses it when
// ROUTE_CACHE_TTL is missing or smaller.
const MinCacheTTL = int(catalog.MinKVCacheTTL / time.Second)

// RouteEntry is the value of a routing KV entry, keyed by hostname.
type RouteEntry struct {
	ScriptName  string `json:"scriptName"`
	EndpointUID string `json:"endpointUid"`
	CPUMs       int64  `json:"cpuMs,omitempty"`
}

// The headers between the workerd shim and the service that runs the namespace's scripts.
const (
	// ScriptHeader names the script a request is dispatched to.
	ScriptHeader = "Takoform-Dispatch-Script"
	// CPUMsHeader carries limits.cpuMs, when the dispatch set one.
	CPUMsHeader = "Takoform-Dispatch-Cpu-Ms"
	// UnknownHeader, set to "1" on the answer, says the namespace has no such script: the shim's
	// stub then throws "Worker not found." as Cloudflare's does.
	UnknownHeader = "Takoform-Dispatch-Unknown"
	// LimitHeader, set to "1" on the answer, says the script ran past the CPU limit it was
	// dispatched with: the stub then throws the exception Cloudflare's dispatcher throws.
	LimitHeader = "Takoform-Dispatch-Limit-Exceeded"
)

// WorkerdConfig is a workerd config that serves the dispatch worker on socket "http", with ROUTES
// backed by the KV service at kvAddr (workerd's KV protocol over HTTP) and DISPATCHER by the shim
// over the namespace service at namespaceAddr, and a probe socket "ready" (a trivial worker) that
// answers once workerd has loaded the config. With bindingProps set, socket "binding" serves the
// Binding entrypoint with those props, as a caller's service binding reaches it. files are written
// beside config.capnp.
func WorkerdConfig(kvAddr, namespaceAddr string, cacheTTL int, bindingProps *BindingProps) (files map[string][]byte) {
	const ready = `export default { fetch() { return new Response("ok"); } };`
	var b strings.Builder
	b.WriteString("using Workerd = import \"/workerd/workerd.capnp\";\n\n")
	b.WriteString("const config :Workerd.Config = (\n")
	b.WriteString("  services = [\n")
	b.WriteString("    (name = \"dispatch\", worker = .dispatchWorker),\n")
	b.WriteString("    (name = \"ready\", worker = (modules = [(name = \"ready.js\", esModule = embed \"ready.js\")], compatibilityDate = \"2024-09-23\")),\n")
	fmt.Fprintf(&b, "    (name = \"routes-kv\", external = (address = %s, http = ())),\n", strconv.Quote(kvAddr))
	fmt.Fprintf(&b, "    (name = \"namespace\", external = (address = %s, http = ())),\n", strconv.Quote(namespaceAddr))
	b.WriteString("  ],\n")
	b.WriteString("  sockets = [\n")
	b.WriteString("    (name = \"http\", service = \"dispatch\", http = ()),\n")
	b.WriteString("    (name = \"ready\", service = \"ready\", http = ()),\n")
	if bindingProps != nil {
		props, _ := json.Marshal(bindingProps)
		fmt.Fprintf(&b, "    (name = \"binding\", service = (name = \"dispatch\", entrypoint = %s, props = (json = %s)), http = ()),\n",
			strconv.Quote(BindingEntrypoint), strconv.Quote(string(props)))
	}
	b.WriteString("  ],\n")
	b.WriteString("  extensions = [(modules = [(name = \"takoform-dispatch:shim\", internal = true, esModule = embed \"shim.js\")])],\n")
	b.WriteString(");\n\n")
	b.WriteString("const dispatchWorker :Workerd.Worker = (\n")
	fmt.Fprintf(&b, "  modules = [(name = %s, esModule = embed \"worker.js\")],\n", strconv.Quote(MainModule))
	fmt.Fprintf(&b, "  compatibilityDate = %s,\n", strconv.Quote(CompatibilityDate))
	b.WriteString("  bindings = [\n")
	fmt.Fprintf(&b, "    (name = %s, kvNamespace = \"routes-kv\"),\n", strconv.Quote(RoutesBinding))
	fmt.Fprintf(&b, "    (name = %s, text = %s),\n", strconv.Quote(CacheTTLBinding), strconv.Quote(strconv.Itoa(cacheTTL)))
	fmt.Fprintf(&b, "    (name = %s, text = %s),\n", strconv.Quote(ContractBinding), strconv.Quote(strconv.Itoa(Contract)))
	fmt.Fprintf(&b, "    (name = %s, wrapped = (moduleName = \"takoform-dispatch:shim\", innerBindings = [(name = \"NAMESPACE\", service = \"namespace\")])),\n", strconv.Quote(DispatcherBinding))
	b.WriteString("  ],\n")
	b.WriteString(");\n")
	return map[string][]byte{
		"config.capnp": []byte(b.String()),
		"worker.js":    Source,
		"shim.js":      shimSource,
		"ready.js":     []byte(ready),
	}
}
