package export

import (
	"encoding/hex"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/otlptest"
)

func TestTraceID(t *testing.T) {
	a := TraceID(job, 1, 2)
	if a != TraceID(job, 1, 2) {
		t.Errorf("TraceID is not deterministic")
	}
	for _, b := range [][16]byte{TraceID(job, 2, 1), TraceID(job, 1, 3), TraceID("job-2", 1, 2)} {
		if a == b {
			t.Errorf("two steps with trace id %x", a)
		}
	}
	for _, ratio := range []float64{0, 0.1, 0.5, 1} {
		n := 0
		const steps = 20000
		for s := range uint64(steps) {
			if sampled(TraceID(job, 0, s), ratio) {
				n++
			}
		}
		if got := float64(n) / steps; math.Abs(got-ratio) > 0.02 {
			t.Errorf("ratio %v: kept %v of the steps", ratio, got)
		}
	}
}

// TestRunsGetTheirOwnTraces: two runs of one job id (torchrun's default
// "none", a fresh store's generations from 0 again) shared every trace
// id, and a trace viewer merged their steps. Each run's ids now differ,
// agents of one run agree on them, and without a run they are the job
// id's alone, as before.
func TestRunsGetTheirOwnTraces(t *testing.T) {
	cleanEnv(t)
	ids := map[string][]string{} // run -> the trace ids of its spans
	for _, run := range []string{"", "3f2a", "3f2a", "9c41"} {
		rcv := otlptest.Start(t)
		e := start(t, config(rcv.Addr(), 1))
		if run != "" {
			e.SetRun(run)
		}
		feed(e, 0)
		e.Fault(1, "worker 2 exited with code 1", true)
		e.Reformed(telemetry.Reform{Gen: 1, N: 1, Rank: 0, Step: 4, Resume: 4, Error: "RuntimeError: boom",
			Phases: []telemetry.ReformPhase{{Name: "abort", Took: time.Millisecond}}})
		shutdown(t, e)
		var got []string
		for _, sp := range rcv.Spans() {
			got = append(got, sp.TraceIDHex())
			// The roots say the run, for a trace search to keep to one.
			var want any // nothing without a run
			if run != "" {
				want = run
			}
			if len(sp.ParentSpanId) == 0 && sp.Attr("ddp.run") != want {
				t.Errorf("run %q: root span %q has ddp.run %v", run, sp.Name, sp.Attr("ddp.run"))
			}
			if step, ok := sp.Attr("ddp.step").(int64); ok && sp.Name != "re-formed in process" {
				want := TraceID(TraceJob(job, run), 0, uint64(step))
				if sp.TraceIDHex() != hex.EncodeToString(want[:]) {
					t.Errorf("run %q: span %q of step %d in trace %s, want %x", run, sp.Name, step, sp.TraceIDHex(), want)
				}
			}
		}
		slices.Sort(got)
		if prev, ok := ids[run]; ok && !slices.Equal(prev, got) {
			t.Errorf("run %q exported twice gave other trace ids", run)
		}
		ids[run] = got
	}
	for a, ga := range ids {
		for b, gb := range ids {
			if a < b && slices.ContainsFunc(ga, func(id string) bool { return slices.Contains(gb, id) }) {
				t.Errorf("runs %q and %q share a trace id", a, b)
			}
		}
	}
	if TraceJob(job, "") != job {
		t.Errorf("without a run the ids are no longer the job id's: %q", TraceJob(job, ""))
	}
}
