package ownership

import (
	"context"
	"errors"
	"fmt"

	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// DeploymentBrake is the scope of an operator's deployment brake (SPEC 3.6): the whole Host (no
// organization), one organization, or one worker of it (space and worker name together).
type DeploymentBrake struct {
	OrganizationID string
	Space, Worker  string
}

// scope is the brake's key: "*", the organization's id, or id/space/worker.
func (b DeploymentBrake) scope() (string, error) {
	switch {
	case (b.Space == "") != (b.Worker == ""), b.Space != "" && b.OrganizationID == "":
		return "", errors.New("a worker's brake names its organization, space and worker together")
	case b.OrganizationID == "":
		return "*", nil
	case b.Space == "":
		return b.OrganizationID, nil
	}
	return b.OrganizationID + "/" + b.Space + "/" + b.Worker, nil
}

// Scope is the brake's key as the database holds it.
func (b DeploymentBrake) Scope() string {
	s, _ := b.scope()
	return s
}

// SetDeploymentBrake engages (or releases) a deployment brake. Engaging one already engaged, or
// releasing one that is not, changes nothing; every replica's next lock step sees the change.
func SetDeploymentBrake(ctx context.Context, db dbsqlc.DBTX, b DeploymentBrake, engaged bool) error {
	scope, err := b.scope()
	if err != nil {
		return err
	}
	q := dbsqlc.New(db)
	if !engaged {
		if _, err := q.BrakeRelease(ctx, scope); err != nil {
			return fmt.Errorf("ownership: release brake: %w", err)
		}
		return nil
	}
	params := dbsqlc.BrakeEngageParams{Scope: scope}
	if b.OrganizationID != "" {
		params.OrganizationID = &b.OrganizationID
	}
	if b.Space != "" {
		params.Space, params.WorkerName = &b.Space, &b.Worker
	}
	if err := q.BrakeEngage(ctx, params); err != nil {
		return fmt.Errorf("ownership: engage brake: %w", err)
	}
	return nil
}
