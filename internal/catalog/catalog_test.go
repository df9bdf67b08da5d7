package catalog

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/quota"
)

func write(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "catalog.json")
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	return path
}

func TestDefaultCatalogSellsSelfhostToEveryone(t *testing.T) {
	t.Parallel()
	c := Default()
	visible := c.Visible(Organization{ID: "org_abcdefgh", Name: "anyone"})
	require.Len(t, visible, 2)
	o, inst, err := c.Select(Organization{ID: "org_abcdefgh", Name: "anyone"}, KindWorker, "")
	require.NoError(t, err)
	require.Equal(t, "selfhost-module-worker", o.ID)
	require.Equal(t, PackSelfhost, o.Pack)
	require.Equal(t, "workers.localhost", inst.EndpointSuffix)
	require.Len(t, o.Digest, 64)
	require.Equal(t, []string{PackSelfhost}, c.Packs())
}

func TestLoadRefusesBadCatalogs(t *testing.T) {
	t.Parallel()
	cases := map[string]struct{ body, want string }{
		"unknown field":         {`{"installations":[],"offerings":[],"extra":1}`, `unknown field "extra"`},
		"unknown pack":          {`{"installations":[{"name":"x","pack":"lambda"}]}`, "pack must be one of"},
		"workers-dev needs sub": {`{"installations":[{"name":"x","pack":"workers-dev"}]}`, "accountSubdomain"},
		"wfp needs base domain": {`{"installations":[{"name":"x","pack":"wfp-managed","baseDomain":"nodot"}]}`, "baseDomain"},
		"foreign setting":       {`{"installations":[{"name":"x","pack":"workers-dev","accountSubdomain":"a","baseDomain":"b.c"}]}`, "accountSubdomain only"},
		"bad suffix":            {`{"installations":[{"name":"x","pack":"selfhost","endpointSuffix":"Bad_Suffix"}]}`, "endpointSuffix"},
		"duplicate install":     {`{"installations":[{"name":"x","pack":"selfhost"},{"name":"x","pack":"selfhost"}]}`, "declared twice"},
		"one runtime twice":     {`{"installations":[{"name":"x","pack":"selfhost"},{"name":"y","pack":"selfhost","runtimeUrl":"http://127.0.0.1:8788/"}]}`, "share one script namespace"},
		"unknown installation":  {`{"installations":[],"offerings":[{"id":"o","kind":"module-worker","installation":"nope","soldTo":["*"]}]}`, "unknown installation"},
		"bad kind":              {`{"installations":[{"name":"x","pack":"selfhost"}],"offerings":[{"id":"o","kind":"vm","installation":"x","soldTo":["*"]}]}`, "kind must be"},
		"nobody sold to":        {`{"installations":[{"name":"x","pack":"selfhost"}],"offerings":[{"id":"o","kind":"module-worker","installation":"x","soldTo":[]}]}`, "soldTo"},
		"negative quota":        {`{"installations":[],"quotas":{"workers":-1}}`, "workers must be between 0"},
		"unknown quota":         {`{"installations":[],"quotas":{"cpus":4}}`, `unknown field "cpus"`},
		"negative rate":         {`{"installations":[],"rates":{"perKeyPerSecond":-1}}`, "perKeyPerSecond"},
		"zero burst":            {`{"installations":[],"rates":{"perKeyBurst":0}}`, "perKeyBurst"},
		"duplicate offering":    {`{"installations":[{"name":"x","pack":"selfhost"}],"offerings":[{"id":"o","kind":"module-worker","installation":"x","soldTo":["*"]},{"id":"o","kind":"worker-endpoint","installation":"x","soldTo":["*"]}]}`, "declared twice"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Load(write(t, c.body))
			require.ErrorContains(t, err, c.want)
		})
	}
}

