// Package workerd finds the pinned workerd binary and renders the config of one incarnation in
// workerd's Cap'n Proto text format.
//
// Module sources are written beside the config and pulled in with `embed`, so no worker code is
// ever quoted into the config. Secret bindings are `fromEnvironment` bindings: the config names
// an environment variable, and the value reaches workerd only through its process environment.
//
// Beside the user's worker every config holds the runtime's own services (SPEC 5, 5.1): a probe
// socket of its own, answered by the runtime's dialer worker, which the supervisor probes so that
// readiness and liveness never run the user's code; and the outbound path. The user's worker reaches the network only through
// its globalOutbound, the "egress" external service: the runtime's egress proxy on loopback (which
// caps concurrent subrequests and hands requests for this node's own hostnames to the edge), which
// sends the rest back into this workerd on the "outbound" socket, where a dialer worker fetches
// through the "internet" network service with the node's deny list.
package workerd

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/takoform/terraform-provider-takoform/internal/vocab"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

// EnvVar names the workerd binary when no --workerd flag does.
const EnvVar = "TAKOFORM_WORKERD"

// Find locates workerd: the explicit path when given, else $TAKOFORM_WORKERD, else
// .tools/bin/workerd under the working directory (where `make workerd` links it), else workerd on
// PATH.
func Find(explicit string) (string, error) {
	candidates := []struct{ path, from string }{
		{explicit, "--workerd"},
		{os.Getenv(EnvVar), "$" + EnvVar},
		{filepath.Join(".tools", "bin", "workerd"), ".tools/bin/workerd"},
	}
	for _, c := range candidates {
		if c.path == "" {
			continue
		}
		info, err := os.Stat(c.path)
		if err == nil && info.Mode().IsRegular() && info.Mode().Perm()&0o111 != 0 {
			return filepath.Abs(c.path)
		}
		if c.from != ".tools/bin/workerd" {
			return "", fmt.Errorf("workerd named by %s (%s) is not an executable file; run `make workerd` to install the pinned version", c.from, c.path)
		}
	}
	if path, err := exec.LookPath("workerd"); err == nil {
		return filepath.Abs(path)
	}
	return "", errors.New("workerd not found: run `make workerd` (installs the pinned version into .tools/bin), or pass --workerd PATH or set " + EnvVar)
}

// Worker is what one incarnation's config describes.
type Worker struct {
	Modules           map[string]string
	MainModule        string
	CompatibilityDate string
	// Settings are its plain variables and compatibility flags.
	Settings workerconf.Settings
	// Secrets are the names of the secret bindings it runs with (values come from the environment).
	Secrets []string
	// Deny lists the networks (CIDR) its fetch() may not reach beyond what workerd's "public"
	// already excludes: the node's own addresses and the operator's --egress-deny ranges (see
	// package egress). FixedDeny is always added.
	Deny []string
}

// Names of the runtime's own parts of a config. The supervisor hands workerd one socket per
// socket name (--socket-fd) and the egress proxy's address (--external-addr).
const (
	// ProbeSocket serves the built-in probe (the dialer worker, told by ProbeHeader).
	ProbeSocket = "probe"
	// OutboundSocket is where the egress proxy sends subrequests that leave the node; proxy-style
	// HTTP (absolute URLs), served by the dialer worker.
	OutboundSocket = "outbound"
	// EgressService is the external service every user worker's fetch() goes to.
	EgressService = "egress"
	// ProbeReply is the probe's whole answer.
	ProbeReply = "takoform-probe-ok"
	// SchemeHeader carries an https subrequest's scheme from the egress proxy to the dialer (the
	// proxy speaks plain HTTP to the outbound socket).
	SchemeHeader = "Takoform-Egress-Scheme"
)

// BindingService names the external service behind a worker's service binding: an address the
// runtime node listens on for that incarnation and that binding alone (given with
// --external-addr), so that where a request arrives says which worker sent it through which
// binding, and nothing the worker writes into the request takes part (SPEC 5.1: the node routes
// it to the callee, under its own rules, never around them).
func BindingService(binding string) string { return "takoform-binding-" + binding }

// FixedDeny is in every config's deny list: networks workerd's "public" admits although they can
// reach what no worker should (the benchmark range 198.18.0.0/15, often used for internal
// services, and the NAT64 prefixes, well-known and local-use, which map every private IPv4 address
// into a "public" one).
var FixedDeny = []string{"198.18.0.0/15", "64:ff9b::/96", "64:ff9b:1::/48"}

// ProbeHeader marks the requests of the probe socket: the socket injects it, and the egress proxy
// strips it from workers' subrequests.
const ProbeHeader = "Takoform-Probe-Socket"

