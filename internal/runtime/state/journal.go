package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
)

// The desired state is desired.json (a snapshot) and the journal it names: one line of JSON per
// save after it, holding only what that save changed. A node of thousands of scripts changes one
// at a time, and rewriting all of them on every change made creating workers slower the more a
// node held (10 a second at 3,000). The first save after a start, and any save once the journal
// has grown past twice the snapshot, writes a new snapshot naming a new, empty journal instead.
//
// Crashes: a line is whole and synced before its save returns; a last line without its newline
// is a save that never returned, and is dropped; any other line that does not read is damage,
// refused. A journal no snapshot names is a leftover, removed.

// journalRecord is one save's changes. A map names each entry that changed with its new value,
// or null for one removed; Brakes, when present, is all of them.
type journalRecord struct {
	Scripts map[string]json.RawMessage `json:"scripts,omitempty"`
	Routes  map[string]*Route          `json:"routes,omitempty"`
	Brakes  *[]adminapi.BrakeScope     `json:"brakes,omitempty"`
	Effects map[string]*EffectEntry    `json:"effects,omitempty"`
	Floors  map[string]*int64          `json:"floors,omitempty"`
	Refused map[string]*time.Time      `json:"refused,omitempty"`
	OrgUIDs map[string]*int            `json:"orgUids,omitempty"`
}

func (r *journalRecord) empty() bool {
	return len(r.Scripts) == 0 && len(r.Routes) == 0 && r.Brakes == nil && len(r.Effects) == 0 &&
		len(r.Floors) == 0 && len(r.Refused) == 0 && len(r.OrgUIDs) == 0
}

// journal is the file saves append to.
type journal struct {
	gen  int64
	file *os.File // nil until the first append
	size int64
	// snapshot is the size of the desired.json that names it; broken marks a journal whose last
	// append failed, so that the next save writes a snapshot instead.
	snapshot int64
	broken   bool
}

var journalName = regexp.MustCompile(`^desired\.([0-9]{1,18})\.journal$`)

func journalFile(gen int64) string { return fmt.Sprintf("desired.%d.journal", gen) }

// minCompactBytes is the journal size below which no snapshot is written for its sake.
var minCompactBytes int64 = 1 << 20

func (j *journal) due() bool {
	return j.broken || j.size > max(minCompactBytes, 2*j.snapshot)
}

// diffMap is what changed from before to after: each entry added or changed, and nil for each
// removed.
func diffMap[V any](before, after map[string]V, same func(a, b V) bool) map[string]*V {
	var out map[string]*V
	set := func(k string, v *V) {
		if out == nil {
			out = map[string]*V{}
		}
		out[k] = v
	}
	for k, v := range after {
		if old, ok := before[k]; !ok || !same(old, v) {
			set(k, &v)
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			set(k, nil)
		}
	}
	return out
}

func equal[V comparable](a, b V) bool { return a == b }

// saved is what a save keeps of d to compare the next one with: its maps copied, so that a
// caller writing into a map it passed (the runtime copies on write; a test may not) cannot change
// what the last save wrote. The scripts and routes they point to are never changed in place.
func saved(d *Desired) *Desired {
	c := *d
	c.Scripts, c.Routes, c.Effects = maps.Clone(d.Scripts), maps.Clone(d.Routes), maps.Clone(d.Effects)
	c.Floors, c.Refused, c.OrgUIDs = maps.Clone(d.Floors), maps.Clone(d.Refused), maps.Clone(d.OrgUIDs)
	c.Brakes = slices.Clone(d.Brakes)
	return &c
}

// record is what changed from the last save (prev) to d, among the entries written (or every
// entry, when whole): the scripts changed (nil for removed), with the files of those not removed.
func record(prev, d *Desired, written *changes, whole bool, changed map[string]**Script, files map[string]*scriptFile) *journalRecord {
	r := &journalRecord{
		Effects: entriesChanged(prev.Effects, d.Effects, written.effects, whole, equal[EffectEntry]),
		Floors:  entriesChanged(prev.Floors, d.Floors, written.floors, whole, equal[int64]),
		Refused: entriesChanged(prev.Refused, d.Refused, written.refused, whole, func(a, b time.Time) bool { return a.Equal(b) }),
		OrgUIDs: entriesChanged(prev.OrgUIDs, d.OrgUIDs, written.orgUIDs, whole, equal[int]),
	}
	for host, v := range entriesChanged(prev.Routes, d.Routes, written.routes, whole, func(a, b *Route) bool { return a == b || *a == *b }) {
		if r.Routes == nil {
			r.Routes = map[string]*Route{}
		}
		r.Routes[host] = nil
		if v != nil {
			r.Routes[host] = *v
		}
	}
	for name, v := range changed {
		if r.Scripts == nil {
			r.Scripts = map[string]json.RawMessage{}
		}
		if v == nil {
			r.Scripts[name] = json.RawMessage("null")
		} else {
			r.Scripts[name] = files[name].raw
		}
	}
	if !slices.Equal(prev.Brakes, d.Brakes) {
		brakes := slices.Clone(d.Brakes)
		if brakes == nil {
			brakes = []adminapi.BrakeScope{}
		}
		r.Brakes = &brakes
	}
	return r
}

