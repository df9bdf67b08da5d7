// Package workerconf is a worker's plain configuration beside its code: variables (plain text and
// JSON), compatibility flags, service bindings to other workers and resource limits. Nothing in it is secret; secrets travel only sealed, in runtime
// inputs. The Host validates it, stores it with the worker's generation and hands it to the backend;
// the runtime node renders it as workerd bindings. It imports nothing of either.
package workerconf

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"
)

// Bounds on a worker's settings.
const (
	// MaxVars bounds vars and jsonVars together.
	MaxVars = 128
	// MaxVarBytes bounds one variable's value (5 KiB, as Cloudflare bounds an environment
	// variable), so that configuration stays configuration.
	MaxVarBytes = 5 << 10
	// MaxFlags bounds the compatibility flags.
	MaxFlags = 32
	// MaxServiceBindings bounds a worker's service bindings.
	MaxServiceBindings = 32
	// ReservedPrefix starts the binding names the product keeps for itself.
	ReservedPrefix = "TAKOFORM_"
)

var (
	bindingName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)
	flagName    = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)
	workerUID   = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
)

// Settings is the configuration. Empty maps and lists are nil after Normalize, so that a worker
// without settings stores, renders and digests exactly as before settings existed.
type Settings struct {
	// Vars are plain-text bindings: the worker reads env.NAME as a string.
	Vars map[string]string `json:"vars,omitempty"`
	// JSONVars are JSON bindings, each value a JSON text: the worker reads env.NAME parsed.
	JSONVars map[string]string `json:"jsonVars,omitempty"`
	// CompatibilityFlags turn the runtime's behaviour changes on or off beside the compatibility
	// date; sorted, without repeats.
	CompatibilityFlags []string `json:"compatibilityFlags,omitempty"`
	// ServiceBindings name other workers by UID: the worker reaches the callee's current Ready
	// incarnation through env.BINDING.fetch(). Same organization and installation only (the Host
	// checks that; the runtime node checks the organization again on every call).
	ServiceBindings map[string]string `json:"serviceBindings,omitempty"`
	// Limits are the worker's own bounds within its offering's ceilings; nil takes the offering's.
	Limits *Limits `json:"limits,omitempty"`
	// Crons are the worker's cron triggers, five-field expressions in UTC; sorted, without
	// repeats. The Host runs them (selfhost) or hands them to Cloudflare; a runtime node keeps
	// them but does nothing with them.
	Crons []string `json:"crons,omitempty"`
}

// Limits bound one worker. Zero is "the offering's ceiling".
type Limits struct {
	// CPUMs bounds a request: its wall time at a selfhost edge (504 past it), cpu_ms on Cloudflare.
	CPUMs int64 `json:"cpuMs,omitempty"`
	// MemoryMB is the memory ceiling of each of the worker's processes (MiB).
	MemoryMB int64 `json:"memoryMb,omitempty"`
}

// MinMemoryMB is the least memory (MiB) a worker's process is given: workerd cannot start in less.
const MinMemoryMB = 16

// Ceilings are what an offering allows a worker's Limits to reach.
type Ceilings struct {
	CPUMs    int64 `json:"cpuMs"`
	MemoryMB int64 `json:"memoryMb"`
	// FixedMemory: the offering takes exactly this memory (Cloudflare's 128 MB isolates), no other.
	FixedMemory bool `json:"fixedMemory,omitempty"`
}

// LimitError is a limit Check refuses.
type LimitError struct {
	// Field is the limit's name in the API ("cpuMs", "memoryMb"), "" for the limits as a whole.
	Field string
	// Detail says what is wrong with it, without its name.
	Detail string
}

func (e *LimitError) Error() string {
	if e.Field == "" {
		return "limits " + e.Detail
	}
	return "limits." + e.Field + " " + e.Detail
}

// Check reports limits beyond the ceilings (a *LimitError naming the API's field).
func (c Ceilings) Check(l *Limits) error {
	if l == nil {
		return nil
	}
	switch {
	case l.CPUMs < 0 || l.MemoryMB < 0:
		return &LimitError{Detail: "must be positive"}
	case l.MemoryMB != 0 && l.MemoryMB < MinMemoryMB:
		return &LimitError{"memoryMb", fmt.Sprintf("%d is below %d: workerd cannot start in it", l.MemoryMB, MinMemoryMB)}
	case l.CPUMs > c.CPUMs:
		return &LimitError{"cpuMs", fmt.Sprintf("%d is above this offering's ceiling of %d", l.CPUMs, c.CPUMs)}
	case c.FixedMemory && l.MemoryMB != 0 && l.MemoryMB != c.MemoryMB:
		return &LimitError{"memoryMb", fmt.Sprintf("must be %d on this offering (it runs every worker with %d MB)", c.MemoryMB, c.MemoryMB)}
	case l.MemoryMB > c.MemoryMB:
		return &LimitError{"memoryMb", fmt.Sprintf("%d is above this offering's ceiling of %d", l.MemoryMB, c.MemoryMB)}
	}
	return nil
}

