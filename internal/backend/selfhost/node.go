package selfhost

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/poolkey"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

// AdmitWait bounds how long Apply waits for the runtime node to admit or refuse a worker's new
// deployment (the node itself gives up on an incarnation that answers no probe in 30 s).
var AdmitWait = 40 * time.Second

// runtimeNode is one member of the selfhost pack's pool: a client of that runtime node's admin API
// (SPEC 5), as the workers-dev backend is a client of Cloudflare's. The Host keeps no runtime files.
// The pack's mutator (pool) fans each call out to its members' runtimeNodes.
type runtimeNode struct {
	inst   catalog.Installation
	log    *slog.Logger
	shared *shared
	member backend.PoolMember
}

// shared is what a pool's members' runtimeNodes share across calls.
type shared struct {
	mu sync.Mutex
	// clients holds one admin client per member's address.
	clients map[string]*Client
	// poolOK is when each member's node last showed it holds the installation's pool key.
	poolOK map[string]time.Time
	// silentSince is when each member that has not answered since first failed to answer.
	silentSince map[string]time.Time
	// routing is how many members may route, as of the last read of the pool.
	routing int
}

// suspect reports whether the member at url has been silent for after.
func (s *shared) suspect(url string, after time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	since, ok := s.silentSince[url]
	return ok && time.Since(since) >= after
}

// several reports whether the pool had more than one member that may route when last read.
func (s *shared) several() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.routing > 1
}

