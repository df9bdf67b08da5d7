package sourcemaps_test

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/sourcemaps"
)

// fixture is the bundle esbuild made of ../testdata/sourcemap/src (build.sh there): a minified
// one-line index.js and its map.
func fixture(t *testing.T) map[string]string {
	t.Helper()
	modules := map[string]string{}
	for _, name := range []string{"index.js", "index.js.map"} {
		b, err := os.ReadFile(filepath.Join("..", "testdata", "sourcemap", name))
		require.NoError(t, err)
		modules[name] = string(b)
	}
	return modules
}

// at is the place in the bundle of the first occurrence of code, as V8 writes it (columns from 1).
func at(t *testing.T, bundle, code string) string {
	t.Helper()
	i := strings.Index(bundle, code)
	require.GreaterOrEqual(t, i, 0, code)
	require.NotContains(t, bundle[:i], "\n", "the bundle is one line")
	return fmt.Sprintf("index.js:1:%d", i+1)
}

// forModules is c's Mapper for a bundle held in memory.
func forModules(c *sourcemaps.Cache, org, id string, modules map[string]string) *sourcemaps.Mapper {
	return c.For(org, id, slices.Sorted(maps.Keys(modules)), func(name string) (string, error) { return modules[name], nil })
}

// A map is read from the node's store only when a place of its module is first mapped, and not
// again while the cache keeps it parsed; one that cannot be read maps nothing.
func TestAMapIsReadOnDemandAndOnce(t *testing.T) {
	t.Parallel()
	modules := fixture(t)
	place := "at " + at(t, modules["index.js"], `new TypeError`)
	c := sourcemaps.NewCache(4)
	reads := 0
	m := c.For("org-1", "inc-1", slices.Sorted(maps.Keys(modules)), func(name string) (string, error) {
		reads++
		require.Equal(t, "index.js.map", name)
		return modules[name], nil
	})
	require.Zero(t, reads, "nothing is read before a place is mapped")
	for range 3 {
		require.Contains(t, m.Apply(place), "src/greet.js:5:")
	}
	require.Equal(t, 1, reads)

	gone := c.For("org-1", "inc-2", slices.Sorted(maps.Keys(modules)), func(string) (string, error) {
		return "", errors.New("the bundle is gone")
	})
	require.Equal(t, place, gone.Apply(place))
}

// Places in a mapped module become the original file, line and column, in stack frames and in
// messages, with or without a scheme before the name; places in other modules, places the map
// does not cover and names that only end like the module stay as they are.
func TestPlacesInAMappedModuleNameTheOriginalSource(t *testing.T) {
	t.Parallel()
	modules := fixture(t)
	bundle := modules["index.js"]
	throw, stack := at(t, bundle, `new TypeError`), at(t, bundle, `new Error("traced")`)
	m := forModules(sourcemaps.NewCache(4), "org-1", "inc-1", modules)
	require.NotNil(t, m)

	got := m.Apply("TypeError: no greeting for boom\n    at o (" + throw + ")\n    at Object.fetch (file:///" + stack + ")")
	require.Contains(t, got, "at o (src/greet.js:5:")
	require.Contains(t, got, "at Object.fetch (src/greet.js:11:")
	require.NotContains(t, got, "index.js:")

	require.Equal(t, "thrown at src/greet.js:5:", m.Apply("thrown at " + throw)[:len("thrown at src/greet.js:5:")])
	for _, kept := range []string{"at other.js:1:5", "at myindex.js:1:5", "index.js:7:1", "index.js:1:0", "no place here"} {
		require.Equal(t, kept, m.Apply(kept), kept)
	}
}

// A bundle without maps has no mapper, and a nil mapper changes nothing; a map whose mappings name
// sources it does not have (which panics the parser's lookup) changes nothing either.
func TestWithoutAUsableMapNothingChanges(t *testing.T) {
	t.Parallel()
	c := sourcemaps.NewCache(4)
	require.Nil(t, forModules(c, "org-1", "inc-1", map[string]string{"index.js": "x"}))
	var none *sourcemaps.Mapper
	require.Equal(t, "at index.js:1:5", none.Apply("at index.js:1:5"))
	broken := forModules(c, "org-1", "inc-2", map[string]string{"index.js": "x", "index.js.map": `{"version":3,"mappings":"!!!"}`})
	require.Equal(t, "at index.js:1:5", broken.Apply("at index.js:1:5"))
	orphan := forModules(c, "org-1", "inc-3", map[string]string{"index.js.map": fixture(t)["index.js.map"]})
	require.Nil(t, orphan, "a map without its module maps nothing")
}

// The cache keeps at most its size of parsed maps, the least recently used leaving first.
func TestTheCacheKeepsTheMostRecentlyUsedMaps(t *testing.T) {
	t.Parallel()
	modules := fixture(t)
	place := "at " + at(t, modules["index.js"], `new TypeError`)
	c := sourcemaps.NewCache(2)
	for i := range 5 {
		m := forModules(c, "org-1", fmt.Sprintf("inc-%d", i), modules)
		require.Contains(t, m.Apply(place), "src/greet.js:5:")
		require.LessOrEqual(t, c.Len(), 2)
	}
	require.Equal(t, 2, c.Len())
}

// Parsing takes the node's CPU, so an organization whose workers' maps evict each other parses at
// most its budget (ParseBurst, then ParsesPerSecond): past it its places stay unmapped, another
// organization's are still mapped, and time gives the budget back.
func TestAnOrganizationParsesMapsWithinItsBudget(t *testing.T) {
	t.Parallel()
	modules := fixture(t)
	place := "at " + at(t, modules["index.js"], `new TypeError`)
	now := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	c := sourcemaps.NewCacheWithClock(1, func() time.Time { return now })
	mapped := func(org string, i int) bool {
		return strings.Contains(forModules(c, org, fmt.Sprintf("%s-inc-%d", org, i), modules).Apply(place), "src/greet.js:5:")
	}
	for i := range sourcemaps.ParseBurst {
		require.True(t, mapped("org-a", i), "parse %d is within the burst", i)
	}
	require.False(t, mapped("org-a", 100), "past its budget an organization's places stay unmapped")
	require.True(t, mapped("org-b", 0), "another organization's budget is its own")
	now = now.Add(time.Second)
	require.True(t, mapped("org-a", 101), "a second gives parses back")
}
