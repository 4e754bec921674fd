package agent

import (
	"testing"

	"github.com/ddp-agent/ddp-agent/agent/fault"
)

// TestDecide: recover's decision, from a fault's severity, whether the
// rendezvous left the job restarts, and whether a drain of this node is
// queued behind the fault.
func TestDecide(t *testing.T) {
	tests := []struct {
		name         string
		sev          fault.Severity
		restartsLeft bool
		drainPending bool
		want         action
	}{
		{"round ended", fault.NewGeneration, true, false, actNewGeneration},
		{"round ended, no restarts left (not charged)", fault.NewGeneration, false, false, actNewGeneration},
		{"round ended, drain queued", fault.NewGeneration, true, true, actDrain},
		{"this node's fault", fault.Restart, true, false, actRestart},
		{"this node's fault, no restarts left", fault.Restart, false, false, actFail},
		{"this node's fault, drain queued", fault.Restart, true, true, actDrain},
		{"worker killed by a GPU that fell off, no restarts left", fault.Restart, false, true, actDrain},
		{"drain", fault.Drain, true, false, actDrain},
		{"drain, no restarts left", fault.Drain, false, false, actDrain},
		{"job failed", fault.Fail, true, false, actFail},
		{"job failed, drain queued", fault.Fail, false, true, actDrain},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := decide(tc.sev, tc.restartsLeft, tc.drainPending); got != tc.want {
				t.Errorf("decide(%v, %v, %v): got %v, want %v", tc.sev, tc.restartsLeft, tc.drainPending, got, tc.want)
			}
		})
	}
}
