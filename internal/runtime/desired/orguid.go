package desired

import "github.com/takoform/terraform-provider-takoform/internal/runtime/state"

// CodeUIDHeld refuses to give an organization a sandbox uid another organization holds. It never
// reaches the wire: the node allocates uids itself.
const CodeUIDHeld = "uid_held"

// AssignOrgUID gives an organization its sandbox uid (SPEC 5.1): an organization runs as the same
// uid for good, and a uid never passes to another organization. An organization that has one
// keeps it.
type AssignOrgUID struct {
	Organization string
	UID          int
}

func (op AssignOrgUID) apply(s *state.Desired) Answer {
	if _, ok := s.OrgUIDs[op.Organization]; ok {
		return Answer{}
	}
	for _, uid := range s.OrgUIDs {
		if uid == op.UID {
			// The detail reaches the script's status: it names no organization.
			return refused(refusal(CodeUIDHeld, ShowsNothing, "uid %d is another organization's", op.UID))
		}
	}
	s.SetOrgUID(op.Organization, op.UID)
	return Answer{Changed: true}
}
