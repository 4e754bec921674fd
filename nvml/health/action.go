package health

import "fmt"

// Action is what the agent should do about a GPU health finding, from
// least to most disruptive; the order is what Decide compares.
type Action int

const (
	// ActionIgnore: nothing to do; the finding is logged and reported.
	ActionIgnore Action = iota
	// ActionRestartWorkers: the workers on the GPU cannot go on (their CUDA
	// context is gone) but the GPU is healthy: stop the worker group and
	// start a new generation on the same GPUs.
	ActionRestartWorkers
	// ActionResetGPU: the GPU needs a reset (nvidia-smi -r, which needs every
	// process off it) or a node reboot before it can be used again. NVML
	// offers no reset, and one may need root and other jobs off the GPU, so
	// the agent treats it as a drain: it stops the workers, leaves the job
	// and exits naming the GPU, for the operator or scheduler to reset.
	ActionResetGPU
	// ActionDrainNode: the node cannot be trusted any more (a GPU fell off
	// the bus, memory repair failed, a reboot is required): leave the
	// rendezvous, stop the workers and exit non-zero so the scheduler
	// replaces the node.
	ActionDrainNode
)

var actionNames = [...]string{"ignore", "restart-workers", "reset-gpu", "drain-node"}

// String returns "ignore", "restart-workers", "reset-gpu" or "drain-node";
// "HealthAction(n)" for a value out of range, as before the type moved here
// from package nvml.
func (a Action) String() string {
	if a >= 0 && int(a) < len(actionNames) {
		return actionNames[a]
	}
	return fmt.Sprintf("HealthAction(%d)", int(a))
}

// MarshalText encodes the action as its String form.
func (a Action) MarshalText() ([]byte, error) {
	if a < 0 || int(a) >= len(actionNames) {
		return nil, fmt.Errorf("marshal health action %d: out of range", int(a))
	}
	return []byte(actionNames[a]), nil
}

// UnmarshalText decodes a String form ("reset-gpu").
func (a *Action) UnmarshalText(b []byte) error {
	for i, n := range actionNames {
		if n == string(b) {
			*a = Action(i)
			return nil
		}
	}
	return fmt.Errorf("unknown health action %q", b)
}
