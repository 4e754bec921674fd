package stall

import (
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// Where a straggler's lateness comes from. A rank's last arrival in step k
// (the end of its backward pass: its last bucket is ready) is
//
//	arrive(k) = end(k-1) + input(k) + compute(k)
//
// where end(k-1) is when its previous step's last all-reduce finished,
// input(k) the time from there to the start of its forward (loading the
// batch, the optimizer step, whatever the loop does between steps), and
// compute(k) its forward and backward up to the last bucket. The hook
// marks each forward's start (Analyzer.Mark). The straggler's term minus
// the other ranks' median of the same term splits its lateness into the
// three; which one carries it names the cause (cause.go).

// phases is what a step keeps of each rank for the split.
// Times are Unix nanoseconds (0: none): observe runs for every collective
// and every rank, and comparing integers costs a fraction of comparing
// time.Times (the analyzer's throughput dropped by a tenth with them).
type phases struct {
	arrive []int64 // rank → its latest arrival in the step
	end    []int64 // rank → when its latest collective of the step finished
}

func newPhases(world int) phases {
	return phases{arrive: make([]int64, world), end: make([]int64, world)}
}

// observe takes a complete collective's records, by rank.
func (p *phases) observe(recs []telemetry.Record) {
	for r := range min(len(recs), len(p.arrive)) {
		if a := unixNano(recs[r].Arrive); a > p.arrive[r] {
			p.arrive[r] = a
		}
		if e := unixNano(recs[r].End); e > p.end[r] {
			p.end[r] = e
		}
	}
}

// unixNano is t in Unix nanoseconds, 0 for the zero time.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// maxMarkedSteps bounds the steps whose marks are held beyond those kept:
// marks of steps whose collectives never come (a forward without backward
// in evaluation, under DDP's no_sync) must not pile up.
const maxMarkedSteps = 16

// mark records that rank started a forward pass for step at t. The last
// mark of a step wins: an evaluation forward between two training steps
// is overwritten by the training forward that follows it.
func (l *stepLog) mark(step uint64, rank, world int, t time.Time) {
	m := l.marks[step]
	if m == nil {
		if len(l.marks) >= l.size+maxMarkedSteps {
			lowest := step
			for s := range l.marks {
				lowest = min(lowest, s)
			}
			if lowest == step {
				return
			}
			delete(l.marks, lowest)
		}
		m = make([]time.Time, world)
		l.marks[step] = m
	}
	m[rank] = t
}

// pruneMarks drops the marks of steps up to and including step, whose
// observations are gone.
func (l *stepLog) pruneMarks(step uint64) {
	for s := range l.marks {
		if s <= step {
			delete(l.marks, s)
		}
	}
}

// split is a rank's excess in each phase over the other ranks' median.
type split struct {
	input, compute, comm time.Duration
}

// excess splits rank's lateness in step s into its phases, against the
// median of the other ranks; false when a term is missing (no marks, the
// previous step not kept, a rank that did not report).
func excess(s step, rank int) (split, bool) {
	if s.prev == nil || s.marks == nil {
		return split{}, false
	}
	world := len(s.obs.arrive)
	if world < 2 || rank >= world || len(s.prev.end) != world || len(s.marks) != world {
		return split{}, false
	}
	ref := unixNano(s.obs.start)
	var mine split
	others := make([]split, 0, world-1)
	for r := range world {
		end, fwd, arrive := s.prev.end[r], unixNano(s.marks[r]), s.obs.arrive[r]
		if end == 0 || fwd == 0 || arrive == 0 {
			return split{}, false
		}
		sp := split{input: time.Duration(fwd - end), compute: time.Duration(arrive - fwd), comm: time.Duration(end - ref)}
		if r == rank {
			mine = sp
		} else {
			others = append(others, sp)
		}
	}
	med := func(f func(split) time.Duration) time.Duration {
		ds := make([]time.Duration, len(others))
		for i, o := range others {
			ds[i] = f(o)
		}
		return medianOf(ds)
	}
	return split{
		input:   mine.input - med(func(s split) time.Duration { return s.input }),
		compute: mine.compute - med(func(s split) time.Duration { return s.compute }),
		comm:    mine.comm - med(func(s split) time.Duration { return s.comm }),
	}, true
}
