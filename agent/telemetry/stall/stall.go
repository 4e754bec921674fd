// Package stall finds slow and hung collectives in the workers' telemetry.
// An Analyzer joins the per-rank records of each DDP bucket all-reduce into
// a telemetry.Collective, judges its duration against the bucket's own
// recent distribution, names the rank that made the others wait, names the
// ranks that hold the job back step after step (straggler.go), and reports
// the oldest collective that never completed. It does no I/O and reads no clock: callers pass the records
// and, for hangs, the time.
package stall

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// Defaults for the zero fields of Config.
const (
	DefaultFloor      = 100 * time.Millisecond
	DefaultK          = 6
	DefaultWindow     = 50
	DefaultMinSamples = 10
	DefaultMaxPending = 4096
)

const (
	// earlyFactor: before a bucket has MinSamples durations, a collective
	// is a stall only above earlyFactor × Floor and with a clear straggler,
	// so that the first slow steps of a job are not missed while the first
	// collective (which pays for NCCL's lazy communicator setup on every
	// rank) is not blamed on anyone.
	earlyFactor = 10

	// minRatio: a stall takes at least this many times the bucket's median,
	// whatever its spread. A bucket whose durations barely vary (a MAD of
	// zero) would otherwise call any microsecond over the median a stall.
	minRatio = 2
)

// Config tunes an Analyzer. Zero fields take the defaults above; only
// WorldSize is required.
type Config struct {
	WorldSize int // ranks in the generation (required, > 0)

	// A collective is a stall when it is slower than Floor, than minRatio
	// times the median of its bucket's last Window durations, and than
	// that median plus K robust standard deviations (1.4826 × the median
	// absolute deviation) of those durations and of the job's step times,
	// once the bucket has MinSamples of them: judged against the bucket's
	// own distribution, so a big bucket that always takes 130 ms is not a
	// stall at 141 ms, and against the job's noise, so a hiccup smaller
	// than step times vary anyway is not one either.
	Floor      time.Duration
	K          float64 // >= 1
	Window     int
	MinSamples int // <= Window; default min(DefaultMinSamples, Window)

	// The persistent straggler test (straggler.go) looks at the last
	// StragglerSteps steps after WarmupSteps: a rank is named when it is
	// the straggler of the steps beyond NoiseK robust standard deviations
	// of step time more often than chance (P < Alpha / WorldSize), and the
	// waits it causes cost at least Cost of step time.
	StragglerSteps int
	WarmupSteps    int     // < 0: none
	Alpha          float64 // in (0, 1)
	NoiseK         float64 // >= 0
	Cost           float64 // in (0, 1)

	// MaxPending bounds the incomplete collectives kept (lost records
	// leave collectives that never complete); beyond it the oldest are
	// dropped and counted. It also bounds how many completed collectives
	// are remembered so that their late records are recognised.
	MaxPending int
}

