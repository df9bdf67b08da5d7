package vocab_test

import (
	"io/fs"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/api"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
	"github.com/takoform/terraform-provider-takoform/migrations"
)

func TestTheShapes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		re        *regexp.Regexp
		good, bad []string
	}{
		{vocab.Name, []string{"a", "prod_eu-1", strings.Repeat("a", 63)}, []string{"", "-a", "_a", "A", "a.b", strings.Repeat("a", 64)}},
		{vocab.ReservationID, []string{"abc", "eu-1-shop"}, []string{"ab", "a_bc", "-abc", strings.Repeat("a", 64)}},
		{vocab.Label, []string{"a", "shop-1", strings.Repeat("a", 63)}, []string{"", "-a", "a-", "a.b", "a_b", strings.Repeat("a", 64)}},
		{vocab.BindingName, []string{"A", "_x", "API_KEY2"}, []string{"", "1A", "A-B", "A.B"}},
		{vocab.OperationID, []string{"a", "op.2026-12_01", strings.Repeat("a", 128)}, []string{"", ".a", "-a", "a/b", strings.Repeat("a", 129)}},
		{vocab.UUID, []string{"0190c4d2-6f1e-7a2b-9c3d-4e5f60718293"}, []string{"0190C4D2-6F1E-7A2B-9C3D-4E5F60718293", "0190c4d26f1e7a2b9c3d4e5f60718293"}},
		{vocab.Date, []string{"2025-01-01"}, []string{"2025-1-01", "25-01-01", "2025-01-01x", "２０２５-01-01"}},
	} {
		for _, s := range c.good {
			require.True(t, c.re.MatchString(s), "%s should match %q", c.re, s)
		}
		for _, s := range c.bad {
			require.False(t, c.re.MatchString(s), "%s should not match %q", c.re, s)
		}
	}
	require.True(t, vocab.IsHostname("shop.example.com"))
	require.True(t, vocab.IsHostname("localhost"))
	for _, s := range []string{"", ".example.com", "example.com.", "a..b", "Shop.example.com", "a_b.example.com",
		strings.Repeat(strings.Repeat("a", 63)+".", 4) + "com"} {
		require.False(t, vocab.IsHostname(s), s)
	}
}

// The migrations' CHECK constraints and the OpenAPI document spell the shapes in their own
// languages: each column and field with a shape of vocab's uses vocab's pattern, and a pattern
// neither names as one of vocab's is one of the few single-use shapes listed here, so a new or
// changed pattern cannot drift from the Go one unnoticed.
func TestTheDocumentsSpellTheSameShapes(t *testing.T) {
	t.Parallel()
	singleUse := map[string]bool{
		`^key_[a-z0-9]{8,40}$`:                    true, // API key ids
		`^org_[a-z0-9]{8,40}$`:                    true, // organization ids
		`^[A-Za-z0-9._~-]{16,128}$`:               true, // ownership tokens
		`^prep-[0-9a-f]{32}$`:                     true, // preparation ids
		`^rip1\.prep-[0-9a-f]{32}\.[0-9a-f]{64}$`: true, // runtime input references
		`^k[0-9]{14}-[0-9a-f]{8}$`:                true, // sealing key ids
		`^c[0-9]{14}-[0-9a-f]{8}$`:                true, // runtime-input commitment secret ids
		`^(rip2\.c[0-9]{14}-[0-9a-f]{8}|rip1)\.prep-[0-9a-f]{32}\.[0-9a-f]{64}$`: true, // rip2 and rip1 references
		`^[0-9a-f]{64}$`:          true, // commitment keys
		`^"?[1-9][0-9]*"?$`:       true, // If-Match revisions
		`^[a-z][a-z0-9_]{0,63}$`:  true, // compatibility flags
		`^hostmint-[0-9a-f]{40}$`: true, // minted reservation ids
	}
	ours := map[string]bool{vocab.NamePattern: true, vocab.ReservationIDPattern: true, vocab.LabelPattern: true,
		vocab.HostnamePattern: true, vocab.BindingNamePattern: true, vocab.OperationIDPattern: true,
		vocab.UUIDPattern: true, vocab.DatePattern: true, vocab.CustomDomainPattern: true}
	byColumn := map[string]string{"space": vocab.NamePattern, "name": vocab.NamePattern,
		"worker_name": vocab.NamePattern, "operation_id": vocab.OperationIDPattern}

	check := regexp.MustCompile(`CHECK \((\w+) ~ '([^']*)'`)
	seen := 0
	require.NoError(t, fs.WalkDir(migrations.FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || !strings.HasSuffix(p, ".up.sql") {
			return err
		}
		text, err := fs.ReadFile(migrations.FS, p)
		if err != nil {
			return err
		}
		for _, m := range check.FindAllStringSubmatch(string(text), -1) {
			seen++
			if want, ok := byColumn[m[1]]; ok {
				require.Equal(t, want, m[2], "%s: column %s", p, m[1])
			}
			require.True(t, ours[m[2]] || singleUse[m[2]], "%s: column %s checks %s, which is not one of vocab's shapes", p, m[1], m[2])
		}
		return nil
	}))
	require.Greater(t, seen, 10, "the walk read the migrations' CHECKs")

	field := regexp.MustCompile(`(\w+): \{type: (?:string|array, items: \{type: string), pattern: '([^']*)'`)
	byField := map[string]string{"space": vocab.NamePattern, "workerName": vocab.NamePattern,
		"requiredSensitiveVars": vocab.BindingNamePattern}
	fields := field.FindAllStringSubmatch(string(api.OpenAPI), -1)
	require.NotEmpty(t, fields)
	for _, m := range fields {
		if want, ok := byField[m[1]]; ok {
			require.Equal(t, want, m[2], "openapi.yaml: %s", m[1])
		}
	}
	for _, m := range regexp.MustCompile(`pattern: '([^']*)'`).FindAllStringSubmatch(string(api.OpenAPI), -1) {
		require.True(t, ours[m[1]] || singleUse[m[1]], "openapi.yaml's pattern %s is not one of vocab's shapes", m[1])
	}
}
