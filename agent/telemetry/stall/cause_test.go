package stall

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// phasedJob feeds a job whose ranks mark their forward starts: each step
// every rank finishes the previous all-reduce at the same time (plus
// commLate for the slow one), spends input then compute, and arrives with
// its two buckets; the slow rank adds slowInput and slowCompute. Jitter of
// up to 1 ms, seeded, on everything. It returns the analyzer after steps.
func phasedJob(t *testing.T, world, slow, steps int, slowInput, slowCompute, commLate time.Duration, marks bool) *Analyzer {
	t.Helper()
	a := newAnalyzer(t, Config{WorldSize: world})
	rng := rand.New(rand.NewPCG(7, uint64(world)))
	jitter := func() time.Duration { return time.Duration(rng.Int64N(int64(time.Millisecond))) }
	const input, compute, comm = 20 * time.Millisecond, 300 * time.Millisecond, 30 * time.Millisecond
	ends := make([]time.Time, world) // when each rank's previous all-reduce ended
	for r := range ends {
		ends[r] = time.Unix(1_700_000_000, 0)
	}
	for step := range steps {
		arrive := make([]time.Time, world)
		var last time.Time
		for r := range world {
			start := ends[r].Add(jitter())
			fwd := start.Add(input + jitter())
			arr := fwd.Add(compute + jitter())
			if r == slow {
				fwd = fwd.Add(slowInput)
				arr = arr.Add(slowInput + slowCompute)
			}
			if marks {
				a.Mark(0, r, uint64(step), fwd)
			}
			arrive[r] = arr
			if arr.After(last) {
				last = arr
			}
		}
		for r := range world {
			ends[r] = last.Add(comm + jitter())
			if r == slow {
				ends[r] = ends[r].Add(commLate)
			}
		}
		for b := range 2 {
			for r := range world {
				at := arrive[r].Add(time.Duration(b-1) * 50 * time.Millisecond)
				a.Add(telemetry.Record{Step: uint64(step), Bucket: uint32(b), Rank: r, Bytes: 1 << 20,
					Arrive: at, Start: at, End: ends[r]})
			}
		}
	}
	return a
}

// TestPhasesSplitLateness: the straggler's lateness lands in the phase
// where it was injected, within the jitter, and the cause follows.
func TestPhasesSplitLateness(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		world                  int
		input, compute, comm   time.Duration
		marks                  bool
		wantCause              telemetry.Cause
		wantIn, wantCp, wantCm time.Duration
	}{
		{name: "input, 2 ranks", world: 2, input: 60 * time.Millisecond, marks: true, wantCause: telemetry.CauseInput, wantIn: 60 * time.Millisecond},
		{name: "input, 4 ranks", world: 4, input: 40 * time.Millisecond, marks: true, wantCause: telemetry.CauseInput, wantIn: 40 * time.Millisecond},
		{name: "compute, 3 ranks", world: 3, compute: 50 * time.Millisecond, marks: true, wantCause: telemetry.CauseCompute, wantCp: 50 * time.Millisecond},
		{name: "previous all-reduce ends late", world: 2, comm: 50 * time.Millisecond, marks: true, wantCause: telemetry.CauseNetwork, wantCm: 50 * time.Millisecond},
		{name: "half input, half compute: no guess", world: 2, input: 30 * time.Millisecond, compute: 30 * time.Millisecond, marks: true,
			wantCause: telemetry.CauseUnknown, wantIn: 30 * time.Millisecond, wantCp: 30 * time.Millisecond},
		{name: "no marks", world: 2, compute: 60 * time.Millisecond, wantCause: telemetry.CauseUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := phasedJob(t, tc.world, 1, 40, tc.input, tc.compute, tc.comm, tc.marks)
			sts := a.Stragglers()
			if len(sts) != 1 || sts[0].Rank != 1 {
				t.Fatalf("stragglers %+v, want rank 1 alone", sts)
			}
			st := sts[0]
			if !tc.marks {
				if st.Phased != 0 {
					t.Errorf("Phased %d without marks", st.Phased)
				}
			} else {
				if st.Phased < minStragglerSteps {
					t.Errorf("Phased %d, want >= %d", st.Phased, minStragglerSteps)
				}
				for _, p := range []struct {
					name      string
					got, want time.Duration
				}{{"input", st.Input, tc.wantIn}, {"compute", st.Compute, tc.wantCp}, {"comm", st.Comm, tc.wantCm}} {
					if d := p.got - p.want; d > 2*time.Millisecond || d < -2*time.Millisecond {
						t.Errorf("%s excess %v, want %v ± 2ms", p.name, p.got, p.want)
					}
				}
			}
			if c, ev := Explain(st, "", ""); c != tc.wantCause {
				t.Errorf("cause %s (%s), want %s", c, ev, tc.wantCause)
			}
		})
	}
}

