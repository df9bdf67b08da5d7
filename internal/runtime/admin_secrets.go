package runtime

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"sort"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
	"github.com/takoform/terraform-provider-takoform/internal/poolkey"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/desired"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// putSecrets delivers a worker's secret values (desired.PutSecrets): sealed at rest before the
// desired state names the delivery, then admitted as a new incarnation.
func (n *Node) putSecrets(w http.ResponseWriter, r *http.Request) (any, error) {
	name, err := scriptName(r)
	if err != nil {
		return nil, err
	}
	var req adminapi.SecretsPut
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	if err := checkID("effectId", req.EffectID); err != nil {
		return nil, err
	}
	if err := checkID("deliveryId", req.DeliveryID); err != nil {
		return nil, err
	}
	if !state.ValidWorkerUID(req.WorkerUID) {
		return nil, invalid("workerUid %q must match [A-Za-z0-9][A-Za-z0-9._-]{0,127}", req.WorkerUID)
	}
	if req.Sealed != nil {
		if len(req.Values) != 0 {
			return nil, invalid("a delivery carries values or a pool's sealed blob, not both")
		}
		values, err := n.openPoolBlob(req)
		if err != nil {
			return nil, err
		}
		req.Values = values
	} else if req.Restore {
		return nil, invalid("only a pool's sealed delivery is restored")
	}
	if req.Replaces != "" && !req.Restore {
		return nil, invalid("replaces goes with restore")
	}
	names := make([]string, 0, len(req.Values))
	for k := range req.Values {
		if !workerd.ValidBindingName(k) {
			return nil, invalid("binding name %q does not match ^[A-Za-z_][A-Za-z0-9_]*$", k)
		}
		names = append(names, k)
	}
	sort.Strings(names)
	if len(names) == 0 {
		return nil, invalid("a delivery carries at least one value")
	}
	op := desired.PutSecrets{Effect: n.effect(req.EffectID, req), Name: name, Restore: req.Restore,
		Delivery: state.Delivery{DeliveryID: req.DeliveryID, WorkerUID: req.WorkerUID, Names: names, ValuesMAC: n.store.ValuesMAC(req.Values)}}
	seal := func() error { return n.store.SealSecrets(req.WorkerUID, req.DeliveryID, req.Values) }
	n.mu.Lock()
	defer n.mu.Unlock()
	if req.Restore {
		// Named again by the Host to a node that lost its state (or came back from an old backup):
		// taken only where the worker's script holds exactly the delivery it replaces (none, or a
		// superseded one), so that it never replaces a newer one that arrived first.
		cur := n.desired.Scripts[name]
		held := ""
		if cur != nil && cur.Delivery != nil {
			held = cur.Delivery.DeliveryID
		}
		if cur == nil || cur.WorkerUID != req.WorkerUID || held != req.Replaces {
			return nil, adminapi.NewProblem(http.StatusConflict, adminapi.CodeDeliveryHeld, "Delivery held",
				"the script does not hold what this restore replaces (another delivery arrived, or the script is another worker's): nothing restored")
		}
	}
	a, _, err := n.applyLocked(op, name, seal)
	if err != nil {
		return nil, err
	}
	if a.Replayed {
		replayed(w)
	} else {
		n.log.Info("secrets delivered", "script", name, "workerUid", req.WorkerUID, "deliveryId", req.DeliveryID, "names", names, "effectId", req.EffectID)
	}
	return n.scriptStatusLocked(name), nil
}

// poolKey answers which pool key the node holds, so that the Host finds a node that cannot open
// its pool's deliveries before it spends a one-shot lease on it.
func (n *Node) poolKey(http.ResponseWriter, *http.Request) (any, error) {
	if n.pool == nil {
		return adminapi.Pool{}, nil
	}
	out := adminapi.Pool{Pool: n.pool.Pool, PublicKey: n.pool.Public().String()}
	if n.poolPrevious != nil {
		out.PreviousPublicKey = n.poolPrevious.Public().String()
	}
	return out, nil
}

// openPool opens a blob with the node's pool key, or the key it replaces.
func (n *Node) openPool(b poolkey.Binding, blob []byte) ([]byte, error) {
	plain, err := n.pool.Open(b, blob)
	if err != nil && n.poolPrevious != nil {
		plain, err = n.poolPrevious.Open(b, blob)
	}
	return plain, err
}

