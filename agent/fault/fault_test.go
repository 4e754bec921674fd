package fault

import (
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/pluginhost"
	"github.com/ddp-agent/ddp-agent/agent/rootcause"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/watch"
	"github.com/ddp-agent/ddp-agent/nvml/health"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

// TestFaultStale: a fault belongs to the attempt of its generation; a GPU
// fault, whose watcher knows no generations, to the attempt that was
// running when its newest finding was seen.
func TestFaultStale(t *testing.T) {
	started := time.Unix(1_700_000_000, 0)
	gpu := func(last time.Time) *Fault {
		gf := &GPUError{Action: health.ActionRestartWorkers, Findings: []health.Finding{{GPU: 1, Last: last}}}
		return GPU(gf)
	}
	tests := []struct {
		name string
		f    *Fault
		want bool
	}{
		{"worker of this generation", Worker(4, &WorkerFailedError{Blame: rootcause.Blame{Root: 1, Exit: &supervisor.WorkerExitError{Rank: 1, Code: 1}}}), false},
		{"hang of this generation", Hang(&watch.HangError{Hang: telemetry.Hang{Key: telemetry.Key{Gen: 4}}}), false},
		{"hang of the last generation", Hang(&watch.HangError{Hang: telemetry.Hang{Key: telemetry.Key{Gen: 3}}}), true},
		{"round of the last generation", Round(3, "node b left"), true},
		{"GPU finding after the start", gpu(started.Add(time.Millisecond)), false},
		{"GPU finding before the start", gpu(started.Add(-time.Millisecond)), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.f.Stale(4, started); got != tc.want {
				t.Errorf("stale: got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestFaultQueue: take skips stale faults (handing them to drop) and
// returns the first of the attempt; a GPU fault takes the place of one
// still waiting, with its findings.
func TestFaultQueue(t *testing.T) {
	started := time.Now()
	q := NewQueue()
	q.Report(Hang(&watch.HangError{Hang: telemetry.Hang{Key: telemetry.Key{Gen: 1}, Missing: []int{0}}}))
	old := &GPUError{Action: health.ActionRestartWorkers, Findings: []health.Finding{{GPU: 0, UUID: "GPU-0", Message: "Xid 31", Last: started.Add(-time.Second)}}}
	q.Report(GPU(old))
	fresh := &GPUError{Action: health.ActionRestartWorkers, Findings: []health.Finding{{GPU: 1, UUID: "GPU-1", Message: "Xid 31", Last: started.Add(time.Second)}}}
	q.Report(GPU(fresh))
	select {
	case <-q.Ready():
	default:
		t.Fatal("queue not ready after report")
	}
	var dropped []*Fault
	f := q.Take(2, started, func(f *Fault) { dropped = append(dropped, f) })
	if f == nil || f.Source != FromGPU {
		t.Fatalf("took %+v, want the fresh GPU fault", f)
	}
	if len(dropped) != 1 || dropped[0].Source != FromHang {
		t.Errorf("dropped %d faults, want the last generation's hang", len(dropped))
	}
	if want := "GPU 1 (GPU-1): Xid 31, and 1 more finding(s)"; f.Reason != want {
		t.Errorf("reason %q, want %q", f.Reason, want)
	}
	if got := q.Take(2, started, func(*Fault) {}); got != nil {
		t.Errorf("second take: %+v, want nothing", got)
	}
	q.Report(Round(2, "node b left"))
	q.Clear()
	if got := q.Take(2, started, func(*Fault) {}); got != nil {
		t.Errorf("take after clear: %+v, want nothing", got)
	}
}

// TestFaultRestartsJob: only a round that ended is not this node's
func TestFaultRestartsJob(t *testing.T) {
	gf := &GPUError{Action: health.ActionRestartWorkers, Findings: []health.Finding{{GPU: 0}}}
	for _, f := range []*Fault{Worker(0, &WorkerFailedError{}), Hang(&watch.HangError{}), GPU(gf)} {
		if !f.RestartsJob() {
			t.Errorf("source %d: does not restart the job", f.Source)
		}
	}
	if Round(0, "x").RestartsJob() {
		t.Error("a round that ended restarts the job")
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
		{"worker", Worker(1, &WorkerFailedError{}), Restart},
		{"round", Round(1, "node b left"), NewGeneration},
		{"plugin restart", Plugin(&PluginError{}), Restart},
		{"plugin drain", Plugin(&PluginError{Finding: pluginhost.Finding{Finding: detector.Finding{Action: detector.ActionDrainNode}}}), Drain},
		{"GPU restart", GPU(&GPUError{Action: health.ActionRestartWorkers, Findings: []health.Finding{{GPU: 1}}}), Restart},
		{"GPU reset", GPU(&GPUError{Action: health.ActionResetGPU, Findings: []health.Finding{{GPU: 1}}}), Drain},
		{"GPU drain", GPU(&GPUError{Action: health.ActionDrainNode, Findings: []health.Finding{{GPU: 1}}}), Drain},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.f.Severity; got != tc.want {
				t.Errorf("severity: got %v, want %v", got, tc.want)
			}
		})
	}
}
