// Package backend is the seam between the Host and where workers run. A backend is a pack
// (selfhost, workers-dev, wfp-managed) plus an installation's settings. Every pack derives names and
// origins without side effects (SPEC 3.4, here), and the real mutation path uses the same
// derivation. This package holds what every pack implements (Mutator and its capabilities) and the
// Registry that hands out mutators; each pack's mutator is a package of its own below it (selfhost,
// cloudflare), and package packs names them all.
package backend

import (
	"fmt"
	"net"

	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// Backend derives the names and the canonical origin of a worker on one installation.
type Backend interface {
	// Pack is the backend pack's name.
	Pack() string
	// ScriptName is the name the worker's script has on the backend.
	ScriptName(w WorkerRef) string
	// HostMintedSubdomain names the label of a Host-minted reservation, or reports false for a
	// backend that sells its base domain (wfp-managed).
	HostMintedSubdomain(w WorkerRef) (string, bool)
	// DefaultLabel is the subdomain a reservation gets when the caller names none.
	DefaultLabel(w WorkerRef) string
	// CanonicalOrigin is the public origin that serves label.
	CanonicalOrigin(label string) string
}

// For returns the backend of one installation.
func For(inst catalog.Installation) (Backend, error) {
	switch inst.Pack {
	case catalog.PackSelfhost:
		return selfhost{inst: inst}, nil
	case catalog.PackWorkersDev:
		return workersDev{inst: inst}, nil
	case catalog.PackWFPManaged:
		return wfpManaged{inst: inst}, nil
	default:
		return nil, fmt.Errorf("unknown backend pack %q", inst.Pack)
	}
}

// ValidLabel reports whether s can be a subdomain: one lowercase DNS label.
func ValidLabel(s string) bool { return vocab.Label.MatchString(s) }

type selfhost struct{ inst catalog.Installation }

func (selfhost) Pack() string                    { return catalog.PackSelfhost }
func (selfhost) ScriptName(w WorkerRef) string   { return ScriptName(w) }
func (selfhost) DefaultLabel(w WorkerRef) string { return ScriptName(w) }
func (selfhost) HostMintedSubdomain(w WorkerRef) (string, bool) {
	return ScriptName(w), true
}

// CanonicalOrigin serves label under the endpoint suffix on the edge's port, which is left out
// when it is the scheme's default.
func (b selfhost) CanonicalOrigin(label string) string {
	host := label + "." + b.inst.EndpointSuffix
	_, port, err := net.SplitHostPort(b.inst.EdgeListen)
	if err == nil && !(b.inst.Scheme == "http" && port == "80") && !(b.inst.Scheme == "https" && port == "443") {
		host = net.JoinHostPort(host, port)
	}
	return b.inst.Scheme + "://" + host
}

type workersDev struct{ inst catalog.Installation }

func (workersDev) Pack() string                    { return catalog.PackWorkersDev }
func (workersDev) ScriptName(w WorkerRef) string   { return ScriptName(w) }
func (workersDev) DefaultLabel(w WorkerRef) string { return ScriptName(w) }
func (workersDev) HostMintedSubdomain(w WorkerRef) (string, bool) {
	return ScriptName(w), true
}
func (b workersDev) CanonicalOrigin(label string) string {
	return "https://" + label + "." + b.inst.AccountSubdomain + ".workers.dev"
}

type wfpManaged struct{ inst catalog.Installation }

func (wfpManaged) Pack() string                  { return catalog.PackWFPManaged }
func (wfpManaged) ScriptName(w WorkerRef) string { return ScriptName(w) }

// DefaultLabel is the managed default label under the installation's base domain (SPEC 3.4).
func (wfpManaged) DefaultLabel(w WorkerRef) string { return DerivedProviderResourceName("tsw", w) }

// HostMintedSubdomain answers false: this backend sells its base domain, so there is no
// script-named label to mint.
func (wfpManaged) HostMintedSubdomain(WorkerRef) (string, bool) { return "", false }
func (b wfpManaged) CanonicalOrigin(label string) string {
	return "https://" + label + "." + b.inst.BaseDomain
}
