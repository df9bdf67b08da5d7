package cfstandin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

// Limits Cloudflare publishes for Workers bindings: 5 KiB per environment variable or secret and
// 128 of them per Worker (paid plans).
const (
	maxBindingValue = 5 << 10
	maxBindings     = 128
)

// scriptName is what Cloudflare accepts as a Worker name.
var scriptName = regexp.MustCompile(`^[a-z0-9_][a-z0-9_-]{0,62}$`)

var compatibilityDate = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}$`)

type uploadMetadata struct {
	MainModule         string        `json:"main_module"`
	BodyPart           string        `json:"body_part"`
	CompatibilityDate  string        `json:"compatibility_date"`
	CompatibilityFlags []string      `json:"compatibility_flags"`
	Bindings           []wireBinding `json:"bindings"`
	KeepBindings       []string      `json:"keep_bindings"`
	Limits             *Limits       `json:"limits"`
}

// wireBinding is a binding as the API carries it, on upload and on readback.
type wireBinding struct {
	Name        string          `json:"name"`
	Type        string          `json:"type"`
	Text        *string         `json:"text,omitempty"`
	JSON        json.RawMessage `json:"json,omitempty"`
	Service     string          `json:"service,omitempty"`
	Environment string          `json:"environment,omitempty"`
	Entrypoint  string          `json:"entrypoint,omitempty"`
	Props       json.RawMessage `json:"props,omitempty"`
	OldName     string          `json:"old_name,omitempty"`
	VersionID   string          `json:"version_id,omitempty"`
	// NamespaceID names a kv_namespace binding's namespace; Namespace a dispatch_namespace's.
	NamespaceID string `json:"namespace_id,omitempty"`
	Namespace   string `json:"namespace,omitempty"`
}

// readback is the binding as Cloudflare shows it: secret values are never shown.
func (b Binding) readback() wireBinding {
	out := wireBinding{Name: b.Name, Type: b.Type}
	switch b.Type {
	case "plain_text":
		text := b.Text
		out.Text = &text
	case "json":
		out.JSON = b.JSON
	case "service":
		out.Service, out.Environment, out.Entrypoint = b.Service, b.Environment, b.Entrypoint
	case "kv_namespace":
		out.NamespaceID = b.Namespace
	case "dispatch_namespace":
		out.Namespace = b.Namespace
	}
	return out
}

// parseUpload reads a multipart script upload: the "metadata" part and the module parts (named by
// their filename, as the SDK and wrangler send them, else by their part name).
func parseUpload(r *http.Request, maxSize int) (uploadMetadata, []Module, *failure) {
	var meta uploadMetadata
	mediaType, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mediaType != "multipart/form-data" || params["boundary"] == "" {
		return meta, nil, fail(http.StatusBadRequest, CodeBadRequestBody, "Could not parse request body: expected multipart/form-data")
	}
	reader := multipart.NewReader(io.LimitReader(r.Body, int64(maxSize)+(1<<20)), params["boundary"])
	var modules []Module
	haveMeta, total := false, 0
	for {
		part, err := reader.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return meta, nil, fail(http.StatusBadRequest, CodeBadRequestBody, "Could not parse request body: "+err.Error())
		}
		data, err := io.ReadAll(part)
		if err != nil {
			return meta, nil, fail(http.StatusBadRequest, CodeBadRequestBody, "Could not parse request body: "+err.Error())
		}
		if part.FormName() == "metadata" {
			if err := json.Unmarshal(data, &meta); err != nil {
				return meta, nil, fail(http.StatusBadRequest, CodeBadRequestBody, "Could not parse the metadata part: "+err.Error())
			}
			haveMeta = true
			continue
		}
		name := part.FileName()
		if name == "" {
			name = part.FormName()
		}
		contentType, _, _ := mime.ParseMediaType(part.Header.Get("Content-Type"))
		total += len(data)
		modules = append(modules, Module{Name: name, ContentType: contentType, Content: data})
	}
	if !haveMeta {
		return meta, nil, fail(http.StatusBadRequest, CodeBadRequestBody, "Could not parse request body: the metadata part is missing")
	}
	if total > maxSize {
		return meta, nil, fail(http.StatusBadRequest, CodeScriptTooLarge,
			fmt.Sprintf("Your Worker exceeded the size limit of %d KiB (it is %d KiB).", maxSize>>10, (total+1023)>>10))
	}
	return meta, modules, nil
}

// buildVersion checks an upload as Cloudflare does and resolves its inherit bindings and
// keep_bindings against the previous version (prev is nil for a new script). An inherit binding
// that cannot be resolved is dropped, as Cloudflare drops it, unless strict
// (bindings_inherit=strict), when the upload is refused.
func buildVersion(meta uploadMetadata, modules []Module, prev *Version, strict bool, now time.Time) (Version, *failure) {
	v := Version{
		ID: uuid.NewString(), MainModule: meta.MainModule, CompatibilityDate: meta.CompatibilityDate,
		CompatibilityFlags: append([]string{}, meta.CompatibilityFlags...), Modules: modules, CreatedOn: now,
	}
	if meta.Limits != nil {
		if meta.Limits.CPUMs < 0 {
			return v, validation(fmt.Sprintf("Invalid limits.cpu_ms %d.", meta.Limits.CPUMs))
		}
		v.Limits = *meta.Limits
	}
	if meta.MainModule == "" {
		if meta.BodyPart != "" {
			return v, validation("The stand-in runs module Workers only: set main_module, not body_part.")
		}
		return v, validation("No main_module was given in the metadata.")
	}
	found := false
	seen := map[string]bool{}
	for _, m := range modules {
		if seen[m.Name] {
			return v, validation(fmt.Sprintf("Module %q is uploaded twice.", m.Name))
		}
		seen[m.Name] = true
		if _, ok := moduleKinds[m.ContentType]; !ok {
			return v, validation(fmt.Sprintf("Module %q has an unsupported content type %q.", m.Name, m.ContentType))
		}
		if m.Name == meta.MainModule {
			found = true
			if len(bytes.TrimSpace(m.Content)) == 0 {
				return v, fail(http.StatusBadRequest, CodeParseScript, "Could not parse your Worker's code: the main module is empty.")
			}
		}
	}
	if !found {
		return v, validation(fmt.Sprintf("No such module %q: main_module must name one of the uploaded parts.", meta.MainModule))
	}
	if meta.CompatibilityDate == "" {
		return v, validation("A compatibility_date is required.")
	}
	date, err := time.Parse(time.DateOnly, meta.CompatibilityDate)
	if !compatibilityDate.MatchString(meta.CompatibilityDate) || err != nil {
		return v, validation(fmt.Sprintf("Invalid compatibility_date %q: expected YYYY-MM-DD.", meta.CompatibilityDate))
	}
	if date.After(now.UTC().Add(24 * time.Hour)) {
		return v, validation(fmt.Sprintf("Can't set compatibility date in the future: %s.", meta.CompatibilityDate))
	}

	names := map[string]bool{}
	for _, wb := range meta.Bindings {
		if wb.Name == "" {
			return v, fail(http.StatusBadRequest, CodeBindingWithoutName, "A binding was uploaded without a name.")
		}
		if names[wb.Name] {
			return v, validation(fmt.Sprintf("Binding name %q is used more than once.", wb.Name))
		}
		names[wb.Name] = true
		b := Binding{Name: wb.Name, Type: wb.Type}
		switch wb.Type {
		case "plain_text", "secret_text":
			if wb.Text == nil {
				return v, validation(fmt.Sprintf("Binding %q of type %s needs text.", wb.Name, wb.Type))
			}
			if len(*wb.Text) > maxBindingValue {
				return v, fail(http.StatusBadRequest, CodeBindingTooLarge, fmt.Sprintf("Binding %q exceeds the size limit of 5 KiB.", wb.Name))
			}
			b.Text = *wb.Text
		case "json":
			if len(wb.JSON) == 0 || !json.Valid(wb.JSON) {
				return v, validation(fmt.Sprintf("Binding %q of type json needs a JSON value.", wb.Name))
			}
			if len(wb.JSON) > maxBindingValue {
				return v, fail(http.StatusBadRequest, CodeBindingTooLarge, fmt.Sprintf("Binding %q exceeds the size limit of 5 KiB.", wb.Name))
			}
			b.JSON = append(json.RawMessage(nil), wb.JSON...)
		case "service":
			if wb.Service == "" {
				return v, validation(fmt.Sprintf("Binding %q of type service needs a service.", wb.Name))
			}
			b.Service, b.Environment, b.Entrypoint = wb.Service, wb.Environment, wb.Entrypoint
			if len(wb.Props) > 0 {
				var props map[string]any
				if json.Unmarshal(wb.Props, &props) != nil || props == nil {
					return v, validation(fmt.Sprintf("Binding %q of type service has props that are not a JSON object.", wb.Name))
				}
				b.Props = append(json.RawMessage(nil), wb.Props...)
			}
		case "kv_namespace":
			if wb.NamespaceID == "" {
				return v, validation(fmt.Sprintf("Binding %q of type kv_namespace needs a namespace_id.", wb.Name))
			}
			b.Namespace = wb.NamespaceID
		case "dispatch_namespace":
			if wb.Namespace == "" {
				return v, validation(fmt.Sprintf("Binding %q of type dispatch_namespace needs a namespace.", wb.Name))
			}
			b.Namespace = wb.Namespace
		case "inherit":
			from := wb.Name
			if wb.OldName != "" {
				from = wb.OldName
			}
			var old Binding
			ok := false
			if prev != nil && (wb.VersionID == "" || wb.VersionID == "latest" || wb.VersionID == prev.ID) {
				old, ok = prev.Binding(from)
			}
			if !ok {
				if strict {
					return v, validation(fmt.Sprintf("Binding %q of type inherit could not be resolved against the previous version.", wb.Name))
				}
				continue
			}
			b = old
			b.Name = wb.Name
		default:
			return v, validation(fmt.Sprintf("Binding %q has type %q, which the stand-in does not support (plain_text, secret_text, json, service, kv_namespace, dispatch_namespace, inherit).", wb.Name, wb.Type))
		}
		v.Bindings = append(v.Bindings, b)
	}
	if prev != nil && len(meta.KeepBindings) > 0 {
		keep := map[string]bool{}
		for _, t := range meta.KeepBindings {
			keep[t] = true
		}
		for _, b := range prev.Bindings {
			if keep[b.Type] && !names[b.Name] {
				v.Bindings = append(v.Bindings, b)
				names[b.Name] = true
			}
		}
	}
	if len(v.Bindings) > maxBindings {
		return v, fail(http.StatusBadRequest, CodeTooManyBindings, fmt.Sprintf("A Worker may have at most %d environment variables and secrets.", maxBindings))
	}
	return v, nil
}

// scriptResult is the script object Cloudflare answers uploads, lists and gets with.
func scriptResult(sc Script) map[string]any {
	return map[string]any{
		"id":                  sc.Name,
		"tag":                 sc.Etag[:32],
		"etag":                sc.Etag,
		"created_on":          sc.CreatedOn.UTC().Format(time.RFC3339Nano),
		"modified_on":         sc.ModifiedOn.UTC().Format(time.RFC3339Nano),
		"compatibility_date":  sc.Current.CompatibilityDate,
		"compatibility_flags": nonNil(sc.Current.CompatibilityFlags),
		"handlers":            []string{"fetch"},
		"has_modules":         true,
		"has_assets":          false,
		"logpush":             false,
		"usage_model":         "standard",
		"placement":           map[string]any{},
		"tail_consumers":      nil,
		"tags":                nil,
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func settingsResult(v Version) map[string]any {
	bindings := make([]wireBinding, 0, len(v.Bindings))
	for _, b := range v.Bindings {
		bindings = append(bindings, b.readback())
	}
	return map[string]any{
		"bindings":            bindings,
		"compatibility_date":  v.CompatibilityDate,
		"compatibility_flags": nonNil(v.CompatibilityFlags),
		"logpush":             false,
		"placement":           map[string]any{},
		"tags":                nil,
		"tail_consumers":      nil,
		"usage_model":         "standard",
		"limits":              v.Limits,
		"observability":       map[string]any{"enabled": false},
	}
}

// checkScope refuses an unknown dispatch namespace and an invalid script name.
func (s *Server) checkScope(ns, name string) *failure {
	if !scriptName.MatchString(name) {
		return fail(http.StatusBadRequest, CodeInvalidName, "Invalid Worker name: use lowercase letters, digits, - and _ (at most 63 characters).")
	}
	if ns != "" {
		s.mu.Lock()
		_, ok := s.namespaces[ns]
		s.mu.Unlock()
		if !ok {
			return notFound("dispatch namespace not found")
		}
	}
	return nil
}

// putScript uploads a new version of a script: parsed and checked as Cloudflare does, started in
// workerd (a version that does not start is refused and changes nothing), then made current.
func (s *Server) putScript(w http.ResponseWriter, r *http.Request, ns, name string) *failure {
	if f := s.checkScope(ns, name); f != nil {
		return f
	}
	meta, modules, f := parseUpload(r, s.cfg.MaxScriptSize)
	if f != nil {
		return f
	}
	key := scriptKey{ns, name}
	s.mu.Lock()
	var prev *Version
	if sc, ok := s.scripts[key]; ok {
		v := copyVersion(sc.Current)
		prev = &v
	} else if ns == "" && s.countScripts("") >= s.cfg.MaxScripts {
		s.mu.Unlock()
		return fail(http.StatusBadRequest, CodeTooManyScripts, fmt.Sprintf("You have exceeded the limit of %d Workers on your account.", s.cfg.MaxScripts))
	}
	s.mu.Unlock()
	v, f := buildVersion(meta, modules, prev, r.URL.Query().Get("bindings_inherit") == "strict", s.now())
	if f != nil {
		return f
	}
	if f := s.resolveServices(ns, &v); f != nil {
		return f
	}
	sc, f := s.commitVersion(key, v, true)
	if f != nil {
		return f
	}
	writeResult(w, scriptResult(sc))
	return nil
}

// commitVersion starts v and makes it the current version of key (creating the script when
// create is true and it does not exist yet).
func (s *Server) commitVersion(key scriptKey, v Version, create bool) (Script, *failure) {
	p, err := s.runner.start(v)
	var startup *startupError
	switch {
	case errors.As(err, &startup):
		return Script{}, validation("Uncaught error while starting the Worker: " + startup.Message)
	case err != nil && !errors.Is(err, errNoWorkerd):
		return Script{}, fail(http.StatusInternalServerError, CodeInternal, "An unknown error has occurred while starting the Worker.")
	}
	now := s.now()
	s.mu.Lock()
	sc, ok := s.scripts[key]
	if !ok {
		if !create {
			s.mu.Unlock()
			if p != nil {
				p.stop()
			}
			return Script{}, notFound("workers.api.error.script_not_found")
		}
		sc = &script{Script{Namespace: key.Namespace, Name: key.Name, CreatedOn: now}}
		s.scripts[key] = sc
	}
	sc.Current = v
	sc.ModifiedOn = now
	sc.Uploads++
	sc.Etag = strings.ReplaceAll(uuid.NewString()+uuid.NewString(), "-", "")
	out := sc.snapshot()
	s.mu.Unlock()
	if p != nil {
		s.runner.install(key, p)
	}
	if key.Namespace == "" {
		s.retarget(key.Name, v)
	}
	return out, nil
}

// resolveServices resolves v's service bindings as Cloudflare does, at account scope only: from a
// dispatch-namespace script, a binding whose target is not an account script (a sibling in the
// namespace included) is refused with 10143. A binding that names an entrypoint of an account
// script gets that script's current version to run.
func (s *Server) resolveServices(ns string, v *Version) *failure {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range v.Bindings {
		b := &v.Bindings[i]
		if b.Type != "service" {
			continue
		}
		target, ok := s.scripts[scriptKey{"", b.Service}]
		if !ok && ns != "" {
			return fail(http.StatusBadRequest, CodeServiceBindingUnresolved,
				fmt.Sprintf("Could not resolve service binding %q: no Worker named %q in this account (service bindings resolve account Workers only, not scripts of a dispatch namespace).", b.Name, b.Service))
		}
		b.target = nil
		if ok && b.Entrypoint != "" {
			t := copyVersion(target.Current)
			b.target = &t
		}
	}
	return nil
}

// retarget gives every binding that runs an entrypoint of account script name its new version v,
// and stops the scripts that hold one, which start again with it on their next request (as
// Cloudflare's bindings reach a target's new version).
func (s *Server) retarget(name string, v Version) {
	var stale []scriptKey
	s.mu.Lock()
	for key, sc := range s.scripts {
		changed := false
		for i, b := range sc.Current.Bindings {
			if b.target == nil || b.Service != name {
				continue
			}
			if !changed {
				sc.Current.Bindings = append([]Binding(nil), sc.Current.Bindings...)
				changed = true
			}
			t := copyVersion(v)
			sc.Current.Bindings[i].target = &t
		}
		if changed {
			stale = append(stale, key)
		}
	}
	s.mu.Unlock()
	for _, key := range stale {
		s.runner.remove(key)
	}
}

func (s *Server) countScripts(ns string) int {
	n := 0
	for k := range s.scripts {
		if k.Namespace == ns {
			n++
		}
	}
	return n
}

func (s *Server) lookup(ns, name string) (Script, *failure) {
	if f := s.checkScope(ns, name); f != nil {
		return Script{}, f
	}
	sc, ok := s.NamespaceScript(ns, name)
	if !ok {
		return Script{}, notFound("workers.api.error.script_not_found")
	}
	return sc, nil
}

func (s *Server) getSettings(w http.ResponseWriter, _ *http.Request, ns, name string) *failure {
	sc, f := s.lookup(ns, name)
	if f != nil {
		return f
	}
	writeResult(w, settingsResult(sc.Current))
	return nil
}

func (s *Server) getBindings(w http.ResponseWriter, _ *http.Request, ns, name string) *failure {
	sc, f := s.lookup(ns, name)
	if f != nil {
		return f
	}
	writeResult(w, settingsResult(sc.Current)["bindings"])
	return nil
}

// getContent answers the script's modules as multipart/form-data, the main module named by the
// CF-Entrypoint header, as Cloudflare answers module Workers' content.
func (s *Server) getContent(w http.ResponseWriter, _ *http.Request, ns, name string) *failure {
	sc, f := s.lookup(ns, name)
	if f != nil {
		return f
	}
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for _, m := range sc.Current.Modules {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name=%q; filename=%q`, m.Name, m.Name))
		h.Set("Content-Type", m.ContentType)
		pw, _ := mw.CreatePart(h)
		_, _ = pw.Write(m.Content)
	}
	_ = mw.Close()
	w.Header().Set("Content-Type", mw.FormDataContentType())
	w.Header().Set("CF-Entrypoint", sc.Current.MainModule)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body.Bytes())
	return nil
}

