package store

import (
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"strings"
)

//go:embed queries/*.sql
var queryFiles embed.FS

var queryName = regexp.MustCompile(`(?m)^-- name: ([A-Za-z][A-Za-z0-9]*)\s*$`)

// queries maps each `-- name: X` block of queries/*.sql to its SQL text.
var queries = mustLoadQueries()

func mustLoadQueries() map[string]string {
	out := map[string]string{}
	paths, err := fs.Glob(queryFiles, "queries/*.sql")
	if err != nil {
		panic(err)
	}
	for _, path := range paths {
		raw, err := queryFiles.ReadFile(path)
		if err != nil {
			panic(err)
		}
		text := string(raw)
		marks := queryName.FindAllStringSubmatchIndex(text, -1)
		for i, m := range marks {
			end := len(text)
			if i+1 < len(marks) {
				end = marks[i+1][0]
			}
			name := text[m[2]:m[3]]
			if _, dup := out[name]; dup {
				panic(fmt.Sprintf("query %s is defined twice", name))
			}
			out[name] = strings.TrimSpace(text[m[1]:end])
		}
	}
	return out
}

// Q returns the SQL of the named query. It panics on an unknown name, which the store's tests
// catch: every name is prepared against a real database there.
func Q(name string) string {
	sql, ok := queries[name]
	if !ok {
		panic("unknown query " + name)
	}
	return sql
}

// QueryNames lists every named query, for tests.
func QueryNames() []string {
	names := make([]string, 0, len(queries))
	for name := range queries {
		names = append(names, name)
	}
	return names
}