// api returns the member's admin client, reading the token file on first use (and again after a
// failure, so a runtime started after the Host is found). Every member of a pool takes the
// installation's token and TLS files.
func (n *runtimeNode) api(context.Context) (*Client, error) {
	n.shared.mu.Lock()
	defer n.shared.mu.Unlock()
	if c, ok := n.shared.clients[n.member.URL]; ok {
		return c, nil
	}
	c, err := NewFromConfig(Config{
		URL: n.member.URL, TokenFile: n.inst.RuntimeTokenFile,
		CAFile: n.inst.RuntimeCAFile, ClientCertFile: n.inst.RuntimeClientCertFile, ClientKeyFile: n.inst.RuntimeClientKeyFile,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: runtime node %s: %v (is `takoserver runtime` running, and is runtimeTokenFile its admin token?)", backend.ErrUnreachable, n.member.URL, err)
	}
	c.Log = n.log
	// A member suspect in a pool of several (silent for suspectAfter) is asked once per call: every
	// read of the pool asks it, and must not wait on it (SPEC 6.2). A pool of one retries as before.
	url, suspectAfter := n.member.URL, n.inst.Suspect()
	c.Once = func() bool { return n.shared.several() && n.shared.suspect(url, suspectAfter) }
	n.shared.clients[n.member.URL] = c
	return c, nil
}

func wrap(c *Client, err error) error {
	if errors.Is(err, ErrNodeUnreachable) {
		return fmt.Errorf("%w: runtime node %s: %v", backend.ErrUnreachable, c.BaseURL(), err)
	}
	if IsCode(err, adminapi.CodeLeftPool) {
		// Asked on a read of the pool from before it left (another replica's change): the
		// caller retries, and a fresh read leaves it out.
		return fmt.Errorf("%w: runtime node %s left the pool: %v", backend.ErrUnreachable, c.BaseURL(), err)
	}
	return err
}

// bundleDigest is the Host's digest of a bundle, which the runtime keeps and reports back.
func bundleDigest(b *backend.Bundle) string {
	names := make([]string, 0, len(b.Modules))
	for name := range b.Modules {
		names = append(names, name)
	}
	sort.Strings(names)
	modules := make(canonjson.Object, 0, len(names))
	for _, name := range names {
		modules = append(modules, canonjson.Field{Key: name, Value: b.Modules[name]})
	}
	fields := canonjson.Object{
		{Key: "format", Value: "takoform.worker-bundle.v1"},
		{Key: "mainModule", Value: b.MainModule},
		{Key: "compatibilityDate", Value: b.CompatibilityDate},
		{Key: "modules", Value: modules},
	}
	if !b.Settings.Empty() {
		// Only a bundle with settings digests them, so that one without keeps its digest.
		fields = append(fields, canonjson.Field{Key: "settings", Value: settingsObject(b.Settings)})
	}
	sum := sha256.Sum256(canonjson.Marshal(fields))
	return hex.EncodeToString(sum[:])
}

// settingsObject is settings in canonical form for a digest.
func settingsObject(s workerconf.Settings) canonjson.Object {
	object := func(m map[string]string) canonjson.Object {
		o := make(canonjson.Object, 0, len(m))
		for _, k := range slices.Sorted(maps.Keys(m)) {
			o = append(o, canonjson.Field{Key: k, Value: m[k]})
		}
		return o
	}
	flags := make([]any, len(s.CompatibilityFlags))
	for i, f := range s.CompatibilityFlags {
		flags[i] = f
	}
	return canonjson.Object{{Key: "vars", Value: object(s.Vars)}, {Key: "jsonVars", Value: object(s.JSONVars)}, {Key: "compatibilityFlags", Value: flags}}
}

func (n *runtimeNode) Apply(ctx context.Context, d backend.Desired) (backend.Observation, error) {
	if err := n.Rewrite(ctx, d); err != nil {
		return backend.Observation{}, err
	}
	if d.Kind == backend.NativeWorker {
		return n.awaitAdmission(ctx, d)
	}
	return n.Observe(ctx, backend.NativeRoute, d.NativeName)
}

// Rewrite writes d on the node as Apply does, without waiting for the node to admit it.
func (n *runtimeNode) Rewrite(ctx context.Context, d backend.Desired) error {
	c, err := n.api(ctx)
	if err != nil {
		return err
	}
	switch d.Kind {
	case backend.NativeWorker:
		if d.Bundle == nil {
			return errors.New("selfhost backend: a worker deployment needs its bundle")
		}
		names := append([]string{}, d.SecretNames...)
		_, err := c.PutScript(ctx, d.NativeName, adminapi.ScriptPut{
			EffectID: d.EffectID.String(), WorkerUID: d.ResourceUID.String(), DeploymentID: d.DeploymentID.String(),
			Generation: d.Sequence, Labels: adminapi.Labels{Organization: d.Labels.Organization, Space: d.Labels.Space, Worker: d.Labels.Worker},
			Modules: d.Bundle.Modules, MainModule: d.Bundle.MainModule, CompatibilityDate: d.Bundle.CompatibilityDate,
			Settings: d.Bundle.Settings, SecretNames: names, BundleDigest: bundleDigest(d.Bundle),
		})
		if IsCode(err, adminapi.CodeScriptHeld) {
			return fmt.Errorf("%w: script %s on runtime node %s", backend.ErrScriptHeld, d.NativeName, c.BaseURL())
		}
		if IsCode(err, adminapi.CodeMemoryAboveNode) {
			// The offering promises more memory than the node gives one worker.
			return fmt.Errorf("%w: installation %s: %v; a selfhost offering promises each worker %d MB (maxMemoryMb): run the node with --heap-limit-mb %d", backend.ErrMisconfigured, n.inst.Name, err, catalog.SelfhostMemoryMB, catalog.SelfhostMemoryMB)
		}
		return wrap(c, err)
	case backend.NativeRoute:
		_, err := c.PutRoute(ctx, d.NativeName, adminapi.RoutePut{
			EffectID: d.EffectID.String(), ScriptName: d.ScriptName, EndpointUID: d.ResourceUID.String(), DeploymentID: d.DeploymentID.String(),
		})
		return wrap(c, err)
	}
	return fmt.Errorf("selfhost backend: unknown native kind %q", d.Kind)
}

// awaitAdmission reads the script until the runtime admits or refuses d's deployment (its
// incarnation Ready, or ready and waiting only for its secret values; or failed), a later
// deployment rewrites it, reading it fails, or the wait ends. Ready needs the runtime's two
// witnesses (process running, probe answered).
func (n *runtimeNode) awaitAdmission(ctx context.Context, d backend.Desired) (backend.Observation, error) {
	deadline := time.Now().Add(AdmitWait)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl.Add(-500 * time.Millisecond)
	}
	return backend.Await(ctx, n, backend.NativeWorker, d.NativeName, deadline, func(obs backend.Observation, err error) bool {
		// A later deployment's rewrite is answered as it is: the caller compares.
		return err != nil || (obs.Present && obs.DeploymentID != d.DeploymentID) || obs.Admitted || obs.Failed
	})
}

