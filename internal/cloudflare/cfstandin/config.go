package cfstandin

import (
	"fmt"
	"strings"

	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare/dispatch"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
)

// ServiceHeader names, on the stand-in's internal listener, the script a service binding calls.
const ServiceHeader = "Cfstandin-Service"

// KVNamespaceHeader and DispatchNamespaceHeader name, on the internal listener, the KV namespace a
// kv_namespace binding reads and the dispatch namespace a dispatch_namespace binding runs.
const (
	KVNamespaceHeader       = "Cfstandin-Kv-Namespace"
	DispatchNamespaceHeader = "Cfstandin-Dispatch-Namespace"
)

// moduleKinds maps the content types Cloudflare accepts for module parts to workerd module kinds.
var moduleKinds = map[string]string{
	"application/javascript+module": "esModule",
	"text/javascript+module":        "esModule",
	"application/javascript":        "commonJsModule",
	"text/javascript":               "commonJsModule",
	"application/json":              "json",
	"text/plain":                    "text",
	"application/octet-stream":      "data",
	"application/wasm":              "wasm",
}

// renderConfig writes the workerd config of one version: the script as service "main" on socket
// "http", a probe worker on socket "probe", and one external service per service binding, which
// reaches the stand-in's internal listener naming its target. A service binding that names an
// entrypoint of an account script runs that script's version inside this config as a service of
// its own, designated with the entrypoint and props, so workerd hands the props to the target's
// entrypoint as Cloudflare does (its own bindings reach the stand-in like any script's). Secret
// values are not in the files: they reach workerd through its environment (fromEnvironment
// bindings), which holds nothing else.
func renderConfig(v Version, serviceAddr string) (files map[string][]byte, env []string, err error) {
	r := &renderer{files: map[string][]byte{"probe.js": []byte(probeSource)}, serviceAddr: serviceAddr}
	mainWorker, err := r.worker(v, "", true)
	if err != nil {
		return nil, nil, err
	}
	var b strings.Builder
	b.WriteString("using Workerd = import \"/workerd/workerd.capnp\";\n\n")
	b.WriteString("const config :Workerd.Config = (\n  services = [\n")
	b.WriteString("    (name = \"main\", worker = .main),\n")
	b.WriteString("    (name = \"probe\", worker = (modules = [(name = \"probe.js\", esModule = embed \"probe.js\")], compatibilityDate = \"2024-09-23\")),\n")
	b.WriteString(r.services.String())
	b.WriteString("  ],\n  sockets = [\n")
	b.WriteString("    (name = \"http\", service = \"main\", http = ()),\n")
	b.WriteString("    (name = \"probe\", service = \"probe\", http = ()),\n")
	b.WriteString("  ],\n")
	if _, ok := r.files["shim.js"]; ok {
		b.WriteString("  extensions = [(modules = [(name = \"takoform-dispatch:shim\", internal = true, esModule = embed \"shim.js\")])],\n")
	}
	b.WriteString(");\n\n")
	b.WriteString("const main :Workerd.Worker = ")
	b.WriteString(mainWorker)
	b.WriteString(";\n")
	r.files["config.capnp"] = []byte(b.String())
	return r.files, r.env, nil
}

// renderer collects the files, environment and services of one workerd config.
type renderer struct {
	files       map[string][]byte
	env         []string
	services    strings.Builder
	serviceAddr string
	targets     int
}

// external adds a service that reaches the internal listener with header set to value.
func (r *renderer) external(service, header, value string) {
	fmt.Fprintf(&r.services, "    (name = %s, external = (address = %s, http = (injectRequestHeaders = [(name = %s, value = %s)]))),\n",
		workerd.Quote(service), workerd.Quote(r.serviceAddr), workerd.Quote(header), workerd.Quote(value))
}