func (s *Server) getNamespaceScript(w http.ResponseWriter, _ *http.Request, ns, name string) *failure {
	sc, f := s.lookup(ns, name)
	if f != nil {
		return f
	}
	writeResult(w, map[string]any{
		"created_on":         sc.CreatedOn.UTC().Format(time.RFC3339Nano),
		"modified_on":        sc.ModifiedOn.UTC().Format(time.RFC3339Nano),
		"dispatch_namespace": ns,
		"script":             scriptResult(sc),
	})
	return nil
}

func (s *Server) listScripts(w http.ResponseWriter, _ *http.Request, ns string) *failure {
	var items []any
	for _, name := range s.ScriptNames(ns) {
		if sc, ok := s.NamespaceScript(ns, name); ok {
			items = append(items, scriptResult(sc))
		}
	}
	writeList(w, nonNilAny(items))
	return nil
}

func nonNilAny(items []any) []any {
	if items == nil {
		return []any{}
	}
	return items
}

// deleteScript deletes a script (Cloudflare's DELETE is unconditional; force only matters for
// scripts other resources depend on, which the stand-in does not model, and is recorded in
// Requests so tests can see it was never sent).
func (s *Server) deleteScript(w http.ResponseWriter, _ *http.Request, ns, name string) *failure {
	if f := s.checkScope(ns, name); f != nil {
		return f
	}
	key := scriptKey{ns, name}
	s.mu.Lock()
	_, ok := s.scripts[key]
	delete(s.scripts, key)
	s.mu.Unlock()
	if !ok {
		return notFound("workers.api.error.script_not_found")
	}
	s.runner.remove(key)
	writeResult(w, nil)
	return nil
}

