package stall

import (
	"cmp"
	"slices"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// A persistent straggler is a rank that holds the job back step after step
// by more than noise, at a cost worth a person's attention. With W ranks
// someone is always last: a balanced job makes each rank last about 1/W of
// the time, and the step's straggler by a few microseconds of jitter. So a
// rank is named only when all three hold over the window of recent steps
// (issue 16):
//
//   - significant: among the steps whose straggler made the others wait
//     longer than the job's noise band, it was that straggler more often
//     than chance allows: P(X >= k) < Alpha/W for X ~ Binomial(m, 1/W),
//     Bonferroni-corrected for the W ranks tested;
//   - beyond noise: the noise band is NoiseK robust standard deviations
//     (median absolute deviation) of the job's own step times, at least
//     1 ms; only waits above it count;
//   - costly: the waits it caused add up to at least Cost of step time.
//
// Warm-up steps and the steps around a bucket rebuild (the layout changed:
// other buckets, other timings) are left out. A rank named stays named
// until its cost falls below half the bar or it is no longer late more
// often than chance (hysteresis), so logs do not flap.

// Defaults of the persistent straggler test.
const (
	DefaultStragglerSteps = 40
	DefaultAlpha          = 0.01
	DefaultNoiseK         = 3
	DefaultCost           = 0.05
	DefaultWarmupSteps    = 5
)

const (
	// minStragglerSteps: fewer steps than this are not judged. With 2
	// ranks, 8 significant steps out of 8 is the least that passes
	// Alpha/W = 0.005 (0.5^8 = 0.0039).
	minStragglerSteps = 8
	// rebuildSteps: steps left out from a change of the bucket layout on.
	rebuildSteps = 2
	// minNoise: the noise band is never narrower than this.
	minNoise = time.Millisecond
)

// stepObs is what the test keeps of one step of the generation.
type stepObs struct {
	start       time.Time             // earliest arrival among its collectives
	collectives int                   // complete collectives seen
	bytes       uint64                // their sizes: the bucket layout's signature
	cost        map[int]time.Duration // rank → the longest it alone made the others wait
	phases                            // each rank's last arrival and end (phases.go)
}

// stepLog keeps the last steps of a generation and the ranks named.
type stepLog struct {
	size  int // steps kept
	steps map[uint64]*stepObs
	first uint64 // the first step seen in the generation
	seen  bool
	named map[int]bool
	// marks holds the ranks' forward starts by step (phases.go).
	marks map[uint64][]time.Time
	// sigma is the robust standard deviation of the job's step times, 0
	// until enough steps were seen; recomputed at each new step. A stall
	// within a few of it cost the job nothing it would notice.
	sigma time.Duration
}

func newStepLog(window int) stepLog {
	size := window + 2*rebuildSteps + 2
	return stepLog{size: size, steps: make(map[uint64]*stepObs, size+1), named: map[int]bool{}, marks: map[uint64][]time.Time{}}
}

// observe records a complete collective of step: its first arrival, its
// size, the rank that arrived last with how long after the others, and
// each rank's arrival and end (recs, by rank).
func (l *stepLog) observe(step uint64, first time.Time, bytes uint64, last int, late time.Duration, recs []telemetry.Record) {
	if !l.seen || step < l.first {
		l.first, l.seen = step, true
	}
	o := l.steps[step]
	if o == nil {
		if len(l.steps) >= l.size {
			lowest := step
			for s := range l.steps {
				lowest = min(lowest, s)
			}
			if lowest == step {
				return // older than every step kept
			}
			delete(l.steps, lowest)
			l.pruneMarks(lowest)
		}
		o = &stepObs{start: first, cost: map[int]time.Duration{}, phases: newPhases(len(recs))}
		l.steps[step] = o
		l.sigma = l.stepSigma()
	}
	o.phases.observe(recs)
	if first.Before(o.start) {
		o.start = first
	}
	o.collectives++
	o.bytes += bytes
	if late > o.cost[last] {
		o.cost[last] = late
	}
}

// stepSigma is the robust standard deviation of the step times between the
// consecutive steps kept, the newest left out (it may be incomplete); 0
// with fewer than minStragglerSteps/2 of them.
func (l *stepLog) stepSigma() time.Duration {
	nums := l.sorted()
	if len(nums) > 0 {
		nums = nums[:len(nums)-1]
	}
	kept := make([]step, len(nums))
	for i, n := range nums {
		kept[i] = step{n: n, obs: l.steps[n]}
	}
	times := stepTimes(kept)
	if len(times) < minStragglerSteps/2 {
		return 0
	}
	_, sigma := spread(times)
	return sigma
}

// sorted returns the numbers of the steps kept, in order.
func (l *stepLog) sorted() []uint64 {
	nums := make([]uint64, 0, len(l.steps))
	for s := range l.steps {
		nums = append(nums, s)
	}
	slices.Sort(nums)
	return nums
}

// stepTimes returns, sorted, the times between the consecutive steps of
// steps (in step order): a step's time is from its first arrival to the
// next step's.
func stepTimes(steps []step) []time.Duration {
	var times []time.Duration
	for i := 1; i < len(steps); i++ {
		if steps[i].n == steps[i-1].n+1 {
			times = append(times, steps[i].obs.start.Sub(steps[i-1].obs.start))
		}
	}
	slices.Sort(times)
	return times
}

// stragglerParams are the test's knobs, from Config.
type stragglerParams struct {
	world  int
	window int
	alpha  float64
	noiseK float64
	cost   float64
	warmup int
}

// judge runs the test over the kept steps and updates the named ranks.
func (l *stepLog) judge(p stragglerParams) []telemetry.Straggler {
	window := eligible(l.steps, l.sorted(), l.first, p.warmup, p.window)
	for i := range window {
		window[i].prev = l.steps[window[i].n-1]
		window[i].marks = l.marks[window[i].n]
	}
	passed, _ := decide(window, p, l.named)
	var out []telemetry.Straggler
	named := map[int]bool{}
	for _, st := range passed {
		if l.named[st.Rank] || inBothHalves(window, p, st) {
			out = append(out, st)
			named[st.Rank] = true
		}
	}
	l.named = named
	return out
}

// halfMinLate is how many steps of each half of the window a rank must
// have held back (inBothHalves).
const halfMinLate = 6

// inBothHalves reports whether st's rank, which passes the test over
// window, held the others back throughout it: in each half of the window
// on its own, it was the straggler (beyond st's noise band) of at least
// halfMinLate steps, more often than any other rank, and at the cost bar.
//
// The test is asked at every look, over a window that moves a step at a
// time, so a job asks it hundreds of times; a spell of 8 steps in which
// one rank of two happened to be late (a neighbour's process, a page
// cache flush) passed it (0.5^8 < 0.005), and a balanced job drew an
// alarm in 4 of 9 runs (issue 34). A spell must now straddle the halves
// with 6 steps on each side, one that is over fails the newer half, and a
// rank late in every step is still named by step 20.
func inBothHalves(window []step, p stragglerParams, st telemetry.Straggler) bool {
	mid := len(window) / 2
	for _, part := range [][]step{window[:mid], window[mid:]} {
		count := map[int]int{}
		var waited time.Duration
		for _, s := range part {
			rank, wait := stepStraggler(s)
			if rank < 0 || wait <= st.Noise {
				continue
			}
			count[rank]++
			if rank == st.Rank {
				waited += wait
			}
		}
		mine := count[st.Rank]
		if mine < halfMinLate || float64(waited)/float64(len(part))/float64(jobStep(part, st.Noise)) < p.cost {
			return false
		}
		for r, n := range count {
			if r != st.Rank && n >= mine {
				return false
			}
		}
	}
	return true
}

// jobStep is what a step of window costs the job, the waits included,
// against which a straggler's waits are a share: the median time between
// consecutive steps without their straggler's wait, plus the mean wait
// beyond noise per step. The median step alone leaves out the very steps
// a rank late in one step of three stretches (a share of 1.17 for 350 ms
// in 100 ms steps, which the status report refused); the mean step takes
// in a checkpoint's 30 s pause, and a rank late in every step was named
// no more. Never below a nanosecond.
func jobStep(window []step, noise time.Duration) time.Duration {
	var bases []time.Duration
	var waited time.Duration
	for i, s := range window {
		rank, wait := stepStraggler(s)
		if rank >= 0 && wait > noise {
			waited += wait
		}
		if i+1 < len(window) && window[i+1].n == s.n+1 {
			bases = append(bases, max(0, window[i+1].obs.start.Sub(s.obs.start)-wait))
		}
	}
	if len(window) == 0 {
		return 1
	}
	return max(1, medianOf(bases)+waited/time.Duration(len(window)))
}

// stepStraggler is the rank that made the others of step s wait the
// longest (the lowest rank on a tie), and that wait; -1 when none did.
func stepStraggler(s step) (rank int, wait time.Duration) {
	rank = -1
	for r, c := range s.obs.cost {
		if c > wait || c == wait && r < rank {
			rank, wait = r, c
		}
	}
	return rank, wait
}

// step is one step of the window: its number and what was kept of it,
// with the step before it (nil when not kept) and the ranks' forward
// starts (nil without marks), for the split into phases.
type step struct {
	n     uint64
	obs   *stepObs
	prev  *stepObs
	marks []time.Time
}

// eligible returns the last window steps of nums (sorted) that count:
// not the newest (its collectives may still be coming), not warm-up, and
// not within rebuildSteps of a change of the bucket layout.
func eligible(steps map[uint64]*stepObs, nums []uint64, first uint64, warmup, window int) []step {
	if len(nums) > 0 {
		nums = nums[:len(nums)-1]
	}
	var out []step
	skip := 0
	var prev *stepObs
	for _, n := range nums {
		o := steps[n]
		if prev != nil && (o.collectives != prev.collectives || o.bytes != prev.bytes) {
			skip = rebuildSteps
		}
		prev = o
		if skip > 0 {
			skip--
			continue
		}
		if n < first+uint64(warmup) {
			continue
		}
		out = append(out, step{n: n, obs: o})
	}
	if len(out) > window {
		out = out[len(out)-window:]
	}
	return out
}

// decide is the test itself, a pure function of the window: it returns the
// ranks named (the most costly first) and the new named set.
func decide(window []step, p stragglerParams, was map[int]bool) ([]telemetry.Straggler, map[int]bool) {
	named := map[int]bool{}
	if p.world < 2 || len(window) < minStragglerSteps {
		return nil, named
	}
	// Step times between consecutive steps of the window, and their noise.
	times := stepTimes(window)
	if len(times) < minStragglerSteps/2 {
		return nil, named
	}
	stepTime, sigma := spread(times)
	if stepTime <= 0 {
		return nil, named
	}
	noise := max(minNoise, time.Duration(p.noiseK*float64(sigma)))

	// The straggler of each step whose wait exceeded the noise band.
	significant := 0
	count := map[int]int{}
	waits := map[int][]time.Duration{}
	total := map[int]time.Duration{}
	splits := map[int][]split{}
	for _, s := range window {
		rank, wait := stepStraggler(s)
		if rank < 0 || wait <= noise {
			continue
		}
		significant++
		count[rank]++
		waits[rank] = append(waits[rank], wait)
		total[rank] += wait
		if sp, ok := excess(s, rank); ok {
			splits[rank] = append(splits[rank], sp)
		}
	}
	per := float64(jobStep(window, noise))
	var out []telemetry.Straggler
	for rank, k := range count {
		pv := binomTail(significant, k, 1/float64(p.world))
		share := min(1, float64(total[rank])/float64(len(window))/per)
		isNew := pv < p.alpha/float64(p.world) && share >= p.cost
		stays := was[rank] && pv < 0.5 && share >= p.cost/2
		if !isNew && !stays {
			continue
		}
		named[rank] = true
		st := telemetry.Straggler{
			Rank: rank, Last: k, Steps: len(window), Significant: significant,
			Late: medianOf(waits[rank]), StepTime: stepTime, Noise: noise, Share: share, P: pv,
		}
		st.Input, st.Compute, st.Comm, st.Phased = medianSplit(splits[rank])
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b telemetry.Straggler) int {
		return cmp.Or(cmp.Compare(b.Share, a.Share), cmp.Compare(a.Rank, b.Rank))
	})
	return out, named
}

// medianSplit is the median of each phase over sps, and how many.
func medianSplit(sps []split) (input, compute, comm time.Duration, n int) {
	if len(sps) == 0 {
		return 0, 0, 0, 0
	}
	in, cp, cm := make([]time.Duration, len(sps)), make([]time.Duration, len(sps)), make([]time.Duration, len(sps))
	for i, s := range sps {
		in[i], cp[i], cm[i] = s.input, s.compute, s.comm
	}
	return medianOf(in), medianOf(cp), medianOf(cm), len(sps)
}
