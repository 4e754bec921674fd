package fault

import (
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/nvml/health"
)

// TestGPUError: what a GPU fault says in each case, and which faults are
// older than an attempt.
func TestGPUError(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f := func(action health.Action, last time.Time) health.Finding {
		return health.Finding{Time: last.Add(-time.Second), Last: last, Count: 3, GPU: 2, UUID: "GPU-2", Ranks: []int{2, 10},
			XID: 79, Message: "Xid 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS: GPU has fallen off the bus", Action: action}
	}
	drain := &GPUError{Action: health.ActionDrainNode, Findings: []health.Finding{f(health.ActionDrainNode, t0), f(health.ActionRestartWorkers, t0)}}
	want := "GPU 2 (GPU-2): Xid 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS: GPU has fallen off the bus (3 times), ranks 2,10, and 1 more finding(s): this node must be drained; it leaves the job"
	if got := drain.Error(); got != want || !drain.Drains() {
		t.Errorf("drain: got %q (drains %v), want %q", got, drain.Drains(), want)
	}
	reset := &GPUError{Action: health.ActionResetGPU, Findings: []health.Finding{f(health.ActionResetGPU, t0)}}
	if got := reset.Error(); !strings.HasSuffix(got, "needs a reset (nvidia-smi -r -i 2) or the node a reboot; this node leaves the job") || !reset.Drains() {
		t.Errorf("reset: got %q", got)
	}
	restart := &GPUError{Action: health.ActionRestartWorkers, Findings: []health.Finding{f(health.ActionRestartWorkers, t0)}}
	if got := restart.Error(); !strings.HasSuffix(got, ": restarting the workers") || restart.Drains() || strings.Contains(restart.Finding(), "restarting") {
		t.Errorf("restart: got %q, finding %q", got, restart.Finding())
	}
	if !drain.Before(t0.Add(time.Nanosecond)) || drain.Before(t0) {
		t.Error("before: a fault is older than a time after its last finding, and only then")
	}
	mixed := &GPUError{Action: health.ActionRestartWorkers, Findings: []health.Finding{f(health.ActionRestartWorkers, t0), f(health.ActionRestartWorkers, t0.Add(time.Minute))}}
	if mixed.Before(t0.Add(time.Second)) {
		t.Error("before: a fault with one finding after t is not older than t")
	}
}
