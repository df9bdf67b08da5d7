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

// withProps is a dispatch-namespace service binding with the props field, which the SDK's binding
// param (v6.10.0) lacks: the SDK's own encoding of the binding, with "props" added.
type withProps struct {
	binding workers_for_platforms.DispatchNamespaceScriptUpdateParamsMetadataBindingsWorkersBindingKindService
	props   any
}

func (b withProps) MarshalJSON() ([]byte, error) {
	raw, err := b.binding.MarshalJSON()
	if err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, err
	}
	if fields["props"], err = json.Marshal(b.props); err != nil {
		return nil, err
	}
	return json.Marshal(fields)
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
	bindings := []workers.ScriptUpdateParamsMetadataBindingUnion{}
	for _, name := range slices.Sorted(maps.Keys(u.PlainText)) {
		var b workers.ScriptUpdateParamsMetadataBindingsWorkersBindingKindPlainText
		b.Name.Value, b.Name.Present = name, true
		b.Text.Value, b.Text.Present = u.PlainText[name], true
		b.Type.Value, b.Type.Present = workers.ScriptUpdateParamsMetadataBindingsWorkersBindingKindPlainTextTypePlainText, true
		bindings = append(bindings, b)
	}
	for _, name := range slices.Sorted(maps.Keys(u.JSON)) {
		var b workers.ScriptUpdateParamsMetadataBindingsWorkersBindingKindJson
		b.Name.Value, b.Name.Present = name, true
		b.Json.Value, b.Json.Present = json.RawMessage(u.JSON[name]), true
		b.Type.Value, b.Type.Present = workers.ScriptUpdateParamsMetadataBindingsWorkersBindingKindJsonTypeJson, true
		bindings = append(bindings, b)
	}
	for _, name := range slices.Sorted(maps.Keys(u.Secrets)) {
		var b workers.ScriptUpdateParamsMetadataBindingsWorkersBindingKindSecretText
		b.Name.Value, b.Name.Present = name, true
		b.Text.Value, b.Text.Present = u.Secrets[name].Reveal(), true
		b.Type.Value, b.Type.Present = workers.ScriptUpdateParamsMetadataBindingsWorkersBindingKindSecretTextTypeSecretText, true
		bindings = append(bindings, b)
	}
	for _, name := range slices.Sorted(maps.Keys(u.Services)) {
		var b workers.ScriptUpdateParamsMetadataBindingsWorkersBindingKindService
		b.Name.Value, b.Name.Present = name, true
		b.Service.Value, b.Service.Present = u.Services[name], true
		b.Type.Value, b.Type.Present = workers.ScriptUpdateParamsMetadataBindingsWorkersBindingKindServiceTypeService, true
		bindings = append(bindings, b)
	}
	for _, name := range slices.Sorted(maps.Keys(u.KVNamespaces)) {
		var b workers.ScriptUpdateParamsMetadataBindingsWorkersBindingKindKVNamespace
		b.Name.Value, b.Name.Present = name, true
		b.NamespaceID.Value, b.NamespaceID.Present = u.KVNamespaces[name], true
		b.Type.Value, b.Type.Present = workers.ScriptUpdateParamsMetadataBindingsWorkersBindingKindKVNamespaceTypeKVNamespace, true
		bindings = append(bindings, b)
	}
	for _, name := range slices.Sorted(maps.Keys(u.DispatchNamespaces)) {
		var b workers.ScriptUpdateParamsMetadataBindingsWorkersBindingKindDispatchNamespace
		b.Name.Value, b.Name.Present = name, true
		b.Namespace.Value, b.Namespace.Present = u.DispatchNamespaces[name], true
		b.Type.Value, b.Type.Present = workers.ScriptUpdateParamsMetadataBindingsWorkersBindingKindDispatchNamespaceTypeDispatchNamespace, true
		bindings = append(bindings, b)
	}
	if u.CPUMs > 0 {
		m.Limits.Value.CPUMs.Value, m.Limits.Value.CPUMs.Present = u.CPUMs, true
		m.Limits.Present = true
	}
	for _, name := range u.Inherit {
		var b workers.ScriptUpdateParamsMetadataBindingsWorkersBindingKindInherit
		b.Name.Value, b.Name.Present = name, true
		b.Type.Value, b.Type.Present = workers.ScriptUpdateParamsMetadataBindingsWorkersBindingKindInheritTypeInherit, true
		bindings = append(bindings, b)
	}
	m.Bindings.Value, m.Bindings.Present = bindings, true
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
	bindings := []workers_for_platforms.DispatchNamespaceScriptUpdateParamsMetadataBindingUnion{}
	for _, name := range slices.Sorted(maps.Keys(u.PlainText)) {
		var b workers_for_platforms.DispatchNamespaceScriptUpdateParamsMetadataBindingsWorkersBindingKindPlainText
		b.Name.Value, b.Name.Present = name, true
		b.Text.Value, b.Text.Present = u.PlainText[name], true
		b.Type.Value, b.Type.Present = workers_for_platforms.DispatchNamespaceScriptUpdateParamsMetadataBindingsWorkersBindingKindPlainTextTypePlainText, true
		bindings = append(bindings, b)
	}
	for _, name := range slices.Sorted(maps.Keys(u.JSON)) {
		var b workers_for_platforms.DispatchNamespaceScriptUpdateParamsMetadataBindingsWorkersBindingKindJson
		b.Name.Value, b.Name.Present = name, true
		b.Json.Value, b.Json.Present = json.RawMessage(u.JSON[name]), true
		b.Type.Value, b.Type.Present = workers_for_platforms.DispatchNamespaceScriptUpdateParamsMetadataBindingsWorkersBindingKindJsonTypeJson, true
		bindings = append(bindings, b)
	}
	for _, name := range slices.Sorted(maps.Keys(u.Secrets)) {
		var b workers_for_platforms.DispatchNamespaceScriptUpdateParamsMetadataBindingsWorkersBindingKindSecretText
		b.Name.Value, b.Name.Present = name, true
		b.Text.Value, b.Text.Present = u.Secrets[name].Reveal(), true
		b.Type.Value, b.Type.Present = workers_for_platforms.DispatchNamespaceScriptUpdateParamsMetadataBindingsWorkersBindingKindSecretTextTypeSecretText, true
		bindings = append(bindings, b)
	}
	for _, name := range slices.Sorted(maps.Keys(u.Services)) {
		var b workers_for_platforms.DispatchNamespaceScriptUpdateParamsMetadataBindingsWorkersBindingKindService
		b.Name.Value, b.Name.Present = name, true
		b.Service.Value, b.Service.Present = u.Services[name], true
		b.Type.Value, b.Type.Present = workers_for_platforms.DispatchNamespaceScriptUpdateParamsMetadataBindingsWorkersBindingKindServiceTypeService, true
		bindings = append(bindings, b)
	}
	for _, name := range slices.Sorted(maps.Keys(u.KVNamespaces)) {
		var b workers_for_platforms.DispatchNamespaceScriptUpdateParamsMetadataBindingsWorkersBindingKindKVNamespace
		b.Name.Value, b.Name.Present = name, true
		b.NamespaceID.Value, b.NamespaceID.Present = u.KVNamespaces[name], true
		b.Type.Value, b.Type.Present = workers_for_platforms.DispatchNamespaceScriptUpdateParamsMetadataBindingsWorkersBindingKindKVNamespaceTypeKVNamespace, true
		bindings = append(bindings, b)
	}
	for _, name := range slices.Sorted(maps.Keys(u.DispatchNamespaces)) {
		var b workers_for_platforms.DispatchNamespaceScriptUpdateParamsMetadataBindingsWorkersBindingKindDispatchNamespace
		b.Name.Value, b.Name.Present = name, true
		b.Namespace.Value, b.Namespace.Present = u.DispatchNamespaces[name], true
		b.Type.Value, b.Type.Present = workers_for_platforms.DispatchNamespaceScriptUpdateParamsMetadataBindingsWorkersBindingKindDispatchNamespaceTypeDispatchNamespace, true
		bindings = append(bindings, b)
	}
	if u.CPUMs > 0 {
		m.Limits.Value.CPUMs.Value, m.Limits.Value.CPUMs.Present = u.CPUMs, true
		m.Limits.Present = true
	}
	for _, name := range u.Inherit {
		var b workers_for_platforms.DispatchNamespaceScriptUpdateParamsMetadataBindingsWorkersBindingKindInherit
		b.Name.Value, b.Name.Present = name, true
		b.Type.Value, b.Type.Present = workers_for_platforms.DispatchNamespaceScriptUpdateParamsMetadataBindingsWorkersBindingKindInheritTypeInherit, true
		bindings = append(bindings, b)
	}
	m.Bindings.Value, m.Bindings.Present = bindings, true
	if len(u.Entrypoints) > 0 {
		// The SDK's supported way to send what its param types lack: a field's Raw value (what
		// the SDK's Raw helper sets), here on the bindings field, with every binding still
		// encoded by the SDK itself.
		all := make([]any, 0, len(bindings)+len(u.Entrypoints))
		for _, b := range bindings {
			all = append(all, b)
		}
		for _, name := range slices.Sorted(maps.Keys(u.Entrypoints)) {
			e := u.Entrypoints[name]
			var b workers_for_platforms.DispatchNamespaceScriptUpdateParamsMetadataBindingsWorkersBindingKindService
			b.Name.Value, b.Name.Present = name, true
			b.Service.Value, b.Service.Present = e.Service, true
			b.Entrypoint.Value, b.Entrypoint.Present = e.Entrypoint, true
			b.Type.Value, b.Type.Present = workers_for_platforms.DispatchNamespaceScriptUpdateParamsMetadataBindingsWorkersBindingKindServiceTypeService, true
			all = append(all, withProps{binding: b, props: e.Props})
		}
		m.Bindings.Value, m.Bindings.Raw = nil, all
	}
	p.Files.Value, p.Files.Present = u.parts(), true
	return p
}
