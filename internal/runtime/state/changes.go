package state

import (
	"maps"
	"reflect"
	"time"
)

// A desired state changes by derivation: Derive copies a state sharing its maps, and the setters
// below give the copy its own map on their first write to it, so that the state it came from is
// never changed (what the runtime holds stays what the disk holds until a save succeeds). The
// setters also name every entry they write, so that the save that follows appends those entries
// alone instead of comparing two states of thousands of scripts whole (SPEC 5.1 density: a
// node's saves cost what they change, not what it holds).

// changes names the entries one derivation wrote, map by map, and the save its state came from.
type changes struct {
	// base is the number of the save that wrote the state this one was derived from, 0 when that
	// state was not saved as it is (then the save compares the states whole); from is that
	// state's maps, so that a copy of a saved state whose maps were replaced is not taken for it.
	base                                               uint64
	from                                               mapSet
	scripts, routes, effects, floors, refused, orgUIDs map[string]struct{}
}

// mapSet is which maps a state holds.
type mapSet [6]uintptr

func mapsOf(d *Desired) mapSet {
	return mapSet{
		reflect.ValueOf(d.Scripts).Pointer(), reflect.ValueOf(d.Routes).Pointer(), reflect.ValueOf(d.Effects).Pointer(),
		reflect.ValueOf(d.Floors).Pointer(), reflect.ValueOf(d.Refused).Pointer(), reflect.ValueOf(d.OrgUIDs).Pointer(),
	}
}

// Derive is a copy of d to change through its setters.
func (d *Desired) Derive() Desired {
	next := *d
	next.changes = &changes{}
	if d.changes == nil && d.saved != 0 {
		next.changes.base, next.changes.from = d.saved, mapsOf(d)
	}
	next.saved = 0
	return next
}

// derivedFrom reports whether d is a derivation of prev, the state save number n wrote.
func (d *Desired) derivedFrom(prev *Desired, n uint64) bool {
	return d.changes != nil && d.changes.base != 0 && d.changes.base == n && d.changes.from == mapsOf(prev)
}

// written is d's record of what it changed; a state not derived gets one on its first write,
// with no base.
func (d *Desired) written() *changes {
	if d.changes == nil {
		d.changes = &changes{}
		d.saved = 0
	}
	return d.changes
}

// SetScript puts sc under its name.
func (d *Desired) SetScript(sc *Script) { set(&d.Scripts, &d.written().scripts, sc.Name, sc) }

// DeleteScript removes the script of that name.
func (d *Desired) DeleteScript(name string) { remove(&d.Scripts, &d.written().scripts, name) }

// SetRoute puts r under its hostname.
func (d *Desired) SetRoute(r *Route) { set(&d.Routes, &d.written().routes, r.Hostname, r) }

// DeleteRoute removes the route of that hostname.
func (d *Desired) DeleteRoute(hostname string) { remove(&d.Routes, &d.written().routes, hostname) }

// SetEffect remembers an applied effect id.
func (d *Desired) SetEffect(id string, e EffectEntry) { set(&d.Effects, &d.written().effects, id, e) }

// DeleteEffect forgets an effect id.
func (d *Desired) DeleteEffect(id string) { remove(&d.Effects, &d.written().effects, id) }

// SetFloor keeps a script name's floor generation.
func (d *Desired) SetFloor(name string, generation int64) {
	set(&d.Floors, &d.written().floors, name, generation)
}

// SetRefused keeps a delivery a readback concluded absent, with when.
func (d *Desired) SetRefused(deliveryID string, at time.Time) {
	set(&d.Refused, &d.written().refused, deliveryID, at)
}

// DeleteRefused forgets a refused delivery.
func (d *Desired) DeleteRefused(deliveryID string) {
	remove(&d.Refused, &d.written().refused, deliveryID)
}

// SetOrgUID keeps an organization's sandbox uid.
func (d *Desired) SetOrgUID(organization string, uid int) {
	set(&d.OrgUIDs, &d.written().orgUIDs, organization, uid)
}

func set[V any](m *map[string]V, written *map[string]struct{}, key string, v V) {
	own(m, written)
	(*m)[key] = v
	(*written)[key] = struct{}{}
}

func remove[V any](m *map[string]V, written *map[string]struct{}, key string) {
	if _, ok := (*m)[key]; !ok {
		return
	}
	own(m, written)
	delete(*m, key)
	(*written)[key] = struct{}{}
}

// own gives the derivation its own copy of *m on its first write to it.
func own[V any](m *map[string]V, written *map[string]struct{}) {
	if *written != nil {
		return
	}
	*written = map[string]struct{}{}
	*m = maps.Clone(*m)
	if *m == nil {
		*m = map[string]V{}
	}
}

// entriesChanged is what changed from before to after: among the keys written when the save knows
// them (whole false), or among every key of either.
func entriesChanged[V any](before, after map[string]V, written map[string]struct{}, whole bool, same func(a, b V) bool) map[string]*V {
	if whole {
		return diffMap(before, after, same)
	}
	var out map[string]*V
	for k := range written {
		v, now := after[k]
		old, was := before[k]
		switch {
		case now && (!was || !same(old, v)):
			if out == nil {
				out = map[string]*V{}
			}
			out[k] = &v
		case !now && was:
			if out == nil {
				out = map[string]*V{}
			}
			out[k] = nil
		}
	}
	return out
}