func TestDigestFollowsTheInstallation(t *testing.T) {
	t.Parallel()
	load := func(suffix string) Offering {
		c, err := Load(write(t, `{"installations":[{"name":"x","pack":"selfhost","endpointSuffix":"`+suffix+`"}],
			"offerings":[{"id":"o","kind":"module-worker","installation":"x","soldTo":["*"]}]}`))
		require.NoError(t, err)
		return c.Offerings[0]
	}
	require.Equal(t, load("a.test").Digest, load("a.test").Digest)
	require.NotEqual(t, load("a.test").Digest, load("b.test").Digest, "moving the installation changes the digest")
}

func TestSelectNeedsExactlyOneEligibleOffering(t *testing.T) {
	t.Parallel()
	c, err := Load(write(t, `{"installations":[{"name":"x","pack":"selfhost"},{"name":"y","pack":"workers-dev","accountSubdomain":"acme"}],
		"offerings":[
		  {"id":"a","kind":"module-worker","installation":"x","soldTo":["*"]},
		  {"id":"b","kind":"module-worker","installation":"y","soldTo":["acme"]}]}`))
	require.NoError(t, err)
	acme := Organization{ID: "org_aaaaaaaa", Name: "acme"}
	other := Organization{ID: "org_bbbbbbbb", Name: "other"}

	_, _, err = c.Select(acme, KindWorker, "")
	require.True(t, errors.Is(err, ErrOfferingAmbiguous))
	o, _, err := c.Select(acme, KindWorker, "b")
	require.NoError(t, err)
	require.Equal(t, PackWorkersDev, o.Pack)
	o, _, err = c.Select(other, KindWorker, "")
	require.NoError(t, err)
	require.Equal(t, "a", o.ID)
	_, _, err = c.Select(other, KindWorker, "b")
	require.True(t, errors.Is(err, ErrOfferingUnknown), "an offering not sold to the organization is unknown to it")
	_, _, err = c.Select(acme, KindEndpoint, "")
	require.True(t, errors.Is(err, ErrOfferingAmbiguous), "zero eligible offerings is ambiguous too")
}

// TestOfferingDigestCoversPlacementOnly: selling an offering to one more organization changes no
// digest (nothing placed on it drifts), nor does moving its pool's first node (SPEC 6.2: members
// are not placement); moving its public edge address does. The digest written before pools
// covered runtimeUrl: it is kept as LegacyDigest, for the Host's one-time rewrite.
func TestOfferingDigestCoversPlacementOnly(t *testing.T) {
	t.Parallel()
	load := func(soldTo, runtimeURL string) Offering {
		t.Helper()
		c, err := build(file{
			Installations: []Installation{{Name: "x", Pack: PackSelfhost, RuntimeURL: runtimeURL}},
			Offerings:     []Offering{{ID: "o", Kind: KindWorker, Installation: "x", SoldTo: []string{soldTo}}},
		})
		require.NoError(t, err)
		return c.Offerings[0]
	}
	require.Equal(t, load("acme", "http://127.0.0.1:8788").Digest, load("*", "http://127.0.0.1:8788").Digest)
	require.Equal(t, load("acme", "http://127.0.0.1:8788").Digest, load("acme", "https://10.0.0.2:8788").Digest)
	require.NotEqual(t, load("acme", "http://127.0.0.1:8788").LegacyDigest, load("acme", "https://10.0.0.2:8788").LegacyDigest)
	require.NotEqual(t, load("acme", "http://127.0.0.1:8788").Digest, load("acme", "http://127.0.0.1:8788").LegacyDigest)

	// The digest of the release before pools, for a fixed installation: what its databases hold.
	c, err := build(file{
		Installations: []Installation{{Name: "local", Pack: PackSelfhost, RuntimeURL: "http://127.0.0.1:8788", EdgeListen: "127.0.0.1:8787"}},
		Offerings:     []Offering{{ID: "local-worker", Kind: KindWorker, Installation: "local", SoldTo: []string{"*"}}},
	})
	require.NoError(t, err)
	require.Equal(t, "50b74a4d8126b1697ebd31dbb5cd8025f04ee35e0fc7592da4d7bc3b0a891772", c.Offerings[0].LegacyDigest)

	edge := func(edgeListen string) Offering {
		t.Helper()
		c, err := build(file{
			Installations: []Installation{{Name: "x", Pack: PackSelfhost, EdgeListen: edgeListen}},
			Offerings:     []Offering{{ID: "o", Kind: KindWorker, Installation: "x", SoldTo: []string{"*"}}},
		})
		require.NoError(t, err)
		return c.Offerings[0]
	}
	require.NotEqual(t, edge("127.0.0.1:8787").Digest, edge("0.0.0.0:80").Digest, "the pool's public address is placement")
}

