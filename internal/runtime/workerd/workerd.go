// Package workerd finds the pinned workerd binary and renders the config of one organization's
// process (SPEC 5): the runtime's own router worker (router.js), which loads each of the
// organization's incarnations as a dynamic isolate through the Worker Loader, and the Unix
// sockets between the process and the runtime. No tenant's code, secret or variable is in a
// config: they reach the process only over its code socket, from the runtime's memory.
package workerd

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// Worker is what the runtime checks of one deployment before it takes it: its modules, main module,
// compatibility date, settings and secret names.
type Worker struct {
	Modules           map[string]string
	MainModule        string
	CompatibilityDate string
	// Settings are its plain variables, compatibility flags, limits and service bindings.
	Settings workerconf.Settings
	// Secrets are the names of the secret bindings it runs with.
	Secrets []string
}

// Validate checks what the runtime needs to run w, with errors fit for a 422.
func (w Worker) Validate() error {
	if err := CheckModules(w.Modules, w.MainModule); err != nil {
		return err
	}
	return w.ValidateConfig()
}

// CheckModules checks a bundle's modules and its main module, with errors fit for a 422.
func CheckModules(modules map[string]string, main string) error {
	if len(modules) == 0 {
		return errors.New("modules must name at least one module")
	}
	if _, ok := modules[main]; !ok {
		return fmt.Errorf("mainModule %q is not one of the modules", main)
	}
	for name := range modules {
		if name == "" || len(name) > 256 || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return fmt.Errorf("module name %q is empty, too long or has control characters", name)
		}
	}
	return workerconf.CheckModules(modules, main)
}