// dialerSource sends one subrequest out through the "internet" network service (its
// globalOutbound). A refused address makes fetch() throw before any packet leaves; the dialer turns
// that into a 502 problem for the worker, naming workerd's reason (which names only the address
// the worker asked for).
//
// The same worker answers the probe socket with ProbeReply (reading nothing, reaching nothing), so
// that the runtime's own parts cost one isolate per process, not two; it runs on the process's one
// thread like the user's worker, so a worker stuck in a loop leaves probes unanswered.
const dialerSource = `export default {
  async fetch(request) {
    if (request.headers.get("` + ProbeHeader + `") === "1") {
      return new Response("` + ProbeReply + `", { headers: { "content-type": "text/plain" } });
    }
    const url = new URL(request.url);
    if (request.headers.get("` + SchemeHeader + `") === "https") url.protocol = "https:";
    const headers = new Headers(request.headers);
    headers.delete("` + SchemeHeader + `");
    try {
      return await fetch(new Request(url, { method: request.method, headers, body: request.body, redirect: "manual" }));
    } catch (e) {
      const body = JSON.stringify({ type: "about:blank", title: "Bad Gateway", status: 502, code: "egress_refused",
        detail: "the runtime node refused or could not complete this subrequest: " + String(e && e.message || e) });
      return new Response(body, { status: 502, headers: { "content-type": "application/problem+json" } });
    }
  },
};
`

// SecretEnv is the environment variable workerd reads a secret binding from.
func SecretEnv(binding string) string { return "TAKOFORM_SECRET_" + binding }

// ValidBindingName reports whether name can be a secret binding (SPEC 1).
func ValidBindingName(name string) bool { return vocab.BindingName.MatchString(name) }

// Validate checks what Render needs, with errors fit for a 422.
func (w Worker) Validate() error {
	if len(w.Modules) == 0 {
		return errors.New("modules must name at least one module")
	}
	if _, ok := w.Modules[w.MainModule]; !ok {
		return fmt.Errorf("mainModule %q is not one of the modules", w.MainModule)
	}
	for name := range w.Modules {
		if name == "" || len(name) > 256 || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return fmt.Errorf("module name %q is empty, too long or has control characters", name)
		}
	}
	if !vocab.Date.MatchString(w.CompatibilityDate) {
		return fmt.Errorf("compatibilityDate %q is not YYYY-MM-DD", w.CompatibilityDate)
	}
	for _, n := range w.Secrets {
		if !ValidBindingName(n) {
			return fmt.Errorf("secret binding name %q does not match ^[A-Za-z_][A-Za-z0-9_]*$", n)
		}
	}
	return w.Settings.Validate(w.Secrets)
}

