// Package sourcemaps names a worker's original files and lines in what it prints. A bundle may
// carry a source map beside a code module (`<module>.map`, SPEC 3.6): it is never loaded into the
// isolate; the node keeps it with the script and, when a log line or an uncaught exception names
// a place in the module ("index.js:1:21912"), writes the original place instead
// ("src/greet.js:5:30"). Maps are parsed on first use and a node keeps a bounded number parsed.
package sourcemaps

import (
	"container/list"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sourcemap/sourcemap"

	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

// Cache keeps the most recently used parsed maps of a node. A parsed map costs a few times its
// text in memory, so a node that holds thousands of workers keeps only those whose workers print
// locations now and then. Parsing a 2 MiB map takes the node's CPU for milliseconds, so each
// organization may parse at most ParsesPerSecond (burst ParseBurst): one whose workers evict each
// other's maps gets its places unmapped rather than the node's CPU.
type Cache struct {
	size int
	now  func() time.Time

	mu      sync.Mutex
	order   *list.List // of *entry, most recently used first
	entries map[string]*list.Element
	parses  map[string]*bucket // by organization
}

// The parses an organization may make.
const (
	ParsesPerSecond = 2
	ParseBurst      = 8
)

type bucket struct {
	tokens float64
	last   time.Time
}

type entry struct {
	key      string
	consumer *sourcemap.Consumer // nil: the map did not parse
}

// DefaultCacheSize is how many parsed maps a node keeps.
const DefaultCacheSize = 16

// NewCache returns a cache of at most size parsed maps.
func NewCache(size int) *Cache { return NewCacheWithClock(size, time.Now) }

// NewCacheWithClock is NewCache with a clock of the caller's.
func NewCacheWithClock(size int, now func() time.Time) *Cache {
	return &Cache{size: max(1, size), now: now, order: list.New(), entries: map[string]*list.Element{}, parses: map[string]*bucket{}}
}

// takeParse takes one parse from org's budget (c.mu held).
func (c *Cache) takeParse(org string) bool {
	now := c.now()
	b := c.parses[org]
	if b == nil {
		b = &bucket{tokens: ParseBurst, last: now}
		c.parses[org] = b
	}
	b.tokens = min(ParseBurst, b.tokens+now.Sub(b.last).Seconds()*ParsesPerSecond)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// parsed is the parsed map of key, read (and parsed) on a miss within org's budget; nil when the
// budget is spent, or the map cannot be read or parsed.
func (c *Cache) parsed(org, key string, read func() (string, error)) *sourcemap.Consumer {
	c.mu.Lock()
	if el, ok := c.entries[key]; ok {
		c.order.MoveToFront(el)
		c.mu.Unlock()
		return el.Value.(*entry).consumer
	}
	if !c.takeParse(org) {
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	// Read and parsed outside the lock: a large map takes milliseconds, and other workers' lines
	// wait for nothing of it. Two first uses at once parse twice and keep one.
	text, err := read()
	if err != nil {
		return nil
	}
	consumer := parse(text)
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[key]; ok {
		c.order.MoveToFront(el)
		return el.Value.(*entry).consumer
	}
	c.entries[key] = c.order.PushFront(&entry{key: key, consumer: consumer})
	for c.order.Len() > c.size {
		oldest := c.order.Back()
		c.order.Remove(oldest)
		delete(c.entries, oldest.Value.(*entry).key)
	}
	return consumer
}

// parse is the parsed map of text, or nil. A map is the tenant's: the parser must not take the
// node down with a panic on one it was not written for.
func parse(text string) (consumer *sourcemap.Consumer) {
	defer func() {
		if recover() != nil {
			consumer = nil
		}
	}()
	consumer, err := sourcemap.Parse("", []byte(text))
	if err != nil {
		return nil
	}
	return consumer
}

// source is the original place of a generated one (line from 1, column from 0), guarded as
// parse is: a map whose mappings name sources or names it lacks must not panic the node.
func source(c *sourcemap.Consumer, line, column int) (file string, origLine, origColumn int, ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	file, _, origLine, origColumn, ok = c.Source(line, column)
	return file, origLine, origColumn, ok && file != ""
}

// Len is how many parsed maps the cache holds.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}

// Mapper rewrites the places of one incarnation's mapped modules. The zero Mapper (nil) changes
// nothing.
type Mapper struct {
	cache *Cache
	// id names the incarnation in the cache: its bundle, maps included, is fixed by it; org is its
	// organization, whose parse budget it spends.
	id    string
	org   string
	maps  map[string]string // module name → its map's module name
	read  func(module string) (string, error)
	place *regexp.Regexp
}

// For is the Mapper of organization org's incarnation id whose bundle's modules are names, or nil
// when no module of it has a map. A map is read (read names the module) only when a place in its
// module is first mapped, and again only once the cache has dropped it: the node does not hold
// the maps of its workers.
func (c *Cache) For(org, id string, names []string, read func(module string) (string, error)) *Mapper {
	maps := map[string]string{}
	for _, name := range names {
		if mapped, ok := workerconf.SourceMapOf(name); ok && slices.Contains(names, mapped) {
			maps[mapped] = name
		}
	}
	if len(maps) == 0 {
		return nil
	}
	quoted := make([]string, 0, len(maps))
	for name := range maps {
		quoted = append(quoted, regexp.QuoteMeta(name))
	}
	// Longest first, so that "lib/index.js" is not read as "index.js" after "lib/".
	slices.SortFunc(quoted, func(a, b string) int { return len(b) - len(a) })
	// A place is the module's name, as V8 writes it in a stack frame or an error message
	// (sometimes after a scheme and slashes), then :line:column. What precedes it may not be part
	// of a longer name.
	place := regexp.MustCompile(`(^|[\s(@"'=])((?:[a-z][a-z0-9+.-]*:/+)?/?)(` + strings.Join(quoted, "|") + `):(\d+):(\d+)`)
	return &Mapper{cache: c, id: id, org: org, maps: maps, read: read, place: place}
}

// Apply is text with every place in a mapped module written as the original file, line and
// column the map gives; a place the map does not cover is left as it is.
func (m *Mapper) Apply(text string) string {
	if m == nil || !strings.Contains(text, ":") {
		return text
	}
	return m.place.ReplaceAllStringFunc(text, func(found string) string {
		g := m.place.FindStringSubmatch(found)
		lead, module := g[1], g[3]
		line, err1 := strconv.Atoi(g[4])
		column, err2 := strconv.Atoi(g[5])
		if err1 != nil || err2 != nil || line < 1 || column < 1 {
			return found
		}
		consumer := m.cache.parsed(m.org, m.id+"\x00"+module, func() (string, error) { return m.read(m.maps[module]) })
		if consumer == nil {
			return found
		}
		// V8 counts columns from 1, a source map from 0.
		file, origLine, origColumn, ok := source(consumer, line, column-1)
		if !ok {
			return found
		}
		return fmt.Sprintf("%s%s:%d:%d", lead, strings.TrimPrefix(file, "./"), origLine, origColumn+1)
	})
}