type secretBody struct {
	Name string  `json:"name"`
	Type string  `json:"type"`
	Text *string `json:"text"`
}

// putSecret adds or replaces one secret_text binding: a new version with every other binding kept.
func (s *Server) putSecret(w http.ResponseWriter, r *http.Request, ns, name string) *failure {
	sc, f := s.lookup(ns, name)
	if f != nil {
		return f
	}
	var body secretBody
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&body); err != nil {
		return fail(http.StatusBadRequest, CodeBadRequestBody, "Could not parse request body: "+err.Error())
	}
	switch {
	case body.Name == "":
		return fail(http.StatusBadRequest, CodeBindingWithoutName, "A binding was uploaded without a name.")
	case body.Type != "secret_text" || body.Text == nil:
		return validation("The stand-in keeps secrets of type secret_text with a text only.")
	case len(*body.Text) > maxBindingValue:
		return fail(http.StatusBadRequest, CodeBindingTooLarge, fmt.Sprintf("Binding %q exceeds the size limit of 5 KiB.", body.Name))
	}
	v := copyVersion(sc.Current)
	v.ID, v.CreatedOn = uuid.NewString(), s.now()
	replaced := false
	for i, b := range v.Bindings {
		if b.Name == body.Name {
			if b.Type != "secret_text" {
				return validation(fmt.Sprintf("Binding %q already exists with type %s.", body.Name, b.Type))
			}
			v.Bindings[i].Text = *body.Text
			replaced = true
		}
	}
	if !replaced {
		v.Bindings = append(v.Bindings, Binding{Name: body.Name, Type: "secret_text", Text: *body.Text})
	}
	if len(v.Bindings) > maxBindings {
		return fail(http.StatusBadRequest, CodeTooManyBindings, fmt.Sprintf("A Worker may have at most %d environment variables and secrets.", maxBindings))
	}
	if _, f := s.commitVersion(scriptKey{ns, name}, v, false); f != nil {
		return f
	}
	writeResult(w, map[string]any{"name": body.Name, "type": "secret_text"})
	return nil
}

