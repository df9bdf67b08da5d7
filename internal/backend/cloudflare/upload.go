package cloudflare

import (
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"slices"

	"github.com/cloudflare/cloudflare-go/v6/workers"
	"github.com/cloudflare/cloudflare-go/v6/workers_for_platforms"

	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// ModuleContentType is the content type of an ES module part.
const ModuleContentType = "application/javascript+module"

// Module is one module of a Worker's bundle.
type Module struct {
	Name string
	// ContentType defaults to ModuleContentType.
	ContentType string
	Content     []byte
}

// Upload is one multipart module Worker upload (SPEC 8 "Mutations"): the bundle, its main module
// and compatibility date, and its bindings. Inherit names bindings kept from the previous version
// without resending them (`{type: "inherit", name}`), which is how a code change keeps delivered
// secrets; StrictInherit makes Cloudflare refuse the upload when one cannot be resolved, instead
// of dropping it.
type Upload struct {
	MainModule         string
	CompatibilityDate  string
	CompatibilityFlags []string
	Modules            []Module
	PlainText          map[string]string
	// JSON are json bindings, each value a JSON text sent as it is.
	JSON          map[string]string
	Secrets       map[string]vocab.Secret
	Inherit       []string
	StrictInherit bool
	// Services are service bindings: the callee's script name by binding name.
	Services map[string]string
	// Entrypoints are service bindings to a named entrypoint of an account script, with props
	// (wfp-managed: the dispatch worker's Binding entrypoint), by binding name.
	Entrypoints map[string]EntrypointBinding
	// KVNamespaces are kv_namespace bindings (the namespace id by binding name), and
	// DispatchNamespaces dispatch_namespace bindings (the namespace's name by binding name).
	KVNamespaces       map[string]string
	DispatchNamespaces map[string]string
	// CPUMs is the script's limits.cpu_ms (0: Cloudflare's default).
	CPUMs int64
}

// EntrypointBinding is a service binding to entrypoint Entrypoint of account script Service,
// with Props, which the target reads as ctx.props. Props are the binding's configuration, fixed at
// upload: the bound script's code cannot change them.
type EntrypointBinding struct {
	Service    string
	Entrypoint string
	Props      any
}

// bindings are u's bindings in the form Cloudflare's API takes them from either SDK family
// (account scripts, dispatch namespace scripts), each kind sorted by name, inherited ones last:
// one builder for both families, sent as the SDK's Raw value of the metadata's bindings field,
// which the SDK encodes as it is (its own binding params lack a service binding's props). They
// hold the secrets' plaintext, as the parameters do.
func (u Upload) bindings() []any {
	out := []any{}
	add := func(name, kind string, fields ...any) {
		b := map[string]any{"name": name, "type": kind}
		for i := 0; i+1 < len(fields); i += 2 {
			b[fields[i].(string)] = fields[i+1]
		}
		out = append(out, b)
	}
	each := func(values map[string]string, kind, field string) {
		for _, name := range slices.Sorted(maps.Keys(values)) {
			add(name, kind, field, values[name])
		}
	}
	each(u.PlainText, "plain_text", "text")
	for _, name := range slices.Sorted(maps.Keys(u.JSON)) {
		add(name, "json", "json", json.RawMessage(u.JSON[name]))
	}
	for _, name := range slices.Sorted(maps.Keys(u.Secrets)) {
		add(name, "secret_text", "text", u.Secrets[name].Reveal())
	}
	each(u.Services, "service", "service")
	for _, name := range slices.Sorted(maps.Keys(u.Entrypoints)) {
		e := u.Entrypoints[name]
		add(name, "service", "service", e.Service, "entrypoint", e.Entrypoint, "props", e.Props)
	}
	each(u.KVNamespaces, "kv_namespace", "namespace_id")
	each(u.DispatchNamespaces, "dispatch_namespace", "namespace")
	for _, name := range u.Inherit {
		add(name, "inherit")
	}
	return out
}

// namedPart is a module part as the SDK's multipart encoder reads it: filename and content type.
type namedPart struct {
	io.Reader
	name, contentType string
}

func (p *namedPart) Filename() string    { return p.name }
func (p *namedPart) ContentType() string { return p.contentType }

func (u Upload) parts() []io.Reader {
	parts := make([]io.Reader, 0, len(u.Modules))
	for _, m := range u.Modules {
		ct := m.ContentType
		if ct == "" {
			ct = ModuleContentType
		}
		parts = append(parts, &namedPart{Reader: bytes.NewReader(m.Content), name: m.Name, contentType: ct})
	}
	return parts
}

// ScriptParams are the SDK parameters of an account script upload (workers-dev). They hold the
// secrets' plaintext: build them right before the call and never log them.
func (u Upload) ScriptParams(accountID string) workers.ScriptUpdateParams {
	var p workers.ScriptUpdateParams
	p.AccountID.Value, p.AccountID.Present = accountID, true
	if u.StrictInherit {
		p.BindingsInherit.Value, p.BindingsInherit.Present = workers.ScriptUpdateParamsBindingsInheritStrict, true
	}
	m := &p.Metadata.Value
	p.Metadata.Present = true
	m.MainModule.Value, m.MainModule.Present = u.MainModule, true
	m.CompatibilityDate.Value, m.CompatibilityDate.Present = u.CompatibilityDate, true
	if len(u.CompatibilityFlags) > 0 {
		m.CompatibilityFlags.Value, m.CompatibilityFlags.Present = u.CompatibilityFlags, true
	}
	if u.CPUMs > 0 {
		m.Limits.Value.CPUMs.Value, m.Limits.Value.CPUMs.Present = u.CPUMs, true
		m.Limits.Present = true
	}
	m.Bindings.Present, m.Bindings.Raw = true, u.bindings()
	p.Files.Value, p.Files.Present = u.parts(), true
	return p
}

// DispatchScriptParams are the SDK parameters of an upload into a dispatch namespace
// (wfp-managed). Like ScriptParams they hold plaintext.
func (u Upload) DispatchScriptParams(accountID string) workers_for_platforms.DispatchNamespaceScriptUpdateParams {
	var p workers_for_platforms.DispatchNamespaceScriptUpdateParams
	p.AccountID.Value, p.AccountID.Present = accountID, true
	if u.StrictInherit {
		p.BindingsInherit.Value, p.BindingsInherit.Present = workers_for_platforms.DispatchNamespaceScriptUpdateParamsBindingsInheritStrict, true
	}
	m := &p.Metadata.Value
	p.Metadata.Present = true
	m.MainModule.Value, m.MainModule.Present = u.MainModule, true
	m.CompatibilityDate.Value, m.CompatibilityDate.Present = u.CompatibilityDate, true
	if len(u.CompatibilityFlags) > 0 {
		m.CompatibilityFlags.Value, m.CompatibilityFlags.Present = u.CompatibilityFlags, true
	}
	if u.CPUMs > 0 {
		m.Limits.Value.CPUMs.Value, m.Limits.Value.CPUMs.Present = u.CPUMs, true
		m.Limits.Present = true
	}
	m.Bindings.Present, m.Bindings.Raw = true, u.bindings()
	p.Files.Value, p.Files.Present = u.parts(), true
	return p
}
