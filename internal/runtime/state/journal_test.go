package state

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// change is one save's worth of changes, made the way the runtime makes them: on a copy.
func change(d *Desired, edit func(*Desired)) *Desired {
	next := *d
	next.Scripts, next.Routes, next.Effects = clone(d.Scripts), clone(d.Routes), clone(d.Effects)
	next.Floors, next.Refused, next.OrgUIDs = clone(d.Floors), clone(d.Refused), clone(d.OrgUIDs)
	edit(&next)
	return &next
}

func clone[V any](m map[string]V) map[string]V {
	out := make(map[string]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func fileID(t *testing.T, path string) os.FileInfo {
	t.Helper()
	info, err := os.Stat(path)
	require.NoError(t, err)
	return info
}

func journals(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		if journalName.MatchString(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out
}

// Saves after the first append one line each to the journal instead of rewriting desired.json,
// and a node started again on the directory reads back every change of every kind, removals
// included.
func TestEverySaveAfterTheFirstIsAJournalLineAndAllOfThemAreReadBack(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "runtime")
	s := openStore(t, dir)
	d, err := s.Load()
	require.NoError(t, err)
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	d = change(d, func(d *Desired) {
		d.Scripts["a"] = &Script{Name: "a", Generation: 1, Modules: NewCode(map[string]string{"a.js": "a1"}), MainModule: "a.js"}
		d.Scripts["b"] = &Script{Name: "b", Generation: 1, Modules: NewCode(map[string]string{"b.js": "b1"}), MainModule: "b.js"}
		d.Routes["a.example"] = &Route{Hostname: "a.example", ScriptName: "a"}
		d.Effects["e1"] = EffectEntry{Target: "a", RequestMAC: "m1", At: at}
	})
	require.NoError(t, s.Save(d))
	snapshot := fileID(t, filepath.Join(dir, desiredFile))

	steps := []func(*Desired){
		func(d *Desired) {
			a := *d.Scripts["a"]
			a.Generation, a.Modules = 2, NewCode(map[string]string{"a.js": "a2"})
			d.Scripts["a"] = &a
			d.Effects["e2"] = EffectEntry{Target: "a", RequestMAC: "m2", At: at.Add(time.Second)}
		},
		func(d *Desired) {
			delete(d.Scripts, "b")
			d.Floors["b"] = 1
			d.Routes["b.example"] = &Route{Hostname: "b.example", ScriptName: "a"}
			delete(d.Routes, "a.example")
			delete(d.Effects, "e1")
		},
		func(d *Desired) {
			d.Refused["delivery-1"] = at
			d.OrgUIDs["org-a"] = 200001
			d.Brakes = []adminapi.BrakeScope{{Organization: "org-a"}}
		},
		func(d *Desired) { d.Brakes = nil },
	}
	for _, step := range steps {
		d = change(d, step)
		require.NoError(t, s.Save(d))
	}
	require.True(t, os.SameFile(snapshot, fileID(t, filepath.Join(dir, desiredFile))), "desired.json was written again")
	require.Len(t, journals(t, dir), 1)

	s.Close()
	reopened := openStore(t, dir)
	back, err := reopened.Load()
	require.NoError(t, err)
	require.Equal(t, map[string]string{"a.js": "a2"}, modulesOf(t, reopened, back.Scripts["a"].Modules))
	require.Equal(t, int64(2), back.Scripts["a"].Generation)
	require.NotContains(t, back.Scripts, "b")
	require.Equal(t, map[string]int64{"b": 1}, back.Floors)
	require.Equal(t, []string{"b.example"}, keys(back.Routes))
	require.Equal(t, []string{"e2"}, keys(back.Effects))
	require.True(t, back.Refused["delivery-1"].Equal(at))
	require.Equal(t, map[string]int{"org-a": 200001}, back.OrgUIDs)
	require.Empty(t, back.Brakes)
	require.Len(t, bundleNames(t, dir), 1, "the replaced and the removed script's bundles are gone")
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A crash in the middle of a save leaves its line cut short: that save never returned, and its
// change is not read back. A line before the last that does not read is damage, refused.
func TestAJournalLineCutShortIsDroppedAndADamagedOneRefused(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "runtime")
	s := openStore(t, dir)
	d, err := s.Load()
	require.NoError(t, err)
	d = change(d, func(d *Desired) { d.Floors["kept"] = 1 })
	require.NoError(t, s.Save(d)) // snapshot
	d = change(d, func(d *Desired) { d.Floors["journaled"] = 2 })
	require.NoError(t, s.Save(d))
	s.Close()
	path := filepath.Join(dir, journals(t, dir)[0])
	whole, err := os.ReadFile(path)
	require.NoError(t, err)

	torn := append(append([]byte{}, whole...), []byte(`{"floors":{"lost":3}}`)...) // no newline
	require.NoError(t, os.WriteFile(path, torn, 0o600))
	s = openStore(t, dir)
	back, err := s.Load()
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"kept": 1, "journaled": 2}, back.Floors)
	s.Close()

	damaged := append([]byte(`{"floors":{"x":`+"\n"), whole...)
	require.NoError(t, os.WriteFile(path, damaged, 0o600))
	_, err = openStore(t, dir).Load()
	require.ErrorContains(t, err, "is damaged at line 1")
}

