package agent

import (
	"testing"

	"github.com/ddp-agent/ddp-agent/agent/pluginhost"
	"github.com/ddp-agent/ddp-agent/nvml/health"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

// TestDecide: recover's decision, from a fault's severity, whether the
// rendezvous left the job restarts, and whether a drain of this node is
// queued behind the fault.
func TestDecide(t *testing.T) {
	tests := []struct {
		name         string
		sev          Severity
		restartsLeft bool
		drainPending bool
		want         action
	}{
		{"round ended", NewGeneration, true, false, actNewGeneration},
		{"round ended, no restarts left (not charged)", NewGeneration, false, false, actNewGeneration},
		{"round ended, drain queued", NewGeneration, true, true, actDrain},
		{"this node's fault", Restart, true, false, actRestart},
		{"this node's fault, no restarts left", Restart, false, false, actFail},
		{"this node's fault, drain queued", Restart, true, true, actDrain},
		{"worker killed by a GPU that fell off, no restarts left", Restart, false, true, actDrain},
		{"drain", Drain, true, false, actDrain},
		{"drain, no restarts left", Drain, false, false, actDrain},
		{"job failed", Fail, true, false, actFail},
		{"job failed, drain queued", Fail, false, true, actDrain},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := decide(tc.sev, tc.restartsLeft, tc.drainPending); got != tc.want {
				t.Errorf("decide(%v, %v, %v): got %v, want %v", tc.sev, tc.restartsLeft, tc.drainPending, got, tc.want)
			}
		})
	}
}

// TestFaultSeverity: every source gives its fault the severity its
// finding calls for.
func TestFaultSeverity(t *testing.T) {
	tests := []struct {
		name string
		f    *Fault
		want Severity
	}{
		{"worker", workerFault(1, &WorkerFailedError{}), Restart},
		{"round", roundFault(1, "node b left"), NewGeneration},
		{"plugin restart", pluginFault(&PluginFaultError{}), Restart},
		{"plugin drain", pluginFault(&PluginFaultError{Finding: pluginhost.Finding{Finding: detector.Finding{Action: detector.ActionDrainNode}}}), Drain},
		{"GPU restart", gpuFault(&GPUFaultError{Action: health.ActionRestartWorkers, Findings: []health.Finding{{GPU: 1}}}), Restart},
		{"GPU reset", gpuFault(&GPUFaultError{Action: health.ActionResetGPU, Findings: []health.Finding{{GPU: 1}}}), Drain},
		{"GPU drain", gpuFault(&GPUFaultError{Action: health.ActionDrainNode, Findings: []health.Finding{{GPU: 1}}}), Drain},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.f.Severity; got != tc.want {
				t.Errorf("severity: got %v, want %v", got, tc.want)
			}
		})
	}
}
