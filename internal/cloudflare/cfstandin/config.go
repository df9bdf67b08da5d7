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
// reaches the stand-in's internal listener naming its target. Secret values are not in the files:
// they reach workerd through its environment (fromEnvironment bindings), which holds nothing else.
func renderConfig(v Version, serviceAddr string) (files map[string][]byte, env []string, err error) {
	files = map[string][]byte{"probe.js": []byte(probeSource)}
	var services, bindings strings.Builder
	for n, b := range v.Bindings {
		switch b.Type {
		case "plain_text":
			fmt.Fprintf(&bindings, "    (name = %s, text = %s),\n", workerd.Quote(b.Name), workerd.Quote(b.Text))
		case "secret_text":
			variable := fmt.Sprintf("CFSTANDIN_SECRET_%d", n)
			env = append(env, variable+"="+b.Text)
			fmt.Fprintf(&bindings, "    (name = %s, fromEnvironment = %s),\n", workerd.Quote(b.Name), workerd.Quote(variable))
		case "json":
			fmt.Fprintf(&bindings, "    (name = %s, json = %s),\n", workerd.Quote(b.Name), workerd.Quote(string(b.JSON)))
		case "service":
			service := fmt.Sprintf("binding-%d", n)
			fmt.Fprintf(&services, "    (name = %s, external = (address = %s, http = (injectRequestHeaders = [(name = %s, value = %s)]))),\n",
				workerd.Quote(service), workerd.Quote(serviceAddr), workerd.Quote(ServiceHeader), workerd.Quote(b.Service))
			fmt.Fprintf(&bindings, "    (name = %s, service = %s),\n", workerd.Quote(b.Name), workerd.Quote(service))
		case "kv_namespace":
			// Reads at the edge's (possibly stale) view of the namespace, on the internal listener.
			service := fmt.Sprintf("binding-%d", n)
			fmt.Fprintf(&services, "    (name = %s, external = (address = %s, http = (injectRequestHeaders = [(name = %s, value = %s)]))),\n",
				workerd.Quote(service), workerd.Quote(serviceAddr), workerd.Quote(KVNamespaceHeader), workerd.Quote(b.Namespace))
			fmt.Fprintf(&bindings, "    (name = %s, kvNamespace = %s),\n", workerd.Quote(b.Name), workerd.Quote(service))
		case "dispatch_namespace":
			// workerd has none: the dispatch package's shim, over the namespace's scripts.
			service := fmt.Sprintf("binding-%d", n)
			fmt.Fprintf(&services, "    (name = %s, external = (address = %s, http = (injectRequestHeaders = [(name = %s, value = %s)]))),\n",
				workerd.Quote(service), workerd.Quote(serviceAddr), workerd.Quote(DispatchNamespaceHeader), workerd.Quote(b.Namespace))
			fmt.Fprintf(&bindings, "    (name = %s, wrapped = (moduleName = \"takoform-dispatch:shim\", innerBindings = [(name = \"NAMESPACE\", service = %s)])),\n",
				workerd.Quote(b.Name), workerd.Quote(service))
			files["shim.js"] = dispatch.Shim()
		default:
			return nil, nil, fmt.Errorf("binding type %q is not run by the stand-in", b.Type)
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
			return nil, nil, fmt.Errorf("module %q has content type %q, which the stand-in does not run", m.Name, m.ContentType)
		}
		file := fmt.Sprintf("module-%03d", n)
		files[file] = m.Content
		fmt.Fprintf(&modules, "    (name = %s, %s = embed %s),\n", workerd.Quote(m.Name), kind, workerd.Quote(file))
	}
	var flags []string
	for _, f := range v.CompatibilityFlags {
		flags = append(flags, workerd.Quote(f))
	}
	var b strings.Builder
	b.WriteString("using Workerd = import \"/workerd/workerd.capnp\";\n\n")
	b.WriteString("const config :Workerd.Config = (\n  services = [\n")
	b.WriteString("    (name = \"main\", worker = .main),\n")
	b.WriteString("    (name = \"probe\", worker = (modules = [(name = \"probe.js\", esModule = embed \"probe.js\")], compatibilityDate = \"2024-09-23\")),\n")
	b.WriteString(services.String())
	b.WriteString("  ],\n  sockets = [\n")
	b.WriteString("    (name = \"http\", service = \"main\", http = ()),\n")
	b.WriteString("    (name = \"probe\", service = \"probe\", http = ()),\n")
	b.WriteString("  ],\n")
	if _, ok := files["shim.js"]; ok {
		b.WriteString("  extensions = [(modules = [(name = \"takoform-dispatch:shim\", internal = true, esModule = embed \"shim.js\")])],\n")
	}
	b.WriteString(");\n\n")
	b.WriteString("const main :Workerd.Worker = (\n  modules = [\n")
	b.WriteString(modules.String())
	b.WriteString("  ],\n")
	fmt.Fprintf(&b, "  compatibilityDate = %s,\n", workerd.Quote(v.CompatibilityDate))
	fmt.Fprintf(&b, "  compatibilityFlags = [%s],\n", strings.Join(flags, ", "))
	b.WriteString("  bindings = [\n")
	b.WriteString(bindings.String())
	b.WriteString("  ],\n);\n")
	files["config.capnp"] = []byte(b.String())
	return files, env, nil
}