// Once the journal outgrows twice the snapshot, a save writes a new snapshot naming a new
// journal and removes the old one; a journal no snapshot names (a crash's leftover) goes too,
// also one that has the name the next snapshot is about to give.
func TestAGrownJournalBecomesASnapshotAndLeftoversGo(t *testing.T) {
	old := minCompactBytes
	minCompactBytes = 256
	t.Cleanup(func() { minCompactBytes = old })
	dir := filepath.Join(t.TempDir(), "runtime")
	s := openStore(t, dir)
	d, err := s.Load()
	require.NoError(t, err)
	require.NoError(t, s.Save(d))
	require.Empty(t, journals(t, dir), "no journal before a save appends")
	// Leftovers: a journal of an earlier snapshot, and one of the name the next snapshot gives.
	require.NoError(t, os.WriteFile(filepath.Join(dir, journalFile(0)), []byte("{}\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, journalFile(2)), []byte(`{"floors":{"stale":9}}`+"\n"), 0o600))

	for i := range 20 {
		d = change(d, func(d *Desired) { d.Floors[string(rune('a'+i))] = int64(i) })
		require.NoError(t, s.Save(d))
	}
	require.Equal(t, []string{journalFile(s.journal.gen)}, journals(t, dir))
	require.GreaterOrEqual(t, s.journal.gen, int64(2), "the journal grew into a snapshot")
	s.Close()
	back, err := openStore(t, dir).Load()
	require.NoError(t, err)
	require.Len(t, back.Floors, 20)
	require.NotContains(t, back.Floors, "stale")
}

// A save appends only what a derivation wrote when the state it came from is the last one saved,
// maps and all: a copy of a saved state whose map was replaced before it was derived is compared
// whole, so the replaced map's entries are kept too.
func TestADerivationOfAnAlteredCopyIsNotTakenForOneOfTheSavedState(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "runtime")
	s := openStore(t, dir)
	d, err := s.Load()
	require.NoError(t, err)
	first := d.Derive()
	first.SetRoute(&Route{Hostname: "a.example", ScriptName: "a"})
	require.NoError(t, s.Save(&first))
	second := first.Derive()
	second.SetRoute(&Route{Hostname: "b.example", ScriptName: "b"})
	require.NoError(t, s.Save(&second)) // a journal line

	altered := second
	altered.Routes = map[string]*Route{"c.example": {Hostname: "c.example", ScriptName: "c"}}
	third := altered.Derive()
	third.SetFloor("a", 3)
	require.NoError(t, s.Save(&third))
	s.Close()

	back, err := openStore(t, dir).Load()
	require.NoError(t, err)
	require.Equal(t, map[string]*Route{"c.example": {Hostname: "c.example", ScriptName: "c"}}, back.Routes)
	require.Equal(t, map[string]int64{"a": 3}, back.Floors)
}