// ValidateConfig checks what w runs with besides its modules: its compatibility date, secret
// names and settings.
func (w Worker) ValidateConfig() error {
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

// ModuleType is how the Worker Loader takes a module, by its name (workerconf.ModuleKind): JSON,
// text, WebAssembly and data by extension (the last two base64, decoded by the router), every
// other module an ES module (bundles are ES-module workers).
func ModuleType(name string) string { return workerconf.ModuleKind(name) }

// The files and names of an org process's config. The runtime hands workerd the ingress socket
// (--socket-fd IngressSocket=N) and listens itself on the other four, in the process's socket
// directory.
const (
	ConfigFile    = "config.capnp"
	ConfigConst   = "config"
	RouterFile    = "router.js"
	IngressSocket = "http"
	CodeSocket    = "code.sock"
	EgressSocket  = "egress.sock"
	BindSocket    = "bindings.sock"
	TailSocket    = "tails.sock"
)

// The headers between the runtime and the router (all takoform-*: the edge removes every such
// header a client sends, and the router every one an isolate writes).
const (
	// HeaderIncarnation names the loader id a request from the edge is for.
	HeaderIncarnation = "Takoform-Incarnation"
	// HeaderProbe asks the router to load and probe the loader id it names.
	HeaderProbe = "Takoform-Probe"
	// HeaderLiveness asks the router to answer at once (the process's liveness probe).
	HeaderLiveness = "Takoform-Liveness"
	// HeaderLoader stamps what an isolate sends (egress, bindings, tails) with its loader id.
	HeaderLoader = "Takoform-Loader"
	// HeaderBinding names the service binding a binding call went through.
	HeaderBinding = "Takoform-Binding"
	// HeaderAdmit asks the runtime only to admit a binding call, for the router to run it in the
	// process. The runtime answers with the callee's loader id (HeaderCallee), the call's number
	// (HeaderCall) and the milliseconds it may take (HeaderDeadline); or with HeaderElsewhere,
	// when the callee runs in another process and the call is to be sent whole; or with the
	// refusal the caller gets.
	HeaderAdmit     = "Takoform-Admit"
	HeaderCallee    = "Takoform-Callee"
	HeaderCall      = "Takoform-Call"
	HeaderDeadline  = "Takoform-Deadline"
	HeaderElsewhere = "Takoform-Elsewhere"
	// HeaderEnded reports the end of calls the router ran, "<call>:<1 when the callee
	// answered, else 0>", separated by commas: on an admission, or on a request of its own.
	HeaderEnded = "Takoform-Ended"
	// HeaderScheduled asks the router to run the scheduled handler of the loader id that
	// HeaderIncarnation names, for the cron it holds, at HeaderScheduledTime (Unix milliseconds);
	// the router answers a ScheduledAnswer.
	HeaderScheduled     = "Takoform-Scheduled"
	HeaderScheduledTime = "Takoform-Scheduled-Time"
)

// ProbeOutcome is the router's answer to a probe: "ready" (the code loaded and no handler ran),
// "failed" (the code did not load: Message says why, in workerd's words) or "unavailable" (the
// runtime gave no code for the id, which says nothing of the code).
type ProbeOutcome struct {
	Outcome string `json:"outcome"`
	Message string `json:"message,omitempty"`
}

//go:embed router.js
var routerSource []byte

// Org is one organization's process, as its config describes it.
type Org struct {
	// SocketDir is where workerd finds the runtime's sockets: the directory bound into its
	// sandbox, or "" for its working directory (a process without a sandbox).
	SocketDir string
	// ProbeEntrypoint is the entrypoint a probe calls: chosen per process, so that no module can
	// export it.
	ProbeEntrypoint string
	// HeapLimitMB is V8's heap limit, per isolate (--max-old-space-size): an isolate past it ends
	// the whole process.
	HeapLimitMB int
}

// Files are the config and the router, to be given to workerd as its working directory's files.
func (o Org) Files() (map[string][]byte, error) {
	if !strings.HasPrefix(o.ProbeEntrypoint, "takoformProbe_") {
		return nil, fmt.Errorf("probe entrypoint %q is not takoformProbe_<random>", o.ProbeEntrypoint)
	}
	if o.HeapLimitMB <= 0 {
		return nil, fmt.Errorf("heap limit %d MB is not positive", o.HeapLimitMB)
	}
	sock := func(name string) string {
		if o.SocketDir == "" {
			return Quote("unix:" + name)
		}
		return Quote("unix:" + o.SocketDir + "/" + name)
	}
	var b strings.Builder
	b.WriteString("# Generated by the Takoform runtime node for one organization's process. It holds no tenant's\n")
	b.WriteString("# code or secret: the router loads them from the runtime over the code socket.\n")
	b.WriteString("using Workerd = import \"/workerd/workerd.capnp\";\n\n")
	fmt.Fprintf(&b, "const %s :Workerd.Config = (\n  services = [\n", ConfigConst)
	b.WriteString("    (name = \"router\", worker = .router),\n")
	fmt.Fprintf(&b, "    (name = \"code\", external = (address = %s, http = ())),\n", sock(CodeSocket))
	// workerd sends no Host header in proxy style, which Go's server requires; the absolute URL
	// names the host, and the injected one is ignored.
	fmt.Fprintf(&b, "    (name = \"egress\", external = (address = %s, http = (style = proxy, injectRequestHeaders = [(name = \"Host\", value = \"egress.takoform.invalid\")]))),\n", sock(EgressSocket))
	fmt.Fprintf(&b, "    (name = \"bindings\", external = (address = %s, http = ())),\n", sock(BindSocket))
	fmt.Fprintf(&b, "    (name = \"tails\", external = (address = %s, http = ())),\n", sock(TailSocket))
	// The router's own fetch() reaches nothing (it has no use for one); the process has no
	// network anyway.
	b.WriteString("    (name = \"nowhere\", network = (allow = [])),\n  ],\n")
	// The edge sets X-Forwarded-Proto (https behind an HTTPS edge): workerd builds request.url
	// with that scheme, so a worker sees the origin it is served at.
	fmt.Fprintf(&b, "  sockets = [ (name = %s, service = \"router\", http = (forwardedProtoHeader = \"X-Forwarded-Proto\")) ],\n", Quote(IngressSocket))
	// One JSON object per line of workerd's own output (package workerlog reads them).
	b.WriteString("  logging = (structuredLogging = true),\n")
	// Each request leaves native memory behind JavaScript wrappers that V8 frees only when it
	// collects them, and V8 collects when its own heap fills, not the process. Young generation:
	// 1 MiB semi-spaces, collected often. Old generation: V8 would let it grow toward half the
	// heap limit before its first full collection, and every request passes two isolates (the
	// router and the worker), so a busy process reached its ceiling (228 MiB) in about 18,000
	// requests of a trivial worker and was killed, the worker implicated; starting it at 8 MiB,
	// the same load levels off near 105 MiB (measured with the pinned workerd). The heap limit is
	// per isolate (Cloudflare's 128 MB per worker is the reference).
	//
	// Optimization is compiled on the process's own thread, not a background one. With background
	// compiles, a busy worker's hot loop fell back to V8's baseline code within a minute in most
	// processes once other organizations' loops contended for the CPU, and stayed there (perf: the
	// loop's arithmetic in Add_Generic_Baseline, a heap number allocated every turn): its CPU a
	// request rose from 0.4-0.55 ms to 0.85-2.0 ms and did not come back (make bench-tenants,
	// about ten runs); compiled in place, it stayed at 0.4-0.55 ms in every window of three runs.
	// The price is a pause of the organization's thread while a hot function compiles (for the
	// bench's handler Maglev took 0.5-4 ms and TurboFan 4-9 ms, --trace-opt; a few times per
	// function), of the kind its workers' requests already make.
	fmt.Fprintf(&b, "  v8Flags = %s,\n);\n\n", V8FlagsList(o.HeapLimitMB))
	fmt.Fprintf(&b, "const router :Workerd.Worker = (\n  modules = [ (name = %s, esModule = embed %s) ],\n", Quote(RouterFile), Quote(RouterFile))
	// ctx.exports (the entrypoints stamped per isolate) needs enable_ctx_exports at this date.
	// service_binding_extra_handlers lets the router call an isolate's scheduled handler: the
	// router's flag, never a tenant's.
	b.WriteString("  compatibilityDate = \"2025-09-01\",\n  compatibilityFlags = [\"enable_ctx_exports\", \"service_binding_extra_handlers\"],\n  bindings = [\n")
	b.WriteString("    (name = \"LOADER\", workerLoader = ()),\n")
	b.WriteString("    (name = \"CODE\", service = \"code\"),\n")
	b.WriteString("    (name = \"EGRESS\", service = \"egress\"),\n")
	b.WriteString("    (name = \"BINDINGS\", service = \"bindings\"),\n")
	b.WriteString("    (name = \"TAILS\", service = \"tails\"),\n")
	fmt.Fprintf(&b, "    (name = \"PROBE_ENTRYPOINT\", text = %s),\n  ],\n", Quote(o.ProbeEntrypoint))
	b.WriteString("  globalOutbound = \"nowhere\",\n);\n")
	return map[string][]byte{ConfigFile: []byte(b.String()), RouterFile: routerSource}, nil
}

// ServeArgs are workerd's arguments for an org process's config: the Worker Loader needs
// --experimental in the pinned workerd (its tests guard it).
func ServeArgs() []string { return []string{"serve", "--experimental", ConfigFile, ConfigConst} }

// ValidBindingName reports whether name can be a secret binding (SPEC 1).
func ValidBindingName(name string) bool { return vocab.BindingName.MatchString(name) }

// V8FlagsList is the V8 flags of an organization's process, heap limit heapLimitMB per isolate,
// as a config's list (why each: Org.Files).
func V8FlagsList(heapLimitMB int) string {
	flags := []string{"--no-concurrent-recompilation", "--max-semi-space-size=1", "--initial-old-space-size=8", fmt.Sprintf("--max-old-space-size=%d", heapLimitMB)}
	for i, f := range flags {
		flags[i] = Quote(f)
	}
	return "[" + strings.Join(flags, ", ") + "]"
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
