package provider

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/hashicorp/terraform-plugin-framework-validators/stringvalidator"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/schema/validator"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/takoform/terraform-provider-takoform/internal/client"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

func nameValidators() []validator.String {
	return []validator.String{stringvalidator.RegexMatches(vocab.Name, "must be 1 to 63 characters of lowercase letters, digits, _ and -, starting with a letter or digit")}
}

func reservationIDValidators() []validator.String {
	return []validator.String{
		stringvalidator.RegexMatches(vocab.ReservationID, "must be 3 to 63 characters of lowercase letters, digits and -, starting with a letter or digit"),
		notPrefix{prefix: "hostmint-"},
	}
}

// notPrefix refuses a value that starts with prefix (the Host-minted namespace, SPEC 3.4).
type notPrefix struct{ prefix string }

func (v notPrefix) Description(context.Context) string {
	return "must not start with " + v.prefix + " (the Host mints those ids)"
}

func (v notPrefix) MarkdownDescription(ctx context.Context) string { return v.Description(ctx) }

func (v notPrefix) ValidateString(ctx context.Context, req validator.StringRequest, resp *validator.StringResponse) {
	if req.ConfigValue.IsNull() || req.ConfigValue.IsUnknown() {
		return
	}
	if strings.HasPrefix(req.ConfigValue.ValueString(), v.prefix) {
		resp.Diagnostics.AddAttributeError(req.Path, "Invalid reservation id", "The id "+v.Description(ctx)+".")
	}
}

// providerData is what the provider hands its resources and data sources: one configuration's
// client.
type providerData struct {
	client *client.Client
	memo   planMemo // what this configuration's plan derived, for the resources planned after it
}

// configureData unpacks the provider data of a Configure call.
func configureData(data any, diags *diag.Diagnostics) *client.Client {
	if data == nil {
		return nil
	}
	pd, ok := data.(*providerData)
	if !ok {
		diags.AddError("Unexpected provider data", fmt.Sprintf("expected *providerData, got %T; this is a bug in the provider", data))
		return nil
	}
	return pd.client
}

// newToken returns a fresh ownership token (SPEC 3.2: 16 to 128 of [A-Za-z0-9._~-]).
func newToken() string { return "tf-" + randomHex(16) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// The ownership token of each object lives in the resource's private state under this key.
const tokenKey = "ownership"

type privateReader interface {
	GetKey(ctx context.Context, key string) ([]byte, diag.Diagnostics)
}

type privateWriter interface {
	SetKey(ctx context.Context, key string, value []byte) diag.Diagnostics
}

type privateToken struct {
	Token string `json:"token"`
}

func getToken(ctx context.Context, p privateReader) (string, diag.Diagnostics) {
	if p == nil {
		return "", nil
	}
	raw, diags := p.GetKey(ctx, tokenKey)
	if diags.HasError() || len(raw) == 0 {
		return "", diags
	}
	var t privateToken
	if err := json.Unmarshal(raw, &t); err != nil {
		diags.AddError("Unable to read the ownership token from private state", err.Error())
	}
	return t.Token, diags
}

func setToken(ctx context.Context, p privateWriter, token string) diag.Diagnostics {
	raw, _ := json.Marshal(privateToken{Token: token})
	return p.SetKey(ctx, tokenKey, raw)
}

// adoptToken keeps the Host's ownership token of an object in private state that holds none
// (an import, or state from before tokens were kept): import adopts the object's owner.
func adoptToken(ctx context.Context, from privateReader, to privateWriter, hostToken *string) diag.Diagnostics {
	token, diags := getToken(ctx, from)
	if diags.HasError() || token != "" || hostToken == nil {
		return diags
	}
	return append(diags, setToken(ctx, to, *hostToken)...)
}

// deleteToken is the ownership token a Delete sends: the one in private state or, for state that
// holds none, the one the Host shows for the object (get reads it, owner picks the token). gone:
// the object is already absent and there is nothing to delete.
func deleteToken[T any](ctx context.Context, p privateReader, summary, what string, get func(context.Context) (T, error), owner func(T) *string) (string, bool, diag.Diagnostics) {
	token, diags := getToken(ctx, p)
	if token != "" || diags.HasError() {
		return token, false, diags
	}
	obj, err := get(ctx)
	switch {
	case client.IsNotFound(err):
		return "", true, diags
	case err != nil:
		addError(&diags, summary, fmt.Errorf("no ownership token is known for %s, and reading it failed: %w", what, err))
	case owner(obj) == nil:
		addError(&diags, summary, fmt.Errorf("no ownership token is known for %s, and the Host shows no owner for it", what))
	default:
		return *owner(obj), false, diags
	}
	return "", false, diags
}

// Default timeouts of the resources that wait.
const (
	defaultCreateTimeout = 10 * time.Minute
	defaultDeleteTimeout = 10 * time.Minute
)

// waitFor polls check until it reports done, or ctx ends. check returns a description of what is
// awaited, for the timeout's diagnostic.
func waitFor(ctx context.Context, check func() (done bool, waitingOn string, err error)) error {
	pause := 250 * time.Millisecond
	for {
		done, waitingOn, err := check()
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("timed out waiting: %s", waitingOn)
		case <-time.After(pause):
		}
		pause = min(pause*2, 3*time.Second)
	}
}