func (s *Server) listSecrets(w http.ResponseWriter, _ *http.Request, ns, name string) *failure {
	sc, f := s.lookup(ns, name)
	if f != nil {
		return f
	}
	var items []any
	for _, b := range sortedBindings(sc.Current.Bindings) {
		if b.Type == "secret_text" {
			items = append(items, map[string]any{"name": b.Name, "type": b.Type})
		}
	}
	writeList(w, nonNilAny(items))
	return nil
}

func (s *Server) getSecret(w http.ResponseWriter, r *http.Request, ns, name string) *failure {
	sc, f := s.lookup(ns, name)
	if f != nil {
		return f
	}
	secret := r.PathValue("secret")
	if b, ok := sc.Current.Binding(secret); ok && b.Type == "secret_text" {
		writeResult(w, map[string]any{"name": b.Name, "type": b.Type})
		return nil
	}
	return notFound("workers.api.error.binding_not_found")
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request, ns, name string) *failure {
	sc, f := s.lookup(ns, name)
	if f != nil {
		return f
	}
	secret := r.PathValue("secret")
	v := copyVersion(sc.Current)
	v.ID, v.CreatedOn = uuid.NewString(), s.now()
	kept := v.Bindings[:0]
	found := false
	for _, b := range v.Bindings {
		if b.Name == secret && b.Type == "secret_text" {
			found = true
			continue
		}
		kept = append(kept, b)
	}
	if !found {
		return notFound("workers.api.error.binding_not_found")
	}
	v.Bindings = kept
	if _, f := s.commitVersion(scriptKey{ns, name}, v, false); f != nil {
		return f
	}
	writeResult(w, nil)
	return nil
}