// Normalize sorts the flags, drops repeats and turns empty collections into nil.
func (s Settings) Normalize() Settings {
	out := Settings{}
	if len(s.Vars) > 0 {
		out.Vars = maps.Clone(s.Vars)
	}
	if len(s.JSONVars) > 0 {
		out.JSONVars = maps.Clone(s.JSONVars)
	}
	if len(s.CompatibilityFlags) > 0 {
		out.CompatibilityFlags = slices.Compact(slices.Sorted(slices.Values(s.CompatibilityFlags)))
	}
	if len(s.ServiceBindings) > 0 {
		out.ServiceBindings = maps.Clone(s.ServiceBindings)
		for k, v := range out.ServiceBindings {
			out.ServiceBindings[k] = strings.ToLower(v)
		}
	}
	if s.Limits != nil && *s.Limits != (Limits{}) {
		l := *s.Limits
		out.Limits = &l
	}
	if len(s.Crons) > 0 {
		out.Crons = slices.Compact(slices.Sorted(slices.Values(s.Crons)))
	}
	return out
}

// Empty reports settings that change nothing.
func (s Settings) Empty() bool {
	return len(s.Vars) == 0 && len(s.JSONVars) == 0 && len(s.CompatibilityFlags) == 0 && len(s.ServiceBindings) == 0 && s.Limits == nil && len(s.Crons) == 0
}

// Equal compares two normalized settings.
func (s Settings) Equal(o Settings) bool {
	return maps.Equal(s.Vars, o.Vars) && maps.Equal(s.JSONVars, o.JSONVars) && slices.Equal(s.CompatibilityFlags, o.CompatibilityFlags) &&
		maps.Equal(s.ServiceBindings, o.ServiceBindings) && s.LimitsOrZero() == o.LimitsOrZero() && slices.Equal(s.Crons, o.Crons)
}

// LimitsOrZero is the limits, zero when none.
func (s Settings) LimitsOrZero() Limits {
	if s.Limits == nil {
		return Limits{}
	}
	return *s.Limits
}

// Validate checks the settings of a worker whose secret bindings are secretNames: names are binding
// names, unique across vars, JSON vars and secrets, none reserved; values are bounded, valid UTF-8,
// and JSON where they must be; flags look like flags. The errors name the API's fields.
func (s Settings) Validate(secretNames []string) error {
	if n := len(s.Vars) + len(s.JSONVars); n > MaxVars {
		return fmt.Errorf("vars and jsonVars hold %d variables; at most %d", n, MaxVars)
	}
	secret := map[string]bool{}
	for _, n := range secretNames {
		secret[n] = true
	}
	check := func(field string, vars map[string]string, isJSON bool) error {
		for _, name := range slices.Sorted(maps.Keys(vars)) {
			value := vars[name]
			switch {
			case !bindingName.MatchString(name):
				return fmt.Errorf("%s name %q must match %s", field, name, bindingName)
			case strings.HasPrefix(name, ReservedPrefix):
				return fmt.Errorf("%s name %q starts with %s, which Takoform keeps for its own bindings", field, name, ReservedPrefix)
			case secret[name]:
				return fmt.Errorf("%s name %q is also a required sensitive var; a binding is either a secret or a variable", field, name)
			case len(value) > MaxVarBytes:
				return fmt.Errorf("%s %s holds %d bytes; at most %d", field, name, len(value), MaxVarBytes)
			case !utf8.ValidString(value):
				return fmt.Errorf("%s %s is not valid UTF-8", field, name)
			case isJSON && !json.Valid([]byte(value)):
				return fmt.Errorf("%s %s is not a JSON text", field, name)
			}
		}
		return nil
	}
	if err := check("vars", s.Vars, false); err != nil {
		return err
	}
	if err := check("jsonVars", s.JSONVars, true); err != nil {
		return err
	}
	for name := range s.JSONVars {
		if _, ok := s.Vars[name]; ok {
			return fmt.Errorf("%q is in both vars and jsonVars", name)
		}
	}
	if err := checkCrons(s.Crons); err != nil {
		return err
	}
	if len(s.ServiceBindings) > MaxServiceBindings {
		return fmt.Errorf("serviceBindings holds %d bindings; at most %d", len(s.ServiceBindings), MaxServiceBindings)
	}
	for _, name := range slices.Sorted(maps.Keys(s.ServiceBindings)) {
		_, isVar := s.Vars[name]
		_, isJSON := s.JSONVars[name]
		switch {
		case !bindingName.MatchString(name):
			return fmt.Errorf("serviceBindings name %q must match %s", name, bindingName)
		case strings.HasPrefix(name, ReservedPrefix):
			return fmt.Errorf("serviceBindings name %q starts with %s, which Takoform keeps for its own bindings", name, ReservedPrefix)
		case secret[name]:
			return fmt.Errorf("serviceBindings name %q is also a required sensitive var; a binding is one thing", name)
		case isVar || isJSON:
			return fmt.Errorf("serviceBindings name %q is also a var; a binding is one thing", name)
		case !workerUID.MatchString(strings.ToLower(s.ServiceBindings[name])):
			return fmt.Errorf("serviceBindings %s must be a worker UID", name)
		}
	}
	if l := s.Limits; l != nil && (l.CPUMs < 0 || l.MemoryMB < 0) {
		return fmt.Errorf("limits must be positive")
	}
	if len(s.CompatibilityFlags) > MaxFlags {
		return fmt.Errorf("compatibilityFlags holds %d flags; at most %d", len(s.CompatibilityFlags), MaxFlags)
	}
	for _, f := range s.CompatibilityFlags {
		if !flagName.MatchString(f) {
			return fmt.Errorf("compatibility flag %q must match %s", f, flagName)
		}
	}
	return nil
}
