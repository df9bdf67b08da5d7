package orgproc

import (
	"maps"
	"slices"
	"time"
)

// Record is what a node keeps of an incarnation's implications across its own restarts (SPEC 5.1:
// implicated twice within an hour, whatever the node did in between): when it was implicated
// within the last IncidentWindow, and whether it runs alone for it.
type Record struct {
	Implications []time.Time `json:"implications,omitempty"`
	Quarantined  bool        `json:"quarantined,omitempty"`
}

func (r Record) empty() bool { return len(r.Implications) == 0 && !r.Quarantined }

// recent is the implications within IncidentWindow of now.
func recent(implications []time.Time, now time.Time) []time.Time {
	return slices.DeleteFunc(slices.Clone(implications), func(t time.Time) bool { return now.Sub(t) >= IncidentWindow })
}

// record is the incarnation's Record now.
func (i *Incarnation) record(now time.Time) Record {
	i.mu.Lock()
	defer i.mu.Unlock()
	return Record{Implications: recent(i.implications, now), Quarantined: i.quarantined || i.blocked}
}

// remembered is what an earlier run of the node kept of the incarnation of id, within an
// IncidentWindow of this run's beginning (every incarnation the node still has starts within
// moments of it; one started later is another deployment of the same content, which starts
// afresh). m.mu held.
func (m *Manager) rememberedLocked(id string) (Record, bool) {
	r, ok := m.earlier[id]
	if !ok || time.Since(m.began) >= IncidentWindow {
		return Record{}, false
	}
	r.Implications = recent(r.Implications, time.Now())
	return r, true
}

// resumeLocked gives inc, just placed, what was kept of it: its implications, and its quarantine
// (it was placed alone, or, when its organization had no quarantine process left, waits for one,
// answering 503). m.mu held.
func (m *Manager) resumeLocked(inc *Incarnation, r Record, alone bool) {
	delete(m.earlier, inc.spec.ID)
	blocked := r.Quarantined && !alone && !inc.spec.Alone
	if blocked {
		m.blocked[inc] = true
	}
	inc.mu.Lock()
	inc.implications = r.Implications
	inc.quarantined = alone && !inc.spec.Alone
	inc.blocked = blocked
	inc.mu.Unlock()
	inc.refresh()
}

// record gives Options.Recorded the records of every incarnation the manager holds, and those an
// earlier run kept of incarnations not started again yet (for an IncidentWindow after this run
// began: every incarnation the node still has starts within moments of it).
func (m *Manager) record() {
	if m.opts.Recorded == nil {
		return
	}
	m.recordMu.Lock()
	defer m.recordMu.Unlock()
	now := time.Now()
	out := map[string]Record{}
	m.mu.Lock()
	if now.Sub(m.began) < IncidentWindow {
		for id, r := range m.earlier {
			if r.Implications = recent(r.Implications, now); !r.empty() {
				out[id] = r
			}
		}
	}
	procs := slices.Collect(maps.Keys(m.all))
	blocked := slices.Collect(maps.Keys(m.blocked))
	m.mu.Unlock()
	incs := blocked
	for _, p := range procs {
		p.mu.Lock()
		for inc := range p.live {
			incs = append(incs, inc)
		}
		p.mu.Unlock()
	}
	for _, inc := range incs {
		if r := inc.record(now); !r.empty() && !inc.retired.Load() {
			out[inc.spec.ID] = r
		}
	}
	m.opts.Recorded(out)
}
