package cloudflare

import (
	"context"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"slices"

	"github.com/cloudflare/cloudflare-go/v6/workers"
	"github.com/cloudflare/cloudflare-go/v6/workers_for_platforms"
)

// Place is where a pack's scripts live: an account's own Workers scripts (workers-dev) or the
// scripts of one dispatch namespace (wfp-managed). The packs' script code is written once over
// it; each method is one SDK call.
type Place interface {
	// String names the place in messages.
	String() string
	// Settings reads the script's current version back: its bindings (never a secret's value),
	// compatibility settings and limits.
	Settings(ctx context.Context, sdk *Services, script string) (Settings, error)
	// Content reads the script's current modules back, and which is the main one.
	Content(ctx context.Context, sdk *Services, script string) ([]Module, string, error)
	// Upload is one multipart script upload.
	Upload(ctx context.Context, sdk *Services, script string, u Upload) error
	// Delete deletes the script (never with force).
	Delete(ctx context.Context, sdk *Services, script string) error
	// DeleteSecret removes one secret_text binding.
	DeleteSecret(ctx context.Context, sdk *Services, script, secret string) error
}

// Settings is a script's current version as its settings readback shows it.
type Settings struct {
	CompatibilityDate  string
	CompatibilityFlags []string
	Bindings           []Binding
	// CPUMs is the version's limits.cpu_ms (0: Cloudflare's default).
	CPUMs int64
}

// Binding is one binding of a settings readback. Text is a plain_text binding's value; Cloudflare
// never shows a secret_text one. NamespaceID is a kv_namespace binding's namespace, Namespace a
// dispatch_namespace binding's.
type Binding struct {
	Name        string
	Type        string
	Text        string
	NamespaceID string
	Namespace   string
}

// Account is an account's own Workers scripts.
type Account struct{ ID string }

// Namespace is the scripts of one Workers for Platforms dispatch namespace.
type Namespace struct{ AccountID, Name string }

func (a Account) String() string   { return "account " + a.ID }
func (n Namespace) String() string { return "dispatch namespace " + n.Name }

func (a Account) Settings(ctx context.Context, sdk *Services, script string) (Settings, error) {
	var p workers.ScriptScriptAndVersionSettingGetParams
	p.AccountID.Value, p.AccountID.Present = a.ID, true
	res, err := sdk.Scripts.ScriptAndVersionSettings.Get(ctx, script, p)
	if err != nil {
		return Settings{}, err
	}
	out := Settings{CompatibilityDate: res.CompatibilityDate, CompatibilityFlags: res.CompatibilityFlags, CPUMs: res.Limits.CPUMs}
	for _, b := range res.Bindings {
		out.Bindings = append(out.Bindings, Binding{Name: b.Name, Type: string(b.Type), Text: b.Text, NamespaceID: b.NamespaceID, Namespace: b.Namespace})
	}
	return out, nil
}

func (n Namespace) Settings(ctx context.Context, sdk *Services, script string) (Settings, error) {
	var p workers_for_platforms.DispatchNamespaceScriptSettingGetParams
	p.AccountID.Value, p.AccountID.Present = n.AccountID, true
	res, err := sdk.DispatchNamespaces.Scripts.Settings.Get(ctx, n.Name, script, p)
	if err != nil {
		return Settings{}, err
	}
	out := Settings{CompatibilityDate: res.CompatibilityDate, CompatibilityFlags: res.CompatibilityFlags, CPUMs: res.Limits.CPUMs}
	for _, b := range res.Bindings {
		out.Bindings = append(out.Bindings, Binding{Name: b.Name, Type: string(b.Type), Text: b.Text, NamespaceID: b.NamespaceID, Namespace: b.Namespace})
	}
	return out, nil
}

func (a Account) Content(ctx context.Context, sdk *Services, script string) ([]Module, string, error) {
	var p workers.ScriptContentGetParams
	p.AccountID.Value, p.AccountID.Present = a.ID, true
	return modules(sdk.Scripts.Content.Get(ctx, script, p))
}

func (n Namespace) Content(ctx context.Context, sdk *Services, script string) ([]Module, string, error) {
	var p workers_for_platforms.DispatchNamespaceScriptContentGetParams
	p.AccountID.Value, p.AccountID.Present = n.AccountID, true
	return modules(sdk.DispatchNamespaces.Scripts.Content.Get(ctx, n.Name, script, p))
}