// reseal seals a pool blob again to the node's current pool key (`takoserver nodes
// rotate-pool-key`): it opens it with the current or the previous key and answers the new blob.
// The values never leave the node.
func (n *Node) reseal(_ http.ResponseWriter, r *http.Request) (any, error) {
	var req adminapi.Reseal
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	if n.pool == nil {
		return nil, invalid("this node has no pool key: start it with --pool-key-file")
	}
	b := poolkey.Binding{WorkerUID: req.WorkerUID, DeliveryID: req.DeliveryID}
	plain, err := n.openPool(b, req.Sealed)
	if err != nil {
		return nil, invalid("the blob does not open with this node's pool keys (pool %q): %v", n.pool.Pool, err)
	}
	blob, err := poolkey.Seal(n.pool.Public(), n.pool.Pool, b, plain)
	clear(plain)
	if err != nil {
		return nil, err
	}
	return adminapi.Reseal{WorkerUID: req.WorkerUID, DeliveryID: req.DeliveryID, Sealed: blob}, nil
}

// openPoolBlob opens a delivery the Host sealed to this node's pool (SPEC 6.2).
func (n *Node) openPoolBlob(req adminapi.SecretsPut) (map[string]vocab.Secret, error) {
	if n.pool == nil {
		return nil, invalid("this node has no pool key: start it with --pool-key-file, the private key of the pool whose public key the Host's catalog names")
	}
	plain, err := n.openPool(poolkey.Binding{WorkerUID: req.WorkerUID, DeliveryID: req.DeliveryID}, req.Sealed)
	if err != nil {
		return nil, invalid("the sealed delivery does not open with this node's pool key (pool %q): %v", n.pool.Pool, err)
	}
	var m map[string]string
	if err := json.Unmarshal(plain, &m); err != nil {
		return nil, invalid("the sealed delivery holds no values")
	}
	values := make(map[string]vocab.Secret, len(m))
	for k, v := range m {
		values[k] = vocab.NewSecret(v)
	}
	return values, nil
}

// deleteSecrets erases the delivery of the worker UID the caller names (desired.DeleteSecrets).
func (n *Node) deleteSecrets(_ http.ResponseWriter, r *http.Request) (any, error) {
	name, err := scriptName(r)
	if err != nil {
		return nil, err
	}
	uid := r.URL.Query().Get(adminapi.QueryWorkerUID)
	if uid == "" {
		return nil, invalid("the delete names the worker UID it means: ?workerUid=")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	a, _, err := n.applyLocked(desired.DeleteSecrets{Name: name, WorkerUID: uid}, name, nil)
	if err != nil {
		return nil, err
	}
	if a.Changed {
		n.log.Info("secrets erased", "script", name, "workerUid", uid)
	}
	return n.scriptStatusLocked(name), nil
}

// readback answers HMAC-SHA256(challenge, canonical JSON of the bindings exactly as given to
// workerd): the Host compares it with the digest it stored at sealing (SPEC 3.5). No value and no
// unkeyed digest leaves.
func (n *Node) readback(_ http.ResponseWriter, r *http.Request) (any, error) {
	name, err := scriptName(r)
	if err != nil {
		return nil, err
	}
	var req adminapi.ReadbackRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	challenge, err := base64.StdEncoding.DecodeString(req.Challenge)
	if err != nil || len(challenge) != 32 {
		return nil, invalid("challenge must be standard base64 of 32 bytes")
	}
	if req.Concludes != "" {
		if err := checkID("concludes", req.Concludes); err != nil {
			return nil, err
		}
		n.mu.Lock()
		defer n.mu.Unlock()
		a, _, err := n.applyLocked(desired.ConcludeAbsent{Name: name, DeliveryID: req.Concludes, At: time.Now()}, name, nil)
		if err != nil {
			return nil, err
		}
		if a.Changed {
			n.log.Info("delivery refused: a readback concluded it absent", "script", name, "deliveryId", req.Concludes)
		}
	} else {
		n.mu.RLock()
		defer n.mu.RUnlock()
	}
	cur := n.desired.Scripts[name]
	if cur == nil || cur.Delivery == nil {
		out := adminapi.Readback{}
		if cur != nil {
			out.WorkerUID = cur.WorkerUID
		}
		return out, nil
	}
	values, err := n.store.OpenSecrets(cur.Delivery.WorkerUID, cur.Delivery.DeliveryID)
	if err != nil {
		return nil, err
	}
	h := hmac.New(sha256.New, challenge)
	h.Write(canonjson.Marshal(state.Reveal(values)))
	return adminapi.Readback{Present: true, WorkerUID: cur.WorkerUID, DeliveryID: cur.Delivery.DeliveryID, Digest: hex.EncodeToString(h.Sum(nil))}, nil
}