// withDefaults fills the zero fields and checks the result.
func (c Config) withDefaults() (Config, error) {
	if c.WorldSize <= 0 {
		return c, fmt.Errorf("stall config: WorldSize %d, want > 0", c.WorldSize)
	}
	if c.Floor == 0 {
		c.Floor = DefaultFloor
	}
	if c.K == 0 {
		c.K = DefaultK
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.MinSamples == 0 {
		c.MinSamples = min(DefaultMinSamples, c.Window)
	}
	if c.StragglerSteps == 0 {
		c.StragglerSteps = DefaultStragglerSteps
	}
	switch {
	case c.WarmupSteps == 0:
		c.WarmupSteps = DefaultWarmupSteps
	case c.WarmupSteps < 0:
		c.WarmupSteps = 0
	}
	if c.Alpha == 0 {
		c.Alpha = DefaultAlpha
	}
	if c.NoiseK == 0 {
		c.NoiseK = DefaultNoiseK
	}
	if c.Cost == 0 {
		c.Cost = DefaultCost
	}
	if c.MaxPending == 0 {
		c.MaxPending = DefaultMaxPending
	}
	switch {
	case c.Floor < 0:
		return c, fmt.Errorf("stall config: Floor %v, want >= 0", c.Floor)
	case math.IsNaN(c.K) || math.IsInf(c.K, 0) || c.K < 1:
		return c, fmt.Errorf("stall config: K %v, want a finite number >= 1", c.K)
	case c.Window < 0:
		return c, fmt.Errorf("stall config: Window %d, want > 0", c.Window)
	case c.MinSamples < 0 || c.MinSamples > c.Window:
		// The window never holds more than Window durations, so a larger
		// MinSamples would never judge anything.
		return c, fmt.Errorf("stall config: MinSamples %d, want 1..Window (%d)", c.MinSamples, c.Window)
	case c.StragglerSteps < 0:
		return c, fmt.Errorf("stall config: StragglerSteps %d, want > 0", c.StragglerSteps)
	case math.IsNaN(c.Alpha) || c.Alpha <= 0 || c.Alpha >= 1:
		return c, fmt.Errorf("stall config: Alpha %v, want in (0, 1)", c.Alpha)
	case math.IsNaN(c.NoiseK) || math.IsInf(c.NoiseK, 0) || c.NoiseK < 0:
		return c, fmt.Errorf("stall config: NoiseK %v, want a finite number >= 0", c.NoiseK)
	case math.IsNaN(c.Cost) || c.Cost <= 0 || c.Cost >= 1:
		return c, fmt.Errorf("stall config: Cost %v, want in (0, 1)", c.Cost)
	case c.MaxPending < 0:
		return c, fmt.Errorf("stall config: MaxPending %d, want > 0", c.MaxPending)
	}
	return c, nil
}

// Stats are cumulative counters for logs and metrics; they survive
// generation changes, so they can be exported as monotonic counters.
type Stats struct {
	Gen      uint64 // the current generation
	Records  uint64 // records accepted, in-flight ones included
	Complete uint64 // collectives completed
	Stalls   uint64 // of which stalls
	Pending  int    // incomplete collectives held now
	Dropped  uint64 // incomplete collectives dropped beyond MaxPending

	// Records ignored, by reason.
	OtherGen  uint64 // from a generation older than the current one
	BadRank   uint64 // rank outside 0..WorldSize-1
	Duplicate uint64 // a second final record of a rank for a collective
	Stale     uint64 // for a collective already completed or dropped
}

// Analyzer joins records into collectives and judges them. All its
// methods are safe for concurrent use; it owns nothing the caller passes
// in, and the collectives it returns belong to the caller.
type Analyzer struct {
	cfg Config

	mu      sync.Mutex
	started bool // a generation has been seen or set
	gen     uint64
	seq     uint64 // creation order of pending collectives
	pending map[telemetry.Key]*pending
	done    recent
	buckets map[shape]*window
	steps   stepLog
	stats   Stats
}

// shape is what a collective's durations are compared within: the same
// bucket of the same size. DDP's buckets keep their sizes (but for its one
// rebuild after the first step); a job that all-reduces other sizes under
// one bucket index (a benchmark sweeping 64 KiB to 256 MiB) must not have
// its big collectives judged by its small ones.
type shape struct {
	bucket uint32
	bytes  uint64
}

// maxShapes bounds the windows kept: DDP has tens of buckets.
const maxShapes = 1024

// rankState is what a pending collective holds for one rank.
type rankState uint8

const (
	absent rankState = iota
	inFlight
	final
)

// pending is a collective that not every rank has finished.
type pending struct {
	seq    uint64             // creation order, to drop the oldest
	recs   []telemetry.Record // by rank; becomes Collective.Records
	state  []rankState        // by rank
	finals int                // ranks with a final record
	first  time.Time          // earliest non-zero arrival so far
}

// New returns an Analyzer for cfg, after filling its defaults; it fails
// when a field is out of range.
func New(cfg Config) (*Analyzer, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	a := &Analyzer{cfg: cfg}
	a.clear()
	return a, nil
}

// clear drops everything held for the current generation.
func (a *Analyzer) clear() {
	a.pending = make(map[telemetry.Key]*pending)
	a.done = newRecent(a.cfg.MaxPending)
	// Bucket durations and straggler history start afresh: a new
	// generation may have another world size, other hosts, other buckets.
	a.buckets = make(map[shape]*window)
	a.steps = newStepLog(a.cfg.StragglerSteps)
}

// Reset starts generation gen when it is newer than the current one (or
// none has been seen), dropping the pending collectives, the bucket
// durations and the straggler history. It does nothing otherwise: records
// of gen that came before the call have already started it and are kept,
// and generations never go back.
func (a *Analyzer) Reset(gen uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.resetLocked(gen)
}

func (a *Analyzer) resetLocked(gen uint64) {
	if a.started && gen <= a.gen {
		return
	}
	a.started, a.gen = true, gen
	a.stats.Gen = gen
	a.clear()
}

// Abandon drops the incomplete collectives, as done, keeping the
// generation and its history: their ranks re-formed in process around the
// one that never arrived, and their late records are stale. The new
// communicators number their steps on from the old ones'.
func (a *Analyzer) Abandon() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k := range a.pending {
		a.done.add(k)
	}
	clear(a.pending)
}