// ObserveChange holds a worker's read on the runtime node until its status changes (or within
// passes); a route is read at once.
func (n *runtimeNode) ObserveChange(ctx context.Context, kind, nativeName string, since backend.Observation, within time.Duration) (backend.Observation, error) {
	if kind != backend.NativeWorker || since.Version == "" {
		return n.Observe(ctx, kind, nativeName)
	}
	c, err := n.api(ctx)
	if err != nil {
		return backend.Observation{}, err
	}
	st, err := c.WatchScript(ctx, nativeName, since.Version, min(within, adminapi.StatusWaitMax))
	if err != nil {
		return backend.Observation{}, wrap(c, err)
	}
	return scriptObservation(st), nil
}

func (n *runtimeNode) Delete(ctx context.Context, d backend.Desired) error {
	c, err := n.api(ctx)
	if err != nil {
		return err
	}
	switch d.Kind {
	case backend.NativeWorker:
		_, err = c.DeleteScript(ctx, d.NativeName, d.ResourceUID.String())
	case backend.NativeRoute:
		_, err = c.DeleteRoute(ctx, d.NativeName, d.ScriptName, d.ResourceUID.String())
	default:
		err = fmt.Errorf("selfhost backend: unknown native kind %q", d.Kind)
	}
	return wrap(c, err)
}

func (n *runtimeNode) Observe(ctx context.Context, kind, nativeName string) (backend.Observation, error) {
	c, err := n.api(ctx)
	if err != nil {
		return backend.Observation{}, err
	}
	switch kind {
	case backend.NativeWorker:
		st, err := c.GetScript(ctx, nativeName)
		if err != nil {
			return backend.Observation{}, wrap(c, err)
		}
		return scriptObservation(st), nil
	case backend.NativeRoute:
		rt, err := c.GetRoute(ctx, nativeName)
		if err != nil {
			return backend.Observation{}, wrap(c, err)
		}
		obs := backend.Observation{Present: rt.Present, Admitted: rt.Present, Ready: rt.Ready}
		obs.DeploymentID, _ = uuid.Parse(rt.DeploymentID)
		if rt.Present && !rt.Ready {
			obs.Reason, obs.Message = adminapi.ReasonPending, "the route is installed; its worker's incarnation is not Ready"
		}
		return obs, nil
	}
	return backend.Observation{}, fmt.Errorf("selfhost backend: unknown native kind %q", kind)
}

func scriptObservation(st adminapi.ScriptStatus) backend.Observation {
	obs := backend.Observation{Present: st.Present, Ready: st.Ready, Reason: st.Reason, Incident: st.Incident, IncidentMessage: st.IncidentMessage,
		Quarantined: st.Quarantined, QuarantineMessage: st.QuarantineMessage, Version: st.Version}
	obs.DeploymentID, _ = uuid.Parse(st.DeploymentID)
	obs.Admitted = st.Present && (st.Ready || st.Reason == adminapi.ReasonSecretsPending)
	obs.Failed = st.Present && st.Reason == adminapi.ReasonFailed
	if st.Candidate != nil && st.Candidate.State == adminapi.StateFailed {
		obs.Message = st.Candidate.Message
	} else if st.Incarnation != nil {
		obs.Message = st.Incarnation.Message
	}
	return obs
}