func sortedBindings(bs []Binding) []Binding {
	out := append([]Binding(nil), bs...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Subdomain routes (account scripts only): the account's workers.dev subdomain and each script's
// enablement on it.

func (s *Server) getAccountSubdomain(w http.ResponseWriter, _ *http.Request) *failure {
	s.mu.Lock()
	sub := s.cfg.AccountSubdomain
	s.mu.Unlock()
	if sub == "" {
		return notFound("workers.api.error.subdomain_not_found")
	}
	writeResult(w, map[string]any{"subdomain": sub})
	return nil
}

func (s *Server) getScriptSubdomain(w http.ResponseWriter, _ *http.Request, name string) *failure {
	sc, f := s.lookup("", name)
	if f != nil {
		return f
	}
	writeResult(w, sc.Subdomain)
	return nil
}

func (s *Server) setScriptSubdomain(w http.ResponseWriter, r *http.Request, name string, del bool) *failure {
	if f := s.checkScope("", name); f != nil {
		return f
	}
	var body struct {
		Enabled         *bool `json:"enabled"`
		PreviewsEnabled *bool `json:"previews_enabled"`
	}
	if !del {
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&body); err != nil {
			return fail(http.StatusBadRequest, CodeBadRequestBody, "Could not parse request body: "+err.Error())
		}
		if body.Enabled == nil {
			return validation("enabled is required.")
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sc, ok := s.scripts[scriptKey{"", name}]
	if !ok {
		return notFound("workers.api.error.script_not_found")
	}
	if s.cfg.AccountSubdomain == "" {
		return notFound("workers.api.error.subdomain_not_found")
	}
	if del {
		sc.Subdomain = Subdomain{}
	} else {
		sc.Subdomain.Enabled = *body.Enabled
		if body.PreviewsEnabled != nil {
			sc.Subdomain.PreviewsEnabled = *body.PreviewsEnabled
		}
	}
	writeResult(w, sc.Subdomain)
	return nil
}

// Dispatch namespaces.

func namespaceResult(name string, created time.Time, count int) map[string]any {
	return map[string]any{
		"namespace_id":   uuid.NewSHA1(uuid.NameSpaceURL, []byte("cfstandin:"+name)).String(),
		"namespace_name": name,
		"created_on":     created.UTC().Format(time.RFC3339Nano),
		"modified_on":    created.UTC().Format(time.RFC3339Nano),
		"script_count":   count,
	}
}

func (s *Server) getNamespace(w http.ResponseWriter, r *http.Request) *failure {
	ns := r.PathValue("namespace")
	s.mu.Lock()
	created, ok := s.namespaces[ns]
	count := s.countScripts(ns)
	s.mu.Unlock()
	if !ok {
		return notFound("dispatch namespace not found")
	}
	writeResult(w, namespaceResult(ns, created, count))
	return nil
}

func (s *Server) listNamespaces(w http.ResponseWriter, _ *http.Request) *failure {
	s.mu.Lock()
	names := make([]string, 0, len(s.namespaces))
	for ns := range s.namespaces {
		names = append(names, ns)
	}
	sort.Strings(names)
	items := make([]any, 0, len(names))
	for _, ns := range names {
		items = append(items, namespaceResult(ns, s.namespaces[ns], s.countScripts(ns)))
	}
	s.mu.Unlock()
	writeList(w, items)
	return nil
}

func (s *Server) createNamespace(w http.ResponseWriter, r *http.Request) *failure {
	var body struct {
		Name string `json:"name"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&body); err != nil || body.Name == "" {
		return fail(http.StatusBadRequest, CodeBadRequestBody, "Could not parse request body: a name is required")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.namespaces[body.Name]; ok {
		return validation(fmt.Sprintf("A dispatch namespace named %q already exists.", body.Name))
	}
	s.namespaces[body.Name] = s.now()
	writeResult(w, namespaceResult(body.Name, s.namespaces[body.Name], 0))
	return nil
}

// maxSchedules is how many cron triggers the stand-in lets one script have.
const maxSchedules = 16

// schedule is one cron trigger as the schedules API takes and answers it.
type schedule struct {
	Cron       string `json:"cron"`
	CreatedOn  string `json:"created_on,omitempty"`
	ModifiedOn string `json:"modified_on,omitempty"`
}

// putSchedules replaces the script's cron triggers (PUT …/scripts/{script}/schedules, a JSON array
// of {"cron"}), as Cloudflare's schedules API does: every expression five fields, at most
// maxSchedules; an empty array removes them all.
func (s *Server) putSchedules(w http.ResponseWriter, r *http.Request, ns, name string) *failure {
	if _, f := s.lookup(ns, name); f != nil {
		return f
	}
	var body []schedule
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&body); err != nil {
		return fail(http.StatusBadRequest, CodeBadRequestBody, "Could not parse request body: "+err.Error())
	}
	if len(body) > maxSchedules {
		return validation(fmt.Sprintf("A Worker may have at most %d cron triggers.", maxSchedules))
	}
	crons := make([]string, 0, len(body))
	for _, c := range body {
		if _, err := workerconf.ParseCron(c.Cron); err != nil {
			return validation("Invalid cron expression: " + c.Cron)
		}
		crons = append(crons, c.Cron)
	}
	s.mu.Lock()
	sc, ok := s.scripts[scriptKey{ns, name}]
	if ok {
		sc.Schedules = crons
	}
	s.mu.Unlock()
	if !ok {
		return notFound("workers.api.error.script_not_found")
	}
	writeResult(w, map[string]any{"schedules": schedulesOf(crons, s.now())})
	return nil
}

// getSchedules answers the script's cron triggers.
func (s *Server) getSchedules(w http.ResponseWriter, _ *http.Request, ns, name string) *failure {
	sc, f := s.lookup(ns, name)
	if f != nil {
		return f
	}
	writeResult(w, map[string]any{"schedules": schedulesOf(sc.Schedules, sc.ModifiedOn)})
	return nil
}

func schedulesOf(crons []string, at time.Time) []schedule {
	out := make([]schedule, 0, len(crons))
	for _, c := range crons {
		out = append(out, schedule{Cron: c, CreatedOn: at.UTC().Format(time.RFC3339Nano), ModifiedOn: at.UTC().Format(time.RFC3339Nano)})
	}
	return out
}
