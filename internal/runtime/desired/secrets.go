package desired

import (
	"slices"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
)

// PutSecrets delivers a worker's secret values to its script (PUT /v1/scripts/{name}/secrets). The
// values themselves never enter the desired state: Delivery names them and carries their keyed
// digest, and the answer asks the caller to Seal them.
type PutSecrets struct {
	Effect Effect
	Name   string
	// Delivery is what the state keeps of it; its Names are sorted.
	Delivery state.Delivery
	// Restore: the Host names again a delivery it recorded settled (SPEC 6.2). A refusal of it
	// here (a pool's readback concluded it absent on this node while another node held it) is
	// lifted: its lease did not fail.
	Restore bool
}

func (op PutSecrets) apply(s *state.Desired) Answer {
	at := target("secrets", op.Name)
	if again, r := replay(s, op.Effect, at); r != nil {
		return refused(r)
	} else if again {
		return Answer{Replayed: true}
	}
	d := op.Delivery
	if _, gone := s.Refused[d.DeliveryID]; gone && !op.Restore {
		// A readback concluded it absent and the Host failed its lease (SPEC 3.5): a copy still
		// on its way never lands after that.
		return refused(refusal(adminapi.CodeDeliveryRefused, ShowsNothing, "delivery %s was concluded absent by a readback; it never lands now", d.DeliveryID))
	}
	cur := s.Scripts[op.Name]
	if cur == nil {
		return refused(refusal(adminapi.CodeScriptAbsent, ShowsNothing, "script %s is not here; PUT it first", op.Name))
	}
	if cur.WorkerUID != d.WorkerUID {
		// Values belong to the worker holding the script; the answer names nobody.
		return refused(refusal(adminapi.CodeWorkerMismatch, ShowsNothing, "script %s belongs to another worker; a delivery is for the worker holding the script", op.Name))
	}
	if !slices.Equal(d.Names, cur.SecretNames) {
		return refused(refusal(adminapi.CodeSecretNames, ShowsNothing, "the delivery names %v; script %s declares %v", d.Names, op.Name, cur.SecretNames))
	}
	if _, gone := s.Refused[d.DeliveryID]; gone {
		s.DeleteRefused(d.DeliveryID)
	}
	next := *cur
	next.Delivery = &d
	s.SetScript(&next)
	record(s, op.Effect, at)
	// The new delivery is a new incarnation, admitted through the update path.
	return Answer{Changed: true, Seal: true, RetryFailed: true, Reconcile: op.Name}
}

// DeleteSecrets erases a worker's delivery (DELETE /v1/scripts/{name}/secrets?workerUid=): only
// while the script is that worker UID's and holds one; otherwise it changes nothing.
type DeleteSecrets struct {
	Name      string
	WorkerUID string
}

func (op DeleteSecrets) apply(s *state.Desired) Answer {
	cur := s.Scripts[op.Name]
	if cur == nil || cur.WorkerUID != op.WorkerUID || cur.Delivery == nil {
		return Answer{}
	}
	next := *cur
	next.Delivery = nil
	s.SetScript(&next)
	return Answer{Changed: true, Erase: op.WorkerUID, Reconcile: op.Name}
}

// RefusedFor is how long a delivery a readback concluded absent stays refused: far longer than
// any request to the runtime can be on its way.
const RefusedFor = 24 * time.Hour

// ConcludeAbsent is a readback that concludes a delivery (POST …/readback with concludes): unless
// the script holds that delivery, it is refused from then on, so a late copy of it never lands.
// Refusals older than RefusedFor are forgotten when a new one is recorded.
type ConcludeAbsent struct {
	Name       string
	DeliveryID string
	At         time.Time
}

func (op ConcludeAbsent) apply(s *state.Desired) Answer {
	if cur := s.Scripts[op.Name]; cur != nil && cur.Delivery != nil && cur.Delivery.DeliveryID == op.DeliveryID {
		return Answer{}
	}
	if _, ok := s.Refused[op.DeliveryID]; ok {
		return Answer{}
	}
	for id, at := range s.Refused {
		if op.At.Sub(at) > RefusedFor {
			s.DeleteRefused(id) // writes a copy: the range goes on over the map it began with
		}
	}
	s.SetRefused(op.DeliveryID, op.At)
	return Answer{Changed: true}
}