// conditionsText words a resource's conditions for a diagnostic.
func conditionsText(conds []client.Condition) string {
	var parts []string
	for _, c := range conds {
		parts = append(parts, fmt.Sprintf("%s=%s (%s: %s)", c.Type, c.Status, c.Reason, c.Message))
	}
	if len(parts) == 0 {
		return "no conditions reported"
	}
	return strings.Join(parts, "; ")
}

func strPtr(v types.String) *string {
	if v.IsNull() || v.IsUnknown() {
		return nil
	}
	s := v.ValueString()
	return &s
}

func derefOr(p *string, fallback string) string {
	if p == nil {
		return fallback
	}
	return *p
}

func stringOrNull(p *string) types.String {
	if p == nil {
		return types.StringNull()
	}
	return types.StringValue(*p)
}

func nullIfUnknown(v types.String) types.String {
	if v.IsUnknown() {
		return types.StringNull()
	}
	return v
}

// durationBetween accepts a Go duration within [min, max].
type durationBetween struct{ min, max time.Duration }

func (v durationBetween) Description(context.Context) string {
	return fmt.Sprintf("must be a duration such as 30m or 24h, between %s and %s", v.min, v.max)
}

func (v durationBetween) MarkdownDescription(ctx context.Context) string { return v.Description(ctx) }

func (v durationBetween) ValidateString(ctx context.Context, req validator.StringRequest, resp *validator.StringResponse) {
	if req.ConfigValue.IsNull() || req.ConfigValue.IsUnknown() {
		return
	}
	d, err := time.ParseDuration(req.ConfigValue.ValueString())
	if err != nil || d < v.min || d > v.max {
		resp.Diagnostics.AddAttributeError(req.Path, "Invalid duration", "The value "+v.Description(ctx)+".")
	}
}

func isUnknownOutcome(err error) bool {
	var u *client.OutcomeUnknownError
	return errors.As(err, &u)
}

// identifyRead sets a resource's identity at the start of a Read where the prior state carries
// none (state written before identities, or by terraform before 1.12): the framework wants one
// even from a Read that removes the resource. An identity once set never changes.
func identifyRead(ctx context.Context, resp *resource.ReadResponse, identity any) diag.Diagnostics {
	if resp.Identity == nil || !resp.Identity.Raw.IsFullyNull() {
		return nil
	}
	return setIdentity(ctx, resp.Identity, identity)
}

// writeRead ends a Read: it writes the model the Read found into the new state only when it
// differs from the prior one, and the identity only when the Read filled it in (an import). The
// framework starts the new state and identity as copies of the prior ones, so a refresh that
// finds nothing new builds no new value.
func writeRead[M any](ctx context.Context, resp *resource.ReadResponse, prior, read *M, identity func(*M) any) diag.Diagnostics {
	var diags diag.Diagnostics
	if !reflect.DeepEqual(prior, read) {
		diags.Append(setState(ctx, &resp.State, read)...)
	}
	if id := identity(read); !reflect.DeepEqual(identity(prior), id) && resp.Identity != nil {
		diags.Append(setIdentity(ctx, resp.Identity, id)...)
	}
	return diags
}

// writePlan ends a ModifyPlan: it writes the modified model into the plan only when it differs
// from the proposed one it was read from (as writeRead: a no-op plan builds no new value).
func writePlan[M any](ctx context.Context, resp *resource.ModifyPlanResponse, proposed, modified *M) diag.Diagnostics {
	if reflect.DeepEqual(proposed, modified) {
		return nil
	}
	return setPlan(ctx, &resp.Plan, modified)
}