// worker renders v as a Workerd.Worker expression; prefix keeps the names of its files, services
// and environment apart from another worker's in the same config. Only the top-level worker
// (embed) runs the entrypoint targets of its bindings; a target's own ones reach the listener.
func (r *renderer) worker(v Version, prefix string, embed bool) (string, error) {
	var bindings strings.Builder
	for n, b := range v.Bindings {
		service := fmt.Sprintf("%sbinding-%d", prefix, n)
		switch b.Type {
		case "plain_text":
			fmt.Fprintf(&bindings, "    (name = %s, text = %s),\n", workerd.Quote(b.Name), workerd.Quote(b.Text))
		case "secret_text":
			variable := fmt.Sprintf("CFSTANDIN_SECRET_%s%d", strings.ToUpper(strings.ReplaceAll(prefix, "-", "_")), n)
			r.env = append(r.env, variable+"="+b.Text)
			fmt.Fprintf(&bindings, "    (name = %s, fromEnvironment = %s),\n", workerd.Quote(b.Name), workerd.Quote(variable))
		case "json":
			fmt.Fprintf(&bindings, "    (name = %s, json = %s),\n", workerd.Quote(b.Name), workerd.Quote(string(b.JSON)))
		case "service":
			if embed && b.target != nil {
				r.targets++
				target := fmt.Sprintf("target-%d", r.targets)
				inner, err := r.worker(*b.target, target+"-", false)
				if err != nil {
					return "", err
				}
				fmt.Fprintf(&r.services, "    (name = %s, worker = %s),\n", workerd.Quote(target), inner)
				props := ""
				if len(b.Props) > 0 {
					props = fmt.Sprintf(", props = (json = %s)", workerd.Quote(string(b.Props)))
				}
				fmt.Fprintf(&bindings, "    (name = %s, service = (name = %s, entrypoint = %s%s)),\n",
					workerd.Quote(b.Name), workerd.Quote(target), workerd.Quote(b.Entrypoint), props)
				continue
			}
			r.external(service, ServiceHeader, b.Service)
			fmt.Fprintf(&bindings, "    (name = %s, service = %s),\n", workerd.Quote(b.Name), workerd.Quote(service))
		case "kv_namespace":
			// Reads at the edge's (possibly stale) view of the namespace, on the internal listener.
			r.external(service, KVNamespaceHeader, b.Namespace)
			fmt.Fprintf(&bindings, "    (name = %s, kvNamespace = %s),\n", workerd.Quote(b.Name), workerd.Quote(service))
		case "dispatch_namespace":
			// workerd has none: the dispatch package's shim, over the namespace's scripts.
			r.external(service, DispatchNamespaceHeader, b.Namespace)
			fmt.Fprintf(&bindings, "    (name = %s, wrapped = (moduleName = \"takoform-dispatch:shim\", innerBindings = [(name = \"NAMESPACE\", service = %s)])),\n",
				workerd.Quote(b.Name), workerd.Quote(service))
			r.files["shim.js"] = dispatch.Shim()
		default:
			return "", fmt.Errorf("binding type %q is not run by the stand-in", b.Type)
		}
	}
	var modules strings.Builder
	ordered := append([]Module(nil), v.Modules...)
	for i, m := range ordered { // workerd runs the first module as the main one
		if m.Name == v.MainModule && i > 0 {
			ordered[0], ordered[i] = ordered[i], ordered[0]
		}
	}
	for n, m := range ordered {
		kind, ok := moduleKinds[m.ContentType]
		if !ok {
			return "", fmt.Errorf("module %q has content type %q, which the stand-in does not run", m.Name, m.ContentType)
		}
		file := fmt.Sprintf("%smodule-%03d", prefix, n)
		r.files[file] = m.Content
		fmt.Fprintf(&modules, "    (name = %s, %s = embed %s),\n", workerd.Quote(m.Name), kind, workerd.Quote(file))
	}
	var flags []string
	for _, f := range v.CompatibilityFlags {
		flags = append(flags, workerd.Quote(f))
	}
	var b strings.Builder
	b.WriteString("(\n  modules = [\n")
	b.WriteString(modules.String())
	b.WriteString("  ],\n")
	fmt.Fprintf(&b, "  compatibilityDate = %s,\n", workerd.Quote(v.CompatibilityDate))
	fmt.Fprintf(&b, "  compatibilityFlags = [%s],\n", strings.Join(flags, ", "))
	b.WriteString("  bindings = [\n")
	b.WriteString(bindings.String())
	b.WriteString("  ],\n)")
	return b.String(), nil
}
