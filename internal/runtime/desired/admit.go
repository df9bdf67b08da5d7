package desired

import "github.com/takoform/terraform-provider-takoform/internal/runtime/state"

// Admit records that the script's desired deployment now serves as incarnation Incarnation, with
// delivery DeliveryID ("" none): continuity restarts exactly it from then on, also after the node
// restarts, and Serving keeps its content for when a newer deployment replaces the desired one
// (SPEC 5, admission). The runtime decides this itself, when a candidate becomes Ready.
type Admit struct {
	Name        string
	Incarnation string
	DeliveryID  string
}

func (op Admit) apply(s *state.Desired) Answer {
	cur := s.Scripts[op.Name]
	if cur == nil || (cur.Admitted == op.Incarnation && cur.Serving != nil && cur.Serving.DeploymentID == cur.DeploymentID) {
		return Answer{}
	}
	next := *cur
	next.Admitted = op.Incarnation
	next.Serving = &state.Served{DeploymentID: cur.DeploymentID, Generation: cur.Generation, Modules: cur.Modules,
		MainModule: cur.MainModule, CompatibilityDate: cur.CompatibilityDate, Settings: cur.Settings, DeliveryID: op.DeliveryID}
	s.SetScript(&next)
	return Answer{Changed: true}
}
