package desired

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
)

// A save of a state Apply derived appends only the entries its operation wrote (state's
// changes.go), not a comparison of the whole state. This drives random operations of every kind
// over a few names, so that they collide (puts, deletes, replays, refusals, routes, deliveries,
// refusals of deliveries, admissions, brakes, sandbox uids, effects past MaxEffects' tenth), saves
// each state the way the runtime does, and after each batch opens the directory again: what the
// disk gives back must be what memory holds. An entry an operation writes without naming it is
// lost on that reopen.
func TestEverySavedDerivationIsReadBackWhole(t *testing.T) {
	t.Parallel()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 7))
	dir := filepath.Join(t.TempDir(), "runtime")
	key := filepath.Join(t.TempDir(), "runtime-sealing-key")
	require.NoError(t, state.WriteSealingKeyFile(key))
	open := func() (*state.Store, state.Desired) {
		s, err := state.Open(dir, state.SealingKey{File: key})
		require.NoError(t, err)
		d, err := s.Load()
		require.NoError(t, err)
		return s, *d
	}
	store, cur := open()
	names := []string{"a", "b", "c", "d"}
	hosts := []string{"a.example", "b.example", "c.example"}
	at := now
	effect := 0
	nextEffect := func() Effect {
		effect++
		at = at.Add(time.Second)
		id := fmt.Sprintf("e-%06d", effect)
		if effect > 3 && rng.IntN(8) == 0 { // a replay, or the same id with another request
			id = fmt.Sprintf("e-%06d", effect-1-rng.IntN(3))
		}
		return Effect{ID: id, RequestMAC: "mac-" + id, At: at}
	}
	gen := int64(0)
	op := func() Op {
		name := names[rng.IntN(len(names))]
		host := hosts[rng.IntN(len(hosts))]
		uid := "uid-" + name
		if rng.IntN(3) == 0 {
			uid += "-2"
		}
		switch rng.IntN(11) {
		case 0, 1:
			gen++
			return PutScript{Effect: nextEffect(), Script: state.Script{
				Name: name, WorkerUID: uid, DeploymentID: fmt.Sprintf("dep-%d", gen), Generation: gen,
				Labels:  adminapi.Labels{Organization: "org-" + name, Space: "prod", Worker: name},
				Modules: state.NewCode(map[string]string{"index.js": fmt.Sprintf("v%d", gen%3)}), MainModule: "index.js",
				CompatibilityDate: "2025-01-01",
			}}
		case 2:
			return DeleteScript{Name: name, WorkerUID: uid}
		case 3:
			return PutRoute{Effect: nextEffect(), Route: state.Route{Hostname: host, ScriptName: name, EndpointUID: "ep-" + name, DeploymentID: "dep"}}
		case 4:
			return DeleteRoute{Hostname: host, ScriptName: name, EndpointUID: "ep-" + name}
		case 5:
			return PutSecrets{Effect: nextEffect(), Name: name, Delivery: state.Delivery{DeliveryID: fmt.Sprintf("d-%d", rng.IntN(6)), WorkerUID: uid, Names: []string{}, ValuesMAC: "m"}}
		case 6:
			return DeleteSecrets{Name: name, WorkerUID: uid}
		case 7:
			at = at.Add(time.Duration(rng.IntN(30)) * time.Hour) // refusals past RefusedFor are forgotten
			return ConcludeAbsent{Name: name, DeliveryID: fmt.Sprintf("d-%d", rng.IntN(6)), At: at}
		case 8:
			if sc := cur.Scripts[name]; sc != nil {
				return Admit{Name: name, Incarnation: fmt.Sprintf("inc-%d", sc.Generation)}
			}
			return Admit{Name: name, Incarnation: "inc-none"}
		case 9:
			return SetBrake{Scope: adminapi.BrakeScope{Organization: "org-" + name}, Engaged: rng.IntN(2) == 0}
		default:
			return AssignOrgUID{Organization: "org-" + name, UID: 20000 + rng.IntN(6)}
		}
	}
	for batch := range 12 {
		steps := 40
		if batch == 5 {
			// Past the bound once: a state not derived (saved whole) brings the effects near it,
			// and the derivations after it pass it, so that a tenth of them go in one save.
			primed := cur
			primed.Effects = maps.Clone(cur.Effects)
			for len(primed.Effects) < MaxEffects-5 {
				e := nextEffect()
				primed.Effects[fmt.Sprintf("e-%06d", effect)] = state.EffectEntry{Target: "route:bulk.example", RequestMAC: "mac-" + e.ID, At: e.At}
			}
			require.NoError(t, store.Save(&primed))
			cur = primed
			steps = 100
		}
		for range steps {
			next, a := Apply(cur, op())
			if !a.Changed {
				continue
			}
			require.NoError(t, store.Save(&next))
			cur = next
		}
		store.Close()
		var back state.Desired
		store, back = open()
		require.Equal(t, onDisk(t, cur), onDisk(t, back), "batch %d: what the disk gives back is what memory held", batch)
		cur = back
	}
	store.Close()
}

