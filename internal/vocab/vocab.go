// Package vocab is the project's one vocabulary of shapes: the patterns of SPEC 1 for names,
// ids, DNS labels, hostnames, binding names and dates, written once for the Host, the provider
// and the runtime node, with the one Secret type they all carry values in. It is a leaf: it
// imports only the standard library, so the runtime node may use it without importing the Host.
//
// The OpenAPI document and the migrations' CHECK constraints spell the same patterns in their
// own languages; vocab's tests hold them to these.
package vocab

import "regexp"

// The patterns, as text (for documents and messages) and compiled.
const (
	// NamePattern is an organization's, a space's or a resource's name, and a runtime node's
	// script name.
	NamePattern = `^[a-z0-9][a-z0-9_-]{0,62}$`
	// ReservationIDPattern is a caller-chosen origin reservation id (a minted one is
	// "hostmint-" and 40 hex digits).
	ReservationIDPattern = `^[a-z0-9][a-z0-9-]{2,62}$`
	// LabelPattern is one lowercase DNS label: a subdomain.
	LabelPattern = `^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`
	// HostnamePattern is lowercase DNS labels joined by dots.
	HostnamePattern = `^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`
	// CustomDomainPattern is a custom domain claim's hostname: a hostname of at least two labels,
	// or "*." and one (a wildcard; SPEC 3.7).
	CustomDomainPattern = `^(\*\.)?[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)+$`
	// BindingNamePattern is a worker binding's name (a JavaScript identifier of ASCII letters,
	// digits and underscores).
	BindingNamePattern = `^[A-Za-z_][A-Za-z0-9_]*$`
	// OperationIDPattern is a runtime input's operation id, and a worker UID as the runtime node
	// names files by it.
	OperationIDPattern = `^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`
	// UUIDPattern is a lowercase UUID: a resource UID.
	UUIDPattern = `^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`
	// DatePattern is a compatibility date, YYYY-MM-DD.
	DatePattern = `^[0-9]{4}-[0-9]{2}-[0-9]{2}$`
)

// The patterns compiled. Never reassign them.
var (
	Name          = regexp.MustCompile(NamePattern)
	ReservationID = regexp.MustCompile(ReservationIDPattern)
	Label         = regexp.MustCompile(LabelPattern)
	BindingName   = regexp.MustCompile(BindingNamePattern)
	OperationID   = regexp.MustCompile(OperationIDPattern)
	UUID          = regexp.MustCompile(UUIDPattern)
	Date          = regexp.MustCompile(DatePattern)
	CustomDomain  = regexp.MustCompile(CustomDomainPattern)

	hostname = regexp.MustCompile(HostnamePattern)
)

// IsHostname reports whether s matches HostnamePattern and fits DNS's 253 characters.
func IsHostname(s string) bool { return len(s) <= 253 && hostname.MatchString(s) }
