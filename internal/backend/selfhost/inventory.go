package selfhost

import (
	"context"

	"github.com/google/uuid"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// Holdings lists every script and route the node holds.
func (n *runtimeNode) Holdings(ctx context.Context) (backend.Holdings, error) {
	c, err := n.api(ctx)
	if err != nil {
		return backend.Holdings{}, err
	}
	st, err := c.Status(ctx)
	if err != nil {
		return backend.Holdings{}, wrap(c, err)
	}
	out := backend.Holdings{GenerationFloor: st.GenerationFloor, Node: n.member.Name, Boot: st.Boot}
	for _, s := range st.Scripts {
		if s.Present {
			out.Objects = append(out.Objects, backend.Held{Kind: backend.NativeWorker, NativeName: s.ScriptName, DeploymentID: parseID(s.DeploymentID),
				ResourceUID: s.WorkerUID, Organization: s.Labels.Organization, Generation: s.Generation, DeliveryID: s.Secrets.DeliveryID})
		}
	}
	for _, r := range st.Routes {
		if r.Present {
			out.Objects = append(out.Objects, backend.Held{Kind: backend.NativeRoute, NativeName: r.Hostname, DeploymentID: parseID(r.DeploymentID),
				ResourceUID: r.EndpointUID, ScriptName: r.ScriptName})
		}
	}
	return out, nil
}

var _ backend.Inventory = (*runtimeNode)(nil)

func parseID(s string) uuid.UUID {
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil
	}
	return id
}

// RunTick asks the node to run t.
func (n *runtimeNode) RunTick(ctx context.Context, t backend.Tick) (backend.TickOutcome, error) {
	c, err := n.api(ctx)
	if err != nil {
		return backend.TickOutcome{}, err
	}
	out, err := c.RunScheduled(ctx, t.ScriptName, adminapi.ScheduledRun{TickID: t.ID, WorkerUID: t.WorkerUID, Cron: t.Cron,
		ScheduledTime: t.ScheduledTime, Deadline: t.Deadline})
	if err != nil {
		return backend.TickOutcome{}, wrap(c, err)
	}
	return backend.TickOutcome{OK: out.Outcome == adminapi.ScheduledOK, Detail: out.Message}, nil
}

var _ backend.CronRunner = (*runtimeNode)(nil)