func (n *runtimeNode) DeliverSecrets(ctx context.Context, d backend.Delivery, values map[string]vocab.Secret) error {
	c, err := n.api(ctx)
	if err != nil {
		return err
	}
	wire := make(map[string]vocab.Secret, len(values))
	for k, v := range values {
		wire[k] = vocab.NewSecret(v.Reveal())
	}
	_, err = c.PutSecrets(ctx, d.ScriptName, adminapi.SecretsPut{
		EffectID: d.EffectID.String(), WorkerUID: d.WorkerUID.String(), DeliveryID: d.MaterialSetID.String(), Values: wire,
	})
	return wrap(c, err)
}

// PoolSeal seals the material to the installation's pool key (SPEC 6.2), bound to the pool (the
// installation's name), the worker UID and the delivery.
func (n *runtimeNode) PoolSeal(d backend.Delivery, plaintext []byte) ([]byte, bool, error) {
	key, ok := n.inst.PoolKey()
	if !ok {
		return nil, false, nil
	}
	blob, err := poolkey.Seal(key, n.inst.Name, poolkey.Binding{WorkerUID: d.WorkerUID.String(), DeliveryID: d.MaterialSetID.String()}, plaintext)
	return blob, err == nil, err
}

// DeliverSealed gives the node a pool blob in place of the values.
func (n *runtimeNode) DeliverSealed(ctx context.Context, d backend.Delivery, blob []byte) error {
	c, err := n.api(ctx)
	if err != nil {
		return err
	}
	_, err = c.PutSecrets(ctx, d.ScriptName, adminapi.SecretsPut{
		EffectID: d.EffectID.String(), WorkerUID: d.WorkerUID.String(), DeliveryID: d.MaterialSetID.String(), Sealed: blob,
	})
	return wrap(c, err)
}

// RestoreSealed names a kept blob again to the node, taken only where it holds replaces.
func (n *runtimeNode) RestoreSealed(ctx context.Context, d backend.Delivery, blob []byte, replaces string) error {
	c, err := n.api(ctx)
	if err != nil {
		return err
	}
	_, err = c.PutSecrets(ctx, d.ScriptName, adminapi.SecretsPut{
		EffectID: d.EffectID.String(), WorkerUID: d.WorkerUID.String(), DeliveryID: d.MaterialSetID.String(), Sealed: blob,
		Restore: true, Replaces: replaces,
	})
	var p *ProblemError
	if errors.As(err, &p) && p.Problem.Code == adminapi.CodeDeliveryHeld {
		return backend.ErrNotRestored
	}
	return wrap(c, err)
}

var _ backend.PoolSink = (*runtimeNode)(nil)

// poolChecked is how long a node found holding the pool's key is not asked again.
const poolChecked = 30 * time.Second