// appendRecord writes r as the journal's next line and syncs it. A failed append is cut off
// again where it can be, and the journal is marked broken: the next save writes a snapshot.
func (s *Store) appendRecord(r *journalRecord) error {
	line, err := json.Marshal(r)
	if err != nil {
		return err
	}
	line = append(line, '\n')
	j := s.journal
	if j.file == nil {
		path := filepath.Join(s.dir, journalFile(j.gen))
		if err := safedir.Check(s.dir, s.owner); err != nil {
			return err
		}
		file, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|os.O_EXCL, safedir.FileMode)
		if err != nil {
			j.broken = true
			return fmt.Errorf("create the journal: %w", err)
		}
		if owner := s.owner; owner != safedir.Current() {
			if err := file.Chown(owner.UID, owner.GID); err != nil {
				file.Close()
				j.broken = true
				return fmt.Errorf("create the journal: %w", err)
			}
		}
		// Its name in the directory is as durable as what it will hold.
		if err := syncDir(s.dir); err != nil {
			file.Close()
			j.broken = true
			return fmt.Errorf("create the journal: %w", err)
		}
		j.file = file
	}
	if _, err := j.file.Write(line); err != nil {
		_ = j.file.Truncate(j.size)
		j.broken = true
		return fmt.Errorf("append to the journal: %w", err)
	}
	if err := j.file.Sync(); err != nil {
		_ = j.file.Truncate(j.size)
		j.broken = true
		return fmt.Errorf("sync the journal: %w", err)
	}
	j.size += int64(len(line))
	return nil
}

// writeSnapshot writes desired.json from f, naming a new, empty journal, and removes the journals
// before it.
func (s *Store) writeSnapshot(f *desiredToDisk) error {
	gen := int64(1)
	if s.journal != nil {
		gen = s.journal.gen + 1
	}
	// A file of the new journal's name is a leftover no durable snapshot named (a snapshot that
	// named it was never written, or it would be the current one): it goes before one does.
	if err := s.removeJournal(journalFile(gen)); err != nil {
		return err
	}
	f.Journal = journalFile(gen)
	b, err := f.marshal()
	if err != nil {
		return err
	}
	if err := safedir.WriteFile(s.dir, desiredFile, b, s.owner); err != nil {
		return err
	}
	if err := syncDir(s.dir); err != nil {
		return err
	}
	if s.journal != nil && s.journal.file != nil {
		s.journal.file.Close()
	}
	s.journal = &journal{gen: gen, snapshot: int64(len(b))}
	// The journals before it hold nothing the snapshot does not. One that cannot be removed now
	// is removed by a later snapshot (no snapshot names it again).
	_ = s.removeJournals(gen)
	return nil
}

// removeJournal removes the journal file name if it is there (the node's own files only).
func (s *Store) removeJournal(name string) error {
	path := filepath.Join(s.dir, name)
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := safedir.CheckFile(path, s.owner); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// removeJournals removes every journal of the node's but generation keep's.
func (s *Store) removeJournals(keep int64) error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		m := journalName.FindStringSubmatch(e.Name())
		if m == nil || m[1] == strconv.FormatInt(keep, 10) || !s.ownFile(s.dir, e) {
			continue
		}
		if err := os.Remove(filepath.Join(s.dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// replay applies the journal f names to f, and returns its generation (0: f names none).
func (s *Store) replay(f *desiredOnDisk) (int64, error) {
	if f.Journal == "" {
		return 0, nil
	}
	m := journalName.FindStringSubmatch(f.Journal)
	if m == nil {
		return 0, fmt.Errorf("%s names a journal %q, which is not a journal's name", filepath.Join(s.dir, desiredFile), f.Journal)
	}
	gen, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return 0, err
	}
	b, err := safedir.ReadFile(s.dir, f.Journal, s.owner)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return gen, nil // no save since the snapshot
	case err != nil:
		return 0, err
	}
	for n := 1; len(b) > 0; n++ {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break // the last save's line, cut short: that save never returned
		}
		var r journalRecord
		if err := json.Unmarshal(b[:i], &r); err != nil {
			return 0, fmt.Errorf("the journal %s is damaged at line %d: %w", filepath.Join(s.dir, f.Journal), n, err)
		}
		if err := r.applyTo(f); err != nil {
			return 0, fmt.Errorf("the journal %s, line %d: %w", filepath.Join(s.dir, f.Journal), n, err)
		}
		b = b[i+1:]
	}
	return gen, nil
}

func (r *journalRecord) applyTo(f *desiredOnDisk) error {
	if f.Scripts == nil {
		f.Scripts = map[string]*scriptOnDisk{}
	}
	for name, raw := range r.Scripts {
		if string(raw) == "null" {
			delete(f.Scripts, name)
			continue
		}
		var sc scriptOnDisk
		if err := json.Unmarshal(raw, &sc); err != nil {
			return fmt.Errorf("script %s: %w", name, err)
		}
		f.Scripts[name] = &sc
	}
	f.Routes = applyMap(f.Routes, r.Routes, func(v *Route) *Route { return v })
	f.Effects = applyMap(f.Effects, r.Effects, func(v *EffectEntry) EffectEntry { return *v })
	f.Floors = applyMap(f.Floors, r.Floors, func(v *int64) int64 { return *v })
	f.Refused = applyMap(f.Refused, r.Refused, func(v *time.Time) time.Time { return *v })
	f.OrgUIDs = applyMap(f.OrgUIDs, r.OrgUIDs, func(v *int) int { return *v })
	if r.Brakes != nil {
		f.Brakes = *r.Brakes
	}
	return nil
}

// applyMap sets each entry of changes in m (made when nil), or removes it where changes holds nil.
func applyMap[V, P any](m map[string]V, changes map[string]*P, value func(*P) V) map[string]V {
	if len(changes) == 0 {
		return m
	}
	if m == nil {
		m = make(map[string]V, len(changes))
	}
	for _, k := range slices.Sorted(maps.Keys(changes)) {
		if changes[k] == nil {
			delete(m, k)
		} else {
			m[k] = value(changes[k])
		}
	}
	return m
}
