package workerconf

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestValidateRefusesWhatARuntimeCannotBind(t *testing.T) {
	ok := Settings{Vars: map[string]string{"LOG_LEVEL": "debug"}, JSONVars: map[string]string{"LIMITS": `{"rps": 5}`},
		CompatibilityFlags: []string{"nodejs_compat"}}
	require.NoError(t, ok.Validate([]string{"API_KEY"}))
	for want, s := range map[string]Settings{
		"must match":          {Vars: map[string]string{"1BAD": "x"}},
		"keeps for its own":   {Vars: map[string]string{"TAKOFORM_WORKER_UID": "x"}},
		"required sensitive":  {Vars: map[string]string{"API_KEY": "x"}},
		"bytes; at most":      {Vars: map[string]string{"BIG": strings.Repeat("x", MaxVarBytes+1)}},
		"not valid UTF-8":     {Vars: map[string]string{"BAD": "\xff"}},
		"not a JSON text":     {JSONVars: map[string]string{"J": "{nope"}},
		"both vars and":       {Vars: map[string]string{"X": "1"}, JSONVars: map[string]string{"X": "1"}},
		"compatibility flag ": {CompatibilityFlags: []string{"Nodejs-Compat"}},
	} {
		err := s.Validate([]string{"API_KEY"})
		require.ErrorContains(t, err, want)
	}
	many := Settings{Vars: map[string]string{}}
	for i := range MaxVars + 1 {
		many.Vars["V"+strings.Repeat("_", i%3)+string(rune('A'+i%26))+strings.Repeat("X", i/26)] = "x"
	}
	require.Len(t, many.Vars, MaxVars+1)
	require.ErrorContains(t, many.Validate(nil), "at most 128")
}

func TestNormalizeMakesEmptySettingsNil(t *testing.T) {
	require.Equal(t, Settings{}, Settings{Vars: map[string]string{}, CompatibilityFlags: []string{}}.Normalize())
	n := Settings{CompatibilityFlags: []string{"b", "a", "b"}}.Normalize()
	require.Equal(t, []string{"a", "b"}, n.CompatibilityFlags)
	require.True(t, n.Equal(Settings{CompatibilityFlags: []string{"a", "b"}}))
}

func TestServiceBindingNamesAreBindingsLikeAnyOther(t *testing.T) {
	const callee = "0b9c6f1e-2f53-4d8e-9a3c-3f0f7a1b2c3d"
	ok := Settings{Vars: map[string]string{"LOG_LEVEL": "debug"}, ServiceBindings: map[string]string{"AUTH": callee}}
	require.NoError(t, ok.Validate([]string{"API_KEY"}))
	for want, s := range map[string]Settings{
		"must match":           {ServiceBindings: map[string]string{"1BAD": callee}},
		"keeps for its own":    {ServiceBindings: map[string]string{"TAKOFORM_SELF": callee}},
		"required sensitive":   {ServiceBindings: map[string]string{"API_KEY": callee}},
		"is also a var":        {Vars: map[string]string{"AUTH": "x"}, ServiceBindings: map[string]string{"AUTH": callee}},
		"must be a worker UID": {ServiceBindings: map[string]string{"AUTH": "prod/auth"}},
	} {
		require.ErrorContains(t, s.Validate([]string{"API_KEY"}), want)
	}
	jsonClash := Settings{JSONVars: map[string]string{"AUTH": "1"}, ServiceBindings: map[string]string{"AUTH": callee}}
	require.ErrorContains(t, jsonClash.Validate(nil), "is also a var")
}

func TestCeilingsBoundLimits(t *testing.T) {
	selfhost := Ceilings{CPUMs: 30000, MemoryMB: 256}
	require.NoError(t, selfhost.Check(&Limits{CPUMs: 50, MemoryMB: 64}))
	require.NoError(t, selfhost.Check(nil))
	require.ErrorContains(t, selfhost.Check(&Limits{CPUMs: 30001}), "limits.cpuMs 30001 is above this offering's ceiling of 30000")
	require.ErrorContains(t, selfhost.Check(&Limits{MemoryMB: 257}), "limits.memoryMb 257 is above")
	cloudflare := Ceilings{CPUMs: 30000, MemoryMB: 128, FixedMemory: true}
	require.NoError(t, cloudflare.Check(&Limits{CPUMs: 50}))
	require.NoError(t, cloudflare.Check(&Limits{MemoryMB: 128}))
	require.ErrorContains(t, cloudflare.Check(&Limits{MemoryMB: 64}), "must be 128")
	var le *LimitError
	require.ErrorAs(t, selfhost.Check(&Limits{MemoryMB: MinMemoryMB - 1}), &le)
	require.Equal(t, "memoryMb", le.Field)
	require.NoError(t, selfhost.Check(&Limits{MemoryMB: MinMemoryMB}))
}