// CheckDelivery refuses, before a runtime input is claimed, a delivery to a node that could not
// open it: the installation names a pool key the node does not hold (no --pool-key-file, another
// pool's, or a runtime too old to know pools).
func (n *runtimeNode) CheckDelivery(ctx context.Context) error {
	if n.inst.PoolPublicKey == "" {
		return nil
	}
	c, err := n.api(ctx)
	if err != nil {
		return err
	}
	n.shared.mu.Lock()
	fresh := time.Since(n.shared.poolOK[c.BaseURL()]) < poolChecked
	n.shared.mu.Unlock()
	if fresh {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	held, err := c.Pool(cctx)
	var p *ProblemError
	switch {
	case errors.As(err, &p) && p.StatusCode == http.StatusNotFound:
		held = adminapi.Pool{}
	case err != nil:
		return wrap(c, err)
	}
	// Mid-rotation, the node holds the new key and the one it replaces: the Host's catalog may
	// name either until every replica has the new one.
	if held.Pool != n.inst.Name || (held.PublicKey != n.inst.PoolPublicKey && held.PreviousPublicKey != n.inst.PoolPublicKey) {
		have := "no pool key"
		if held.PublicKey != "" {
			have = fmt.Sprintf("the key %s of pool %q", held.PublicKey, held.Pool)
		}
		return fmt.Errorf("%w: runtime node %s holds %s, but the catalog names %s for installation %q: start the node with that pool's --pool-key-file (nothing was delivered)",
			backend.ErrMisconfigured, c.BaseURL(), have, n.inst.PoolPublicKey, n.inst.Name)
	}
	n.shared.mu.Lock()
	n.shared.poolOK[c.BaseURL()] = time.Now()
	n.shared.mu.Unlock()
	return nil
}

var _ backend.DeliveryCheck = (*runtimeNode)(nil)

func (n *runtimeNode) ReadbackSecrets(ctx context.Context, d backend.Delivery, challenge []byte) ([]byte, bool, error) {
	return n.readback(ctx, d, challenge, true, false)
}

// readback asks the node for the challenge's digest over d's values; with conclude, a node that
// does not hold d refuses any later copy of it (the lease is concluded absent there). With
// exactly, a node that holds another delivery than d reads as not holding d (a pool's members may
// hold different deliveries: one that missed d still holds the one before).
func (n *runtimeNode) readback(ctx context.Context, d backend.Delivery, challenge []byte, conclude, exactly bool) ([]byte, bool, error) {
	c, err := n.api(ctx)
	if err != nil {
		return nil, false, err
	}
	concludes := ""
	if conclude {
		concludes = d.MaterialSetID.String()
	}
	rb, err := c.Readback(ctx, d.ScriptName, challenge, concludes)
	if err != nil {
		return nil, false, wrap(c, err)
	}
	if !rb.Present || (exactly && rb.DeliveryID != "" && rb.DeliveryID != d.MaterialSetID.String()) {
		return nil, false, nil
	}
	digest, err := hex.DecodeString(rb.Digest)
	if err != nil {
		return nil, false, fmt.Errorf("selfhost backend: the runtime answered a malformed readback digest")
	}
	return digest, true, nil
}

// logPoll is how long one long poll of the runtime's log route waits for a new entry.
var logPoll = 20 * time.Second

// WorkerLogs pages through the worker's log ring on the runtime node: the entries held now, then,
// with follow, long polls for new ones. A script the node does not hold (yet) has no entries.
func (n *runtimeNode) WorkerLogs(ctx context.Context, scriptName string, workerUID uuid.UUID, q backend.LogQuery, each func(backend.LogEntry) error, flush func() error) error {
	c, err := n.api(ctx)
	if err != nil {
		return err
	}
	cursor := adminapi.LogQuery{WorkerUID: workerUID.String(), Since: q.Since}
	// Without follow, the pages that hold the ring now: it holds at most a few, and a worker that
	// keeps printing must not keep a one-shot read going.
	for round := 0; q.Follow || round < 8; round++ {
		if q.Follow && round > 0 {
			// The first page answers at once (the stream's client sees it open, with what the
			// ring holds); the later ones wait for new entries.
			cursor.Wait = logPoll
		}
		call, cancel := context.WithTimeout(ctx, cursor.Wait+15*time.Second)
		page, err := c.Logs(call, scriptName, cursor)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case IsCode(err, adminapi.CodeScriptAbsent):
			page = adminapi.LogPage{}
			if q.Follow {
				// Not deployed yet, or being replaced: look again in a moment.
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(time.Second):
				}
			}
		case err != nil:
			return wrap(c, err)
		}
		if page.Missed > 0 {
			if err := each(backend.LogEntry{Time: time.Now().UTC(), Missed: page.Missed}); err != nil {
				return err
			}
		}
		for _, e := range page.Entries {
			if err := each(backend.LogEntry{Time: e.Time, Incarnation: e.Incarnation, Level: e.Level, Message: e.Message, Dropped: e.Dropped}); err != nil {
				return err
			}
		}
		if page.Epoch != "" {
			cursor.Epoch, cursor.After = page.Epoch, page.Next
		}
		if err := flush(); err != nil {
			return err
		}
		if !q.Follow && len(page.Entries) == 0 && page.Missed == 0 {
			return nil // read to the end
		}
	}
	return nil
}