func TestQuotasAndRatesDefaultAndOverride(t *testing.T) {
	t.Parallel()
	d := Default()
	require.Equal(t, quota.Ceilings{Workers: 100, Endpoints: 100, Reservations: 200, RuntimeInputs: 100, CustomDomains: 20}, d.Quotas)
	require.Equal(t, Rates{PerSecond: 100, Burst: 1000}, d.Rates)

	c, err := Load(write(t, `{"installations":[],"quotas":{"workers":3,"runtimeInputs":0,"customDomains":5},"rates":{"perKeyPerSecond":2.5}}`))
	require.NoError(t, err)
	require.Equal(t, quota.Ceilings{Workers: 3, Endpoints: 100, Reservations: 200, RuntimeInputs: 0, CustomDomains: 5}, c.Quotas, "a key left out keeps its default; 0 is a ceiling")
	require.Equal(t, Rates{PerSecond: 2.5, Burst: 1000}, c.Rates)
}

func TestCloudflareInstallationsNameTheirAccountAndA0600TokenFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "cf-token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("token\n"), 0o600))
	loose := filepath.Join(dir, "loose-token")
	require.NoError(t, os.WriteFile(loose, []byte("token\n"), 0o644))
	catalogOf := func(fields string) string {
		return `{"installations":[{"name":"cf","pack":"workers-dev","accountSubdomain":"acme"` + fields + `}],
		  "offerings":[{"id":"cf-worker","kind":"module-worker","installation":"cf","soldTo":["*"]}]}`
	}
	good := `,"accountId":"0123abcd","apiTokenFile":"` + tokenFile + `","apiBaseUrl":"http://127.0.0.1:9/client/v4/"`
	c, err := Load(write(t, catalogOf(good)))
	require.NoError(t, err)
	inst := c.Installations["cf"]
	require.Equal(t, "0123abcd", inst.AccountID)
	require.Equal(t, tokenFile, inst.APITokenFile)

	for name, tc := range map[string]struct{ fields, want string }{
		"no token file":       {`,"accountId":"0123abcd"`, "apiTokenFile"},
		"no account":          {`,"apiTokenFile":"` + tokenFile + `"`, "accountId"},
		"token file 0644":     {`,"accountId":"0123abcd","apiTokenFile":"` + loose + `"`, "mode 0600"},
		"missing token file":  {`,"accountId":"0123abcd","apiTokenFile":"` + filepath.Join(dir, "nope") + `"`, "apiTokenFile"},
		"clear text base url": {`,"accountId":"0123abcd","apiTokenFile":"` + tokenFile + `","apiBaseUrl":"http://api.example.com/client/v4/"`, "not loopback"},
	} {
		_, err := Load(write(t, catalogOf(tc.fields)))
		require.ErrorContains(t, err, tc.want, name)
	}

	// The account is placement: moving it changes the digest; without one (derivation only) the
	// digest is what it always was.
	other, err := Load(write(t, catalogOf(`,"accountId":"9999ffff","apiTokenFile":"`+tokenFile+`"`)))
	require.NoError(t, err)
	bare, err := Load(write(t, catalogOf("")))
	require.NoError(t, err)
	require.NotEqual(t, c.Offerings[0].Digest, other.Offerings[0].Digest)
	require.NotEqual(t, c.Offerings[0].Digest, bare.Offerings[0].Digest)
	require.Equal(t, "49206e17", bare.Offerings[0].Digest[:8], "the digest of an installation without accountId is unchanged")
}

