// Package packs names the mutator of every backend pack built, for a backend.Registry: the
// registry lives in package backend, beside the interface every pack implements, and each pack in
// a package of its own that imports it.
package packs

import (
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare"
	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
)

// All makes the mutators of every pack: a runtime node's (selfhost) and Cloudflare's (workers-dev
// and wfp-managed, one mutator for both).
func All() map[string]backend.Pack {
	return map[string]backend.Pack{
		catalog.PackSelfhost:   selfhost.NewMutator,
		catalog.PackWorkersDev: cloudflare.NewMutator,
		catalog.PackWFPManaged: cloudflare.NewMutator,
	}
}

// Registry is a registry of every pack, with no wrapper, budget or log.
func Registry() *backend.Registry { return &backend.Registry{Packs: All()} }