// Add takes one record, in any order relative to the others, and returns
// the collective it completed, if any: at most one, with its records in
// rank order and Stall set when it was slow. An in-flight record only
// marks the rank's arrival, for Hang; the rank's final record replaces it.
// A record of a newer generation starts that generation (see Reset).
// Records of older generations, of ranks out of range, duplicate final
// records and records of collectives already completed or dropped are
// ignored and counted in Stats.
func (a *Analyzer) Add(r telemetry.Record) []telemetry.Collective {
	a.mu.Lock()
	defer a.mu.Unlock()

	// The rank first, so that a malformed record cannot start a generation.
	if r.Rank < 0 || r.Rank >= a.cfg.WorldSize {
		a.stats.BadRank++
		return nil
	}
	if !a.started || r.Gen > a.gen {
		a.resetLocked(r.Gen)
	}
	if r.Gen < a.gen {
		a.stats.OtherGen++
		return nil
	}
	k := r.Key()
	p := a.pending[k]
	if p == nil {
		if a.done.has(k) {
			a.stats.Stale++
			return nil
		}
		p = a.open(k)
	}

	st := p.state[r.Rank]
	if st == final && r.Done() {
		a.stats.Duplicate++ // the first final record stands
		return nil
	}
	if st != absent && !r.Done() {
		// A repeated in-flight report, or one overtaken by the final
		// record: the rank has already arrived, nothing to learn.
		a.stats.Records++
		return nil
	}
	a.stats.Records++
	p.recs[r.Rank] = r
	if !r.Arrive.IsZero() && (p.first.IsZero() || r.Arrive.Before(p.first)) {
		p.first = r.Arrive
	}
	if !r.Done() {
		p.state[r.Rank] = inFlight
		return nil
	}
	p.state[r.Rank] = final
	p.finals++
	if p.finals < a.cfg.WorldSize {
		return nil
	}
	delete(a.pending, k)
	a.done.add(k)
	return []telemetry.Collective{a.judge(k, p.recs, p.first)}
}

// open starts a pending collective for k, dropping the oldest one when
// MaxPending are held already.
func (a *Analyzer) open(k telemetry.Key) *pending {
	if len(a.pending) >= a.cfg.MaxPending {
		// A linear scan: this only happens when records are being lost,
		// and MaxPending is a few thousand.
		var oldest telemetry.Key
		var seq uint64 = math.MaxUint64
		for pk, p := range a.pending {
			if p.seq < seq {
				oldest, seq = pk, p.seq
			}
		}
		delete(a.pending, oldest)
		a.done.add(oldest) // its stragglers' records are stale, not new collectives
		a.stats.Dropped++
	}
	a.seq++
	p := &pending{
		seq:   a.seq,
		recs:  make([]telemetry.Record, a.cfg.WorldSize),
		state: make([]rankState, a.cfg.WorldSize),
	}
	a.pending[k] = p
	return p
}

// judge builds the completed collective, decides whether it stalled, and
// feeds the bucket's window and the straggler history.
func (a *Analyzer) judge(k telemetry.Key, recs []telemetry.Record, first time.Time) telemetry.Collective {
	c := telemetry.Collective{Key: k, Bytes: recs[0].Bytes, DType: recs[0].DType, Records: recs}
	a.stats.Complete++

	sh := shape{bucket: k.Bucket, bytes: c.Bytes}
	w := a.buckets[sh]
	if w == nil {
		if len(a.buckets) >= maxShapes {
			clear(a.buckets) // a job whose every collective has another size: start afresh
		}
		w = newWindow(a.cfg.Window)
		a.buckets[sh] = w
	}
	d := c.Duration()
	median, sigma := spread(w.sorted)
	// Above the bucket's own spread, and by more than the job's step times
	// vary (as many robust standard deviations): a collective that much
	// slower cost the step time it would not otherwise have lost.
	threshold := max(a.cfg.Floor, minRatio*median, median+time.Duration(a.cfg.K*float64(max(sigma, a.steps.sigma))))
	samples := w.len()
	// The window gets the duration clipped at the threshold. Left out,
	// stalls would freeze the median: after a lasting slowdown (bigger
	// batches, a slower link) every collective would stall forever. Fed in
	// full, a run of stalls filling half the window would make the worst
	// of them the median at once (a 30s hang, then nothing under 90s is a
	// stall for a window), and while the window is still small one NCCL
	// setup of several seconds weighs on a two-sample median. Clipped, a
	// stall only says "above the threshold": occasional stalls leave the
	// median where it was, and a lasting slowdown raises it until it is the
	// new normal after about Window/2.
	w.add(min(d, threshold))

	if a.cfg.WorldSize == 1 {
		return c // nobody to wait for, nobody to blame
	}
	straggler, late, waited := blame(recs)
	a.steps.observe(k.Step, first, c.Bytes, straggler, late, recs)

	stalled := samples >= a.cfg.MinSamples && d > threshold
	if samples < a.cfg.MinSamples {
		threshold = earlyFactor * a.cfg.Floor
		// A clear straggler: it alone made most of the duration.
		stalled = d > threshold && late >= d/2
	}
	if stalled {
		a.stats.Stalls++
		c.Stall = &telemetry.Stall{
			Straggler: straggler,
			Late:      late,
			Waiters:   len(recs) - 1,
			Waited:    waited,
			Threshold: threshold,
			Median:    median,
		}
	}
	return c
}