func TestCloudflarePackSettings(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "cf-token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("token\n"), 0o600))
	api := `"accountId":"0123abcd","apiTokenFile":"` + tokenFile + `"`
	wfp := func(fields string) string {
		return `{"installations":[{"name":"cf","pack":"wfp-managed","baseDomain":"apps.example.com",` + api + fields + `}],
		  "offerings":[{"id":"cf-worker","kind":"module-worker","installation":"cf","soldTo":["*"]}]}`
	}
	full := `,"dispatchNamespace":"tenants","dispatchWorkerName":"takoform-dispatch","routingKvNamespaceId":"0f2ac74b498b48028cb68387c421e279"`
	c, err := Load(write(t, wfp(full)))
	require.NoError(t, err)
	inst := c.Installations["cf"]
	require.Equal(t, DefaultWFPPropagation, inst.Propagation())
	require.Equal(t, DefaultScriptCeiling, inst.Scripts())

	c, err = Load(write(t, wfp(full+`,"scriptCeiling":100,"routePropagationSeconds":120`)))
	require.NoError(t, err)
	require.Equal(t, 120*time.Second, c.Installations["cf"].Propagation())
	require.Equal(t, 100, c.Installations["cf"].Scripts())

	for name, tc := range map[string]struct{ doc, want string }{
		"no dispatch namespace": {wfp(`,"dispatchWorkerName":"d","routingKvNamespaceId":"k"`), "dispatchNamespace"},
		"no routing kv":         {wfp(`,"dispatchNamespace":"n","dispatchWorkerName":"d"`), "routingKvNamespaceId"},
		"negative ceiling":      {wfp(full + `,"scriptCeiling":-1`), "negative"},
		"selfhost ceiling": {`{"installations":[{"name":"s","pack":"selfhost","edgeListen":"127.0.0.1:8787","scheme":"http","runtimeUrl":"http://127.0.0.1:8788","runtimeTokenFile":"t","scriptCeiling":5}],
		  "offerings":[{"id":"s","kind":"module-worker","installation":"s","soldTo":["*"]}]}`, "Cloudflare installations"},
		"workers-dev with namespace": {`{"installations":[{"name":"w","pack":"workers-dev","accountSubdomain":"acme","dispatchNamespace":"n"}],
		  "offerings":[{"id":"w","kind":"module-worker","installation":"w","soldTo":["*"]}]}`, "accountSubdomain only"},
	} {
		_, err := Load(write(t, tc.doc))
		require.ErrorContains(t, err, tc.want, name)
	}
	require.Equal(t, DefaultWorkersDevPropagation, Installation{Pack: PackWorkersDev}.Propagation())
}

func TestWFPManagedOnCloudflareNeedsAPropagationWindowOfTheKVCache(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "cf-token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("token\n"), 0o600))
	wfp := func(fields string) string {
		return `{"installations":[{"name":"cf","pack":"wfp-managed","baseDomain":"apps.example.com","accountId":"0123abcd","apiTokenFile":"` + tokenFile +
			`","dispatchNamespace":"tenants","dispatchWorkerName":"d","routingKvNamespaceId":"k"` + fields + `}],
		  "offerings":[{"id":"cf-worker","kind":"module-worker","installation":"cf","soldTo":["*"]}]}`
	}
	_, err := Load(write(t, wfp(`,"routePropagationSeconds":30`)))
	require.ErrorContains(t, err, "at least 60", "Cloudflare's edge caches the routing entry for 60 s")
	_, err = Load(write(t, wfp(`,"routePropagationSeconds":60`)))
	require.NoError(t, err)
	_, err = Load(write(t, wfp(`,"routePropagationSeconds":2,"apiBaseUrl":"http://127.0.0.1:9/client/v4/"`)))
	require.NoError(t, err, "a Cloudflare-compatible API of the operator's own may cache less")

	// The dispatch and routing namespaces are placement: moving either changes the digest.
	a, err := Load(write(t, wfp("")))
	require.NoError(t, err)
	b, err := Load(write(t, strings.Replace(wfp(""), `"dispatchNamespace":"tenants"`, `"dispatchNamespace":"other"`, 1)))
	require.NoError(t, err)
	c, err := Load(write(t, strings.Replace(wfp(""), `"routingKvNamespaceId":"k"`, `"routingKvNamespaceId":"k2"`, 1)))
	require.NoError(t, err)
	require.NotEqual(t, a.Offerings[0].Digest, b.Offerings[0].Digest)
	require.NotEqual(t, a.Offerings[0].Digest, c.Offerings[0].Digest)
}