// A module's kind is its extension's; bytes modules hold standard base64, decoded for their
// content; the main module must be code.
func TestModulesAreTextOrBytesByTheirNames(t *testing.T) {
	t.Parallel()
	for name, kind := range map[string]string{"index.js": ModuleJS, "lib.mjs": ModuleJS, "data.json": ModuleJSON, "a.txt": ModuleText, "add.wasm": ModuleWasm, "blob.bin": ModuleData} {
		require.Equal(t, kind, ModuleKind(name), name)
	}
	b, err := ModuleBytes("add.wasm", "AGFzbQEAAAA=")
	require.NoError(t, err)
	require.Equal(t, []byte("\x00asm\x01\x00\x00\x00"), b)
	_, err = ModuleBytes("add.wasm", "not base64!")
	require.ErrorContains(t, err, "standard base64")
	text, err := ModuleBytes("index.js", "not base64!")
	require.NoError(t, err)
	require.Equal(t, "not base64!", string(text))

	require.NoError(t, CheckModules(map[string]string{"index.js": "x", "add.wasm": "AGFzbQEAAAA="}, "index.js"))
	require.ErrorContains(t, CheckModules(map[string]string{"add.wasm": "AGFzbQEAAAA="}, "add.wasm"), "the main module is the worker's ES module code")
	require.ErrorContains(t, CheckModules(map[string]string{"index.js": "x", "blob.bin": "%%%"}, "index.js"), `module "blob.bin" holds bytes`)
}

// A source map sits beside the ES module it maps, is a version 3 map within its bounds, and is
// not counted against the bundle ceiling (SPEC 3.6).
func TestASourceMapSitsBesideItsModuleAndIsNotCode(t *testing.T) {
	t.Parallel()
	const sm = `{"version":3,"sources":["src/a.ts"],"mappings":"AAAA"}`
	mapped, ok := SourceMapOf("lib/index.js.map")
	require.True(t, ok)
	require.Equal(t, "lib/index.js", mapped)
	_, ok = SourceMapOf("index.js")
	require.False(t, ok)
	require.Equal(t, ModuleSourceMap, ModuleKind("index.js.map"))

	require.NoError(t, CheckModules(map[string]string{"index.js": "x", "index.js.map": sm}, "index.js"))
	for name, c := range map[string]struct {
		modules map[string]string
		want    string
	}{
		"no module":      {map[string]string{"index.js": "x", "other.js.map": sm}, `no ES module "other.js" beside it`},
		"maps data":      {map[string]string{"index.js": "x", "a.txt": "t", "a.txt.map": sm}, `no ES module "a.txt" beside it`},
		"not json":       {map[string]string{"index.js": "x", "index.js.map": "{"}, "is not JSON"},
		"not version 3":  {map[string]string{"index.js": "x", "index.js.map": `{"version":2,"mappings":""}`}, "not a version 3 source map"},
		"no mappings":    {map[string]string{"index.js": "x", "index.js.map": `{"version":3}`}, "not a version 3 source map"},
		"too large":      {map[string]string{"index.js": "x", "index.js.map": `{"version":3,"mappings":"` + strings.Repeat("A", MaxSourceMapBytes) + `"}`}, "may hold at most 2097152"},
		"main is a map":  {map[string]string{"index.js": "x", "index.js.map": sm}, "the main module is the worker's ES module code"},
		"too many bytes": {map[string]string{"a.js": "x", "b.js": "x", "c.js": "x", "a.js.map": big(), "b.js.map": big(), "c.js.map": big()}, "a bundle's maps may hold at most 4194304"},
	} {
		main := "index.js"
		if name == "main is a map" {
			main = "index.js.map"
		} else if name == "too many bytes" {
			main = "a.js"
		}
		require.ErrorContains(t, CheckModules(c.modules, main), c.want, name)
	}
	require.EqualValues(t, len("index.js")+1, BundleBytes(map[string]string{"index.js": "x", "index.js.map": sm}), "a map is not counted")
	require.True(t, HasSourceMaps(map[string]string{"index.js": "x", "index.js.map": sm}))
	require.False(t, HasSourceMaps(map[string]string{"index.js": "x"}))
}

func big() string {
	return `{"version":3,"mappings":"` + strings.Repeat("A", MaxSourceMapBytes-64) + `"}`
}

// Crons are standard five-field expressions read in UTC, at most 16, sorted and without repeats
// once normalized; descriptors, seconds and impossible dates are refused.
func TestCronsAreFiveFieldExpressionsInUTC(t *testing.T) {
	t.Parallel()
	s, err := ParseCron("*/15 9-17 * * 1-5")
	require.NoError(t, err)
	at := time.Date(2026, 12, 4, 9, 7, 0, 0, time.FixedZone("CET", 3600)) // 08:07 UTC, a Friday
	require.Equal(t, time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC), s.Next(at))
	for _, bad := range []string{"@hourly", "0 * * * * *", "* * * *", "61 * * * *", "0 0 30 2 *", " * * * * *", "*  * * * *", "x * * * *"} {
		_, err := ParseCron(bad)
		require.Error(t, err, bad)
	}
	n := Settings{Crons: []string{"0 * * * *", "*/5 * * * *", "0 * * * *"}}.Normalize()
	require.Equal(t, []string{"*/5 * * * *", "0 * * * *"}, n.Crons)
	require.False(t, n.Equal(Settings{}.Normalize()))
	require.NoError(t, n.Validate(nil))
	many := Settings{}
	for i := range MaxCrons + 1 {
		many.Crons = append(many.Crons, fmt.Sprintf("%d * * * *", i))
	}
	require.ErrorContains(t, many.Validate(nil), "at most 16")
	require.ErrorContains(t, Settings{Crons: []string{"@daily"}}.Validate(nil), "five fields")
}
