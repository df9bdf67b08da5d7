package backend

import "context"

// WorkerLimits is what ConvergeLimits makes the backend's routing hold for one worker.
type WorkerLimits struct {
	ScriptName string
	WorkerUID  string
	CPUMs      int64
}

// LimitRouter is a pack whose routing carries a worker's limits (wfp-managed).
type LimitRouter interface {
	ConvergeLimits(ctx context.Context, w WorkerLimits) error
}

// ConvergeLimits has m's pack converge w's limits into its routing, when the pack routes them; a
// pack whose scripts carry their own limits answers nil.
func ConvergeLimits(ctx context.Context, m Mutator, w WorkerLimits) error {
	if r, ok := As[LimitRouter](m); ok {
		return r.ConvergeLimits(ctx, w)
	}
	return nil
}