// Chosen labels are sold per offering: by default on selfhost and wfp-managed, never on
// workers-dev (its labels are script names), and not in the digest; the operator's reserved
// labels are DNS labels (SPEC 3.3).
func TestChosenLabelsArePerOfferingAndReservedLabelsAreLabels(t *testing.T) {
	t.Parallel()
	c, err := Load(write(t, `{"installations":[{"name":"x","pack":"selfhost"},{"name":"y","pack":"workers-dev","accountSubdomain":"acme"}],
		"offerings":[{"id":"a","kind":"module-worker","installation":"x","soldTo":["*"]},
		  {"id":"b","kind":"module-worker","installation":"x","soldTo":["*"],"chosenLabels":false},
		  {"id":"c","kind":"module-worker","installation":"y","soldTo":["*"]}],
		"reservedLabels":["admin","www"]}`))
	require.NoError(t, err)
	require.True(t, c.Offerings[0].SellsChosenLabels())
	require.False(t, c.Offerings[1].SellsChosenLabels())
	require.False(t, c.Offerings[2].SellsChosenLabels(), "workers-dev sells none")
	require.Equal(t, map[string]bool{"admin": true, "www": true}, c.ReservedLabels)

	_, err = Load(write(t, `{"installations":[{"name":"y","pack":"workers-dev","accountSubdomain":"acme"}],
		"offerings":[{"id":"c","kind":"module-worker","installation":"y","soldTo":["*"],"chosenLabels":true}]}`))
	require.ErrorContains(t, err, "workers-dev sells no chosen labels")
	_, err = Load(write(t, `{"installations":[],"reservedLabels":["Not.A.Label"]}`))
	require.ErrorContains(t, err, "not one lowercase DNS label")

	digest := func(chosen string) string {
		c, err := Load(write(t, `{"installations":[{"name":"x","pack":"selfhost"}],
			"offerings":[{"id":"a","kind":"module-worker","installation":"x","soldTo":["*"]`+chosen+`}]}`))
		require.NoError(t, err)
		return c.Offerings[0].Digest
	}
	require.Equal(t, digest(""), digest(`,"chosenLabels":false`), "selling labels or not moves no worker")
}

// An offering's bundle ceiling is 10 MiB unless the catalog names one, between 1 byte and 20 MiB;
// it bounds what a worker holds, not where it runs, so it moves no offering's digest.
func TestMaxBundleBytesIsPerOfferingAndMovesNoDigest(t *testing.T) {
	t.Parallel()
	load := func(extra string) (*Catalog, error) {
		return Load(write(t, `{"installations":[{"name":"x","pack":"selfhost"}],
			"offerings":[{"id":"a","kind":"module-worker","installation":"x","soldTo":["*"]`+extra+`}]}`))
	}
	c, err := load("")
	require.NoError(t, err)
	require.EqualValues(t, 10<<20, c.Offerings[0].BundleCeiling())
	small, err := load(`,"maxBundleBytes":3145728`)
	require.NoError(t, err)
	require.EqualValues(t, 3<<20, small.Offerings[0].BundleCeiling())
	require.Equal(t, c.Offerings[0].Digest, small.Offerings[0].Digest)
	for _, bad := range []string{`,"maxBundleBytes":-1`, `,"maxBundleBytes":20971521`} {
		_, err := load(bad)
		require.ErrorContains(t, err, "maxBundleBytes must be between 1 and 20971520", bad)
	}
}