// onDisk is what of a desired state is kept, as JSON (modules by the name of their bundle).
func onDisk(t *testing.T, d state.Desired) string {
	t.Helper()
	type script struct {
		*state.Script
		Code, Serves string
	}
	scripts := map[string]script{}
	for name, sc := range d.Scripts {
		s := script{Script: sc, Code: sc.Modules.Ref()}
		if sc.Serving != nil {
			s.Serves = sc.Serving.Modules.Ref()
		}
		scripts[name] = s
	}
	b, err := json.MarshalIndent(map[string]any{
		"scripts": scripts, "routes": d.Routes, "brakes": d.Brakes, "effects": d.Effects,
		"floors": d.Floors, "refused": d.Refused, "orgUids": d.OrgUIDs,
	}, "", " ")
	require.NoError(t, err)
	return string(b)
}

// BenchmarkPutRouteOnANodeOf measures one route put, applied and saved, on a node holding n
// scripts and as many remembered effects: a save appends what the put wrote, so its cost should
// hardly grow with n; what does grow is the copy of each map the put writes (copy on write).
func BenchmarkPutRouteOnANodeOf(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("scripts=%d", n), func(b *testing.B) {
			dir := filepath.Join(b.TempDir(), "runtime")
			key := filepath.Join(b.TempDir(), "runtime-sealing-key")
			require.NoError(b, state.WriteSealingKeyFile(key))
			store, err := state.Open(dir, state.SealingKey{File: key})
			require.NoError(b, err)
			defer store.Close()
			d, err := store.Load()
			require.NoError(b, err)
			cur := *d
			code := state.NewCode(map[string]string{"index.js": "x"})
			for i := range n {
				name := fmt.Sprintf("s%05d", i)
				cur.Scripts[name] = &state.Script{Name: name, WorkerUID: "uid-" + name, DeploymentID: "dep", Generation: 1, Modules: code, MainModule: "index.js"}
				cur.Effects[fmt.Sprintf("e-%06d", i)] = state.EffectEntry{Target: "script:" + name, RequestMAC: "m", At: now}
			}
			require.NoError(b, store.Save(&cur))
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				i++
				host := fmt.Sprintf("h%d.example", i%n)
				next, a := Apply(cur, PutRoute{Effect: Effect{ID: fmt.Sprintf("r-%09d", i), RequestMAC: "m", At: now.Add(time.Duration(i) * time.Second)},
					Route: state.Route{Hostname: host, ScriptName: fmt.Sprintf("s%05d", i%n), EndpointUID: "ep-" + host}})
				if !a.Changed {
					b.Fatal("unchanged")
				}
				if err := store.Save(&next); err != nil {
					b.Fatal(err)
				}
				cur = next
			}
		})
	}
}