// blame finds the rank that arrived last (the lowest on a tie), how long
// after the last of the others it came, and how long the others waited
// for it in all. recs has at least two records, indexed by rank.
func blame(recs []telemetry.Record) (straggler int, late, waited time.Duration) {
	for i := range recs {
		if recs[i].Arrive.After(recs[straggler].Arrive) {
			straggler = i
		}
	}
	last := recs[straggler].Arrive
	var prev time.Time // the latest arrival among the others
	for i, r := range recs {
		if i == straggler {
			continue
		}
		if prev.IsZero() || r.Arrive.After(prev) {
			prev = r.Arrive
		}
		waited += last.Sub(r.Arrive)
	}
	return straggler, last.Sub(prev), waited
}

// Mark records that rank started a forward pass for step of generation
// gen at t (the hook's forward pre-hook): what splits a straggler's
// lateness into input, compute and communication (phases.go). Marks of
// older generations and of ranks out of range are ignored; one of a newer
// generation starts it, as a record does.
func (a *Analyzer) Mark(gen uint64, rank int, step uint64, t time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if rank < 0 || rank >= a.cfg.WorldSize || t.IsZero() {
		a.stats.BadRank++
		return
	}
	if !a.started || gen > a.gen {
		a.resetLocked(gen)
	}
	if gen < a.gen {
		a.stats.OtherGen++
		return
	}
	a.steps.mark(step, rank, a.cfg.WorldSize, t)
}

// Stragglers runs the persistent straggler test (straggler.go) over the
// current generation's recent steps and returns the ranks named, the most
// costly first; nil while too few steps have been seen. A rank named stays
// named, call after call, until it recovers.
func (a *Analyzer) Stragglers() []telemetry.Straggler {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.steps.judge(stragglerParams{
		world: a.cfg.WorldSize, window: a.cfg.StragglerSteps, alpha: a.cfg.Alpha,
		noiseK: a.cfg.NoiseK, cost: a.cfg.Cost, warmup: a.cfg.WarmupSteps,
	})
}

// Hang returns the incomplete collective whose first arrival is the
// oldest, if that arrival is at least timeout before now; nil otherwise.
// Waiting lists the ranks that have arrived (any record, in-flight or
// final), Missing the others, both sorted.
func (a *Analyzer) Hang(now time.Time, timeout time.Duration) *telemetry.Hang {
	a.mu.Lock()
	defer a.mu.Unlock()

	var key telemetry.Key
	var oldest *pending
	for k, p := range a.pending {
		if p.first.IsZero() {
			continue
		}
		if oldest == nil || p.first.Before(oldest.first) ||
			p.first.Equal(oldest.first) && keyLess(k, key) { // deterministic on ties
			key, oldest = k, p
		}
	}
	if oldest == nil || now.Sub(oldest.first) < timeout {
		return nil
	}
	h := &telemetry.Hang{Key: key, Since: oldest.first, Waiting: []int{}, Missing: []int{}}
	for rank, st := range oldest.state {
		if st == absent {
			h.Missing = append(h.Missing, rank)
		} else {
			h.Waiting = append(h.Waiting, rank)
		}
	}
	return h
}

func keyLess(a, b telemetry.Key) bool {
	if a.Step != b.Step {
		return a.Step < b.Step
	}
	return a.Bucket < b.Bucket
}

// Stats returns the counters so far.
func (a *Analyzer) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.stats
	s.Pending = len(a.pending)
	return s
}