// Render returns the files of one incarnation's directory: the config (ConfigFile in the
// supervisor), one file per module, and the runtime's own probe and dialer workers. The main module
// comes first, as workerd requires.
func Render(w Worker, configFile, configConst, socketName string) (map[string][]byte, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	deny, err := denyList(w.Deny)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(w.Modules))
	for name := range w.Modules {
		if name != w.MainModule {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	names = append([]string{w.MainModule}, names...)

	files := make(map[string][]byte, len(names)+3)
	var b strings.Builder
	b.WriteString("# Generated by the Takoform runtime node for one incarnation. Secret values are not here:\n")
	b.WriteString("# they reach workerd through its environment (fromEnvironment bindings).\n")
	b.WriteString("using Workerd = import \"/workerd/workerd.capnp\";\n\n")
	fmt.Fprintf(&b, "const %s :Workerd.Config = (\n", configConst)
	b.WriteString("  services = [\n")
	b.WriteString("    (name = \"main\", worker = .worker),\n")
	// The egress proxy's address is given on the command line (--external-addr), so the config,
	// and with it the incarnation's identity, does not depend on a port. workerd sends no Host
	// header in proxy style, which Go's server requires; the injected one is ignored (the absolute
	// URL names the host).
	fmt.Fprintf(&b, "    (name = %s, external = (http = (style = proxy, injectRequestHeaders = [(name = \"Host\", value = \"egress.takoform.invalid\")]))),\n", Quote(EgressService))
	for _, name := range slices.Sorted(maps.Keys(w.Settings.ServiceBindings)) {
		// Only the binding's name is in the config: which worker it reaches is the node's to
		// decide on each request, so the callee's updates (or a new callee) never restart this one.
		fmt.Fprintf(&b, "    (name = %s, external = (http = ())),\n", Quote(BindingService(name)))
	}
	b.WriteString("    (name = \"dialer\", worker = .dialer),\n")
	b.WriteString("    (name = \"internet\", network = (\n      allow = [\"public\"],\n      deny = [")
	for n, cidr := range deny {
		if n > 0 {
			b.WriteString(", ")
		}
		b.WriteString(Quote(cidr))
	}
	b.WriteString("],\n      tlsOptions = (trustBrowserCas = true),\n    )),\n  ],\n")
	b.WriteString("  sockets = [\n")
	// The edge sets X-Forwarded-Proto (https behind an HTTPS edge): workerd builds request.url
	// with that scheme, so a worker sees the origin it is served at.
	fmt.Fprintf(&b, "    (name = %s, service = \"main\", http = (forwardedProtoHeader = \"X-Forwarded-Proto\")),\n", Quote(socketName))
	fmt.Fprintf(&b, "    (name = %s, service = \"dialer\", http = (injectRequestHeaders = [(name = %s, value = \"1\")])),\n", Quote(ProbeSocket), Quote(ProbeHeader))
	fmt.Fprintf(&b, "    (name = %s, service = \"dialer\", http = (style = proxy)),\n", Quote(OutboundSocket))
	b.WriteString("  ],\n")
	// One JSON object per line of output (package workerlog reads them): a console.* call keeps
	// its level, and nothing a worker prints can pass for workerd's own lines or split into two.
	b.WriteString("  logging = (structuredLogging = true),\n")
	// A small young generation (1 MiB semi-spaces): each request leaves native memory behind
	// JavaScript wrappers that V8 frees only when it collects them, and V8 collects when its own
	// heap fills, not the process. With V8's default young generation, a worker answering ~8,000
	// requests a second grew by ~60 MB/s until its 256 MiB ceiling killed it (make bench-edge);
	// collected this often, it levels off below the ceiling.
	b.WriteString("  v8Flags = [\"--max-semi-space-size=1\"],\n);\n\n")
	b.WriteString("const worker :Workerd.Worker = (\n  modules = [\n")
	for n, name := range names {
		kind, ext := moduleKind(name)
		file := fmt.Sprintf("module-%03d%s", n, ext)
		files[file] = []byte(w.Modules[name])
		fmt.Fprintf(&b, "    (name = %s, %s = embed %s),\n", Quote(name), kind, Quote(file))
	}
	b.WriteString("  ],\n")
	fmt.Fprintf(&b, "  compatibilityDate = %s,\n", Quote(w.CompatibilityDate))
	if flags := w.Settings.CompatibilityFlags; len(flags) > 0 {
		b.WriteString("  compatibilityFlags = [")
		for n, f := range flags {
			if n > 0 {
				b.WriteString(", ")
			}
			b.WriteString(Quote(f))
		}
		b.WriteString("],\n")
	}
	secrets := append([]string(nil), w.Secrets...)
	sort.Strings(secrets)
	b.WriteString("  bindings = [\n")
	for _, name := range secrets {
		fmt.Fprintf(&b, "    (name = %s, fromEnvironment = %s),\n", Quote(name), Quote(SecretEnv(name)))
	}
	// Variables are configuration, not secrets: their values are in the config itself.
	for _, name := range slices.Sorted(maps.Keys(w.Settings.Vars)) {
		fmt.Fprintf(&b, "    (name = %s, text = %s),\n", Quote(name), Quote(w.Settings.Vars[name]))
	}
	for _, name := range slices.Sorted(maps.Keys(w.Settings.JSONVars)) {
		fmt.Fprintf(&b, "    (name = %s, json = %s),\n", Quote(name), Quote(w.Settings.JSONVars[name]))
	}
	for _, name := range slices.Sorted(maps.Keys(w.Settings.ServiceBindings)) {
		fmt.Fprintf(&b, "    (name = %s, service = %s),\n", Quote(name), Quote(BindingService(name)))
	}
	b.WriteString("  ],\n")
	fmt.Fprintf(&b, "  globalOutbound = %s,\n);\n\n", Quote(EgressService))
	files["takoform-dialer.js"] = []byte(dialerSource)
	b.WriteString("const dialer :Workerd.Worker = (\n  modules = [ (name = \"takoform-dialer.js\", esModule = embed \"takoform-dialer.js\") ],\n")
	b.WriteString("  compatibilityDate = \"2024-09-23\",\n  globalOutbound = \"internet\",\n);\n")
	files[configFile] = []byte(b.String())
	return files, nil
}

// denyList is the network deny list of a config: FixedDeny and the worker's own, each in canonical
// CIDR form, without repeats, sorted (so that the same addresses render the same config).
func denyList(extra []string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, c := range append(append([]string(nil), FixedDeny...), extra...) {
		_, network, err := net.ParseCIDR(c)
		if err != nil {
			return nil, fmt.Errorf("egress deny entry %q is not a CIDR", c)
		}
		if s := network.String(); !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out, nil
}

// moduleKind maps a module name to its workerd module type: JSON and text by extension, every other
// module an ES module (bundles are ES-module workers).
func moduleKind(name string) (kind, ext string) {
	switch {
	case strings.HasSuffix(name, ".json"):
		return "json", ".json"
	case strings.HasSuffix(name, ".txt"):
		return "text", ".txt"
	default:
		return "esModule", ".js"
	}
}

// Quote writes s as a Cap'n Proto text string literal.
func Quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c == 0x7f:
			fmt.Fprintf(&b, "\\x%02x", c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
