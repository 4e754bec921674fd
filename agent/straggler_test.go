package agent

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/fault"
	"github.com/ddp-agent/ddp-agent/agent/straggler"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// TestStragglerFault: a restart for a confirmed straggler is a fault from
// the straggler, of its generation, that restarts the job, its reason the
// straggler's finding.
func TestStragglerFault(t *testing.T) {
	se := &straggler.Error{Straggler: telemetry.Straggler{Rank: 1, Share: 0.1, Cause: telemetry.CauseCompute,
		Evidence: "forward and backward take 120ms longer"}, Confirm: 3 * time.Second, Action: straggler.ActionRestart}
	f := fault.Straggler(7, time.Unix(1_700_000_000, 0), se)
	if got, ok := f.Err.(*straggler.Error); f.Source != fault.FromStraggler || f.Gen != 7 || !f.RestartsJob() || !ok || got != se {
		t.Errorf("fault %+v, want one from the straggler, of generation 7, that restarts the job", f)
	}
	for _, want := range []string{"rank 1", "cause compute", "forward and backward take 120ms longer"} {
		if !strings.Contains(f.Reason, want) {
			t.Errorf("reason %q lacks %q", f.Reason, want)
		}
	}
}

// TestDrainCause: a drain for a straggler ends the run as drained, as a
// GPU fault that drains does, and wins over the job's failure; its other
// actions never drain. (It checked drainCause and drainOr on the run's
// context; the drain is now the fault's severity, and recover's decide
// makes it win.)
func TestDrainCause(t *testing.T) {
	for _, tc := range []struct {
		action straggler.Action
		drains bool
	}{{straggler.ActionDrain, true}, {straggler.ActionRestart, false}} {
		se := &straggler.Error{Straggler: telemetry.Straggler{Rank: 1, Cause: telemetry.CauseGPU}, Confirm: time.Minute, Action: tc.action}
		f := fault.Straggler(2, time.Now(), se)
		if got := decide(f.Severity, true, false) == actDrain; got != tc.drains {
			t.Errorf("%s: drains: got %v, want %v", tc.action, got, tc.drains)
		}
		if got := decide(fault.Restart, false, f.Severity == fault.Drain); tc.drains && got != actDrain {
			t.Errorf("%s: a failed job with the drain queued: got %v, want %v", tc.action, got, actDrain)
		}
		if err := (&fault.Error{Severity: f.Severity, Err: f.Err}); tc.drains && !errors.Is(err, se) {
			t.Errorf("fault.Error %v does not wrap the straggler", err)
		}
	}
	if got := (&straggler.Error{Straggler: telemetry.Straggler{Rank: 3}, Confirm: 90 * time.Second, Action: straggler.ActionDrain}).Error(); got !=
		"persistent straggler rank 3 confirmed for 90s (cause unknown); --straggler-action drain: this node leaves the job" {
		t.Errorf("Error: %q", got)
	}
}

// TestStragglerConfigCheck: a caller of package agent cannot pass an
// action the agent does not know.
func TestStragglerConfigCheck(t *testing.T) {
	ok := Config{Command: []string{"python3", "t.py"}, NProcPerNode: 1, Rendezvous: Rendezvous{NNodesMin: 1, NNodesMax: 1}}
	for _, tc := range []struct {
		tel Telemetry
		bad bool
	}{
		{Telemetry{}, false},
		{Telemetry{StragglerAction: straggler.ActionDrain, StragglerConfirm: time.Second}, false},
		{Telemetry{StragglerAction: "reboot"}, true},
		{Telemetry{StragglerConfirm: -time.Second}, true},
	} {
		c := ok
		c.Telemetry = tc.tel
		if err := c.check(); (err != nil) != tc.bad {
			t.Errorf("%+v: check %v, want an error: %v", tc.tel, err, tc.bad)
		}
	}
}