// TestExplain: a slow compute phase is the GPU's when NVML shows a
// slowdown, the host's when its threads wait for a CPU (the GPU first),
// else compute; input and network keep their cause whatever the evidence.
func TestExplain(t *testing.T) {
	st := func(in, cp, cm time.Duration, phased int) telemetry.Straggler {
		return telemetry.Straggler{Late: 50 * time.Millisecond, Input: in, Compute: cp, Comm: cm, Phased: phased}
	}
	ms := time.Millisecond
	for _, tc := range []struct {
		name      string
		st        telemetry.Straggler
		gpu, host string
		want      telemetry.Cause
		evidence  string
	}{
		{"compute", st(0, 50*ms, 0, 20), "", "", telemetry.CauseCompute, "forward and backward take 50ms longer while its input time does not grow"},
		{"gpu", st(0, 50*ms, 0, 20), "throttled: hw slowdown", "waited", telemetry.CauseGPU, "its GPU is slowed: throttled: hw slowdown"},
		{"host", st(0, 50*ms, 0, 20), "", "its threads waited for a CPU 40% of the time", telemetry.CauseHost, "its host is contended: its threads waited"},
		{"input despite a throttled GPU", st(48*ms, ms, 0, 20), "throttled: hw slowdown", "", telemetry.CauseInput, "it starts forward 48ms after the others"},
		{"network", st(0, 0, 45*ms, 20), "", "", telemetry.CauseNetwork, "its all-reduces finish 45ms after the others'"},
		{"too small to explain", st(10*ms, 12*ms, 0, 20), "", "", telemetry.CauseUnknown, "no phase explains its lateness of 50ms"},
		{"nothing positive", st(-ms, -ms, -ms, 20), "", "", telemetry.CauseUnknown, "no phase explains"},
		{"no marks, GPU slowed", st(0, 0, 0, 0), "throttled: sw power cap", "", telemetry.CauseGPU, "phases unknown"},
		{"no marks, nothing", st(0, 0, 0, 0), "", "", telemetry.CauseUnknown, "forward starts not marked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, ev := Explain(tc.st, tc.gpu, tc.host)
			if c != tc.want || !strings.Contains(ev, tc.evidence) {
				t.Errorf("got %s: %q; want %s with %q", c, ev, tc.want, tc.evidence)
			}
		})
	}
}

// TestMarksBounded: marks of steps that never complete (forward without
// backward) do not pile up.
func TestMarksBounded(t *testing.T) {
	a := newAnalyzer(t, Config{WorldSize: 2})
	at := time.Unix(1_700_000_000, 0)
	for step := range uint64(10_000) {
		a.Mark(0, 0, step, at)
	}
	if n, limit := len(a.steps.marks), a.steps.size+maxMarkedSteps; n > limit {
		t.Errorf("%d steps of marks held, want <= %d", n, limit)
	}
	a.Mark(0, 5, 1, at) // out of range: ignored, counted
	if a.Stats().BadRank != 1 {
		t.Errorf("stats %+v, want one bad rank", a.Stats())
	}
}
