// Package migrations embeds the Host's golang-migrate SQL files so that `takoserver migrate up` and
// server start-up apply exactly the schema this binary was built with.
package migrations

import "embed"

// FS holds the numbered up and down migrations.
//
//go:embed *.sql
var FS embed.FS