// maxContent bounds a content readback (Cloudflare's largest Worker is 10 MiB).
const maxContent = 16 << 20

// modules reads a module Worker's content answer: multipart/form-data, one part per module, the
// main module named by the CF-Entrypoint header.
func modules(res *http.Response, err error) ([]Module, string, error) {
	if err != nil {
		return nil, "", err
	}
	defer res.Body.Close()
	_, params, err := mime.ParseMediaType(res.Header.Get("Content-Type"))
	if err != nil || params["boundary"] == "" {
		return nil, "", fmt.Errorf("cloudflare: the script's content is not multipart")
	}
	r := multipart.NewReader(io.LimitReader(res.Body, maxContent), params["boundary"])
	var out []Module
	for {
		part, err := r.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, "", fmt.Errorf("cloudflare: read the script's content: %w", err)
		}
		name := part.FileName()
		if name == "" {
			name = part.FormName()
		}
		content, err := io.ReadAll(part)
		if err != nil {
			return nil, "", fmt.Errorf("cloudflare: read the script's content: %w", err)
		}
		out = append(out, Module{Name: name, ContentType: part.Header.Get("Content-Type"), Content: content})
	}
	main := res.Header.Get("CF-Entrypoint")
	if main == "" {
		return nil, "", fmt.Errorf("cloudflare: the script's content names no main module")
	}
	return out, main, nil
}

func (a Account) Upload(ctx context.Context, sdk *Services, script string, u Upload) error {
	_, err := sdk.Scripts.Update(ctx, script, u.ScriptParams(a.ID))
	return err
}

func (n Namespace) Upload(ctx context.Context, sdk *Services, script string, u Upload) error {
	_, err := sdk.DispatchNamespaces.Scripts.Update(ctx, n.Name, script, u.DispatchScriptParams(n.AccountID))
	return err
}

// SetSchedules replaces an account script's cron triggers (an empty crons removes them all).
// Dispatch-namespace scripts have no schedules API.
func (a Account) SetSchedules(ctx context.Context, sdk *Services, script string, crons []string) error {
	p := workers.ScriptScheduleUpdateParams{Body: make([]workers.ScriptScheduleUpdateParamsBody, 0, len(crons))}
	p.AccountID.Value, p.AccountID.Present = a.ID, true
	for _, c := range crons {
		var b workers.ScriptScheduleUpdateParamsBody
		b.Cron.Value, b.Cron.Present = c, true
		p.Body = append(p.Body, b)
	}
	_, err := sdk.Scripts.Schedules.Update(ctx, script, p)
	return err
}

// Schedules reads an account script's cron triggers, sorted.
func (a Account) Schedules(ctx context.Context, sdk *Services, script string) ([]string, error) {
	var p workers.ScriptScheduleGetParams
	p.AccountID.Value, p.AccountID.Present = a.ID, true
	res, err := sdk.Scripts.Schedules.Get(ctx, script, p)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(res.Schedules))
	for _, s := range res.Schedules {
		out = append(out, s.Cron)
	}
	slices.Sort(out)
	return out, nil
}

func (a Account) Delete(ctx context.Context, sdk *Services, script string) error {
	var p workers.ScriptDeleteParams
	p.AccountID.Value, p.AccountID.Present = a.ID, true // never force
	_, err := sdk.Scripts.Delete(ctx, script, p)
	return err
}

func (n Namespace) Delete(ctx context.Context, sdk *Services, script string) error {
	var p workers_for_platforms.DispatchNamespaceScriptDeleteParams
	p.AccountID.Value, p.AccountID.Present = n.AccountID, true // never force
	_, err := sdk.DispatchNamespaces.Scripts.Delete(ctx, n.Name, script, p)
	return err
}

func (a Account) DeleteSecret(ctx context.Context, sdk *Services, script, secret string) error {
	var p workers.ScriptSecretDeleteParams
	p.AccountID.Value, p.AccountID.Present = a.ID, true
	_, err := sdk.Scripts.Secrets.Delete(ctx, script, secret, p)
	return err
}

func (n Namespace) DeleteSecret(ctx context.Context, sdk *Services, script, secret string) error {
	var p workers_for_platforms.DispatchNamespaceScriptSecretDeleteParams
	p.AccountID.Value, p.AccountID.Present = n.AccountID, true
	_, err := sdk.DispatchNamespaces.Scripts.Secrets.Delete(ctx, n.Name, script, secret, p)
	return err
}
