package stall

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// t0 is the start of every synthetic job.
var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// job describes a synthetic DDP run: steps 1s apart, buckets 20ms apart
// within a step, each all-reduce taking 9–11ms once the last rank arrives.
type job struct {
	gen     uint64
	ranks   int
	buckets int
	steps   int
	jitter  time.Duration                              // each rank's arrival spread, uniform in [0, jitter)
	late    func(step, bucket, rank int) time.Duration // extra delay of a rank's arrival; nil: none
	seed    uint64
	flights bool // also emit an in-flight record before each final one
}

// delivery is a record and when the agent receives it.
type delivery struct {
	at time.Time
	r  telemetry.Record
}

// records returns the job's records as the shims would send them, each
// with the time it is sent (the in-flight ones at arrival, the final ones
// at their end), sorted by that time.
func (j job) records() []delivery {
	rng := rand.New(rand.NewPCG(j.seed, 1))
	if j.gen == 0 {
		j.gen = 1
	}
	var out []delivery
	for s := range j.steps {
		for b := range j.buckets {
			nominal := t0.Add(time.Duration(s)*time.Second + time.Duration(b)*20*time.Millisecond)
			arrive := make([]time.Time, j.ranks)
			var last time.Time
			for r := range arrive {
				arrive[r] = nominal
				if j.jitter > 0 {
					arrive[r] = arrive[r].Add(uniform(rng, j.jitter))
				}
				if j.late != nil {
					arrive[r] = arrive[r].Add(j.late(s, b, r))
				}
				if arrive[r].After(last) {
					last = arrive[r]
				}
			}
			end := last.Add(9*time.Millisecond + uniform(rng, 2*time.Millisecond))
			for r := range arrive {
				rec := telemetry.Record{
					Gen: j.gen, Step: uint64(s), Bucket: uint32(b), Rank: r,
					Bytes: 25 << 20, DType: 7,
					Arrive: arrive[r],
					Start:  arrive[r].Add(50 * time.Microsecond),
					End:    end.Add(uniform(rng, 100*time.Microsecond)),
				}
				if j.flights {
					fl := rec
					fl.Status, fl.Start, fl.End = telemetry.StatusInFlight, time.Time{}, time.Time{}
					out = append(out, delivery{at: rec.Arrive, r: fl})
				}
				out = append(out, delivery{at: rec.End, r: rec})
			}
		}
	}
	slices.SortStableFunc(out, func(a, b delivery) int { return a.at.Compare(b.at) })
	return out
}

// delayed reorders ds as a network would: each record is delayed by up to
// max, uniformly, so records of neighbouring steps, buckets and ranks
// interleave.
func delayed(ds []delivery, maxDelay time.Duration, seed uint64) []delivery {
	rng := rand.New(rand.NewPCG(seed, 2))
	out := slices.Clone(ds)
	for i := range out {
		out[i].at = out[i].at.Add(uniform(rng, maxDelay))
	}
	slices.SortStableFunc(out, func(a, b delivery) int { return a.at.Compare(b.at) })
	return out
}

func newAnalyzer(t testing.TB, cfg Config) *Analyzer {
	t.Helper()
	a, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return a
}

// feed adds ds in order and returns the collectives completed, by key; it
// fails the test if one completes twice.
func feed(t testing.TB, a *Analyzer, ds []delivery) map[telemetry.Key]telemetry.Collective {
	t.Helper()
	got := make(map[telemetry.Key]telemetry.Collective)
	for _, d := range ds {
		for _, c := range a.Add(d.r) {
			if _, dup := got[c.Key]; dup {
				t.Fatalf("%v completed twice", c.Key)
			}
			got[c.Key] = c
		}
	}
	return got
}

// uniform draws a duration uniformly in [0, upTo).
func uniform(rng *rand.Rand, upTo time.Duration) time.Duration {
	return time.Duration(rng.Int64N(int64(upTo)))
}

func near(got, want, tol time.Duration) bool { return got >= want-tol && got <= want+tol }

// lateIn returns a late function: rank is by late in the given steps.
func lateIn(rank int, by time.Duration, steps ...int) func(s, b, r int) time.Duration {
	return func(s, _, r int) time.Duration {
		if r == rank && slices.Contains(steps, s) {
			return by
		}
		return 0
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr bool
		want    Config // checked when no error
	}{
		{name: "defaults", cfg: Config{WorldSize: 8}, want: Config{
			WorldSize: 8, Floor: 100 * time.Millisecond, K: 6, Window: 50, MinSamples: 10,
			StragglerSteps: 40, WarmupSteps: 5, Alpha: 0.01, NoiseK: 3, Cost: 0.05, MaxPending: 4096,
		}},
		{name: "small window caps MinSamples", cfg: Config{WorldSize: 2, Window: 3}, want: Config{
			WorldSize: 2, Floor: 100 * time.Millisecond, K: 6, Window: 3, MinSamples: 3,
			StragglerSteps: 40, WarmupSteps: 5, Alpha: 0.01, NoiseK: 3, Cost: 0.05, MaxPending: 4096,
		}},
		{name: "no world size", cfg: Config{}, wantErr: true},
		{name: "negative world size", cfg: Config{WorldSize: -1}, wantErr: true},
		{name: "negative floor", cfg: Config{WorldSize: 2, Floor: -time.Second}, wantErr: true},
		{name: "K below 1", cfg: Config{WorldSize: 2, K: 0.5}, wantErr: true},
		{name: "negative window", cfg: Config{WorldSize: 2, Window: -1}, wantErr: true},
		{name: "MinSamples above window", cfg: Config{WorldSize: 2, Window: 10, MinSamples: 11}, wantErr: true},
		{name: "negative straggler steps", cfg: Config{WorldSize: 2, StragglerSteps: -1}, wantErr: true},
		{name: "alpha 1", cfg: Config{WorldSize: 2, Alpha: 1}, wantErr: true},
		{name: "negative noise K", cfg: Config{WorldSize: 2, NoiseK: -1}, wantErr: true},
		{name: "cost 1", cfg: Config{WorldSize: 2, Cost: 1}, wantErr: true},
		{name: "no warm-up", cfg: Config{WorldSize: 2, WarmupSteps: -1}, want: Config{
			WorldSize: 2, Floor: 100 * time.Millisecond, K: 6, Window: 50, MinSamples: 10,
			StragglerSteps: 40, WarmupSteps: 0, Alpha: 0.01, NoiseK: 3, Cost: 0.05, MaxPending: 4096,
		}},
		{name: "negative max pending", cfg: Config{WorldSize: 2, MaxPending: -1}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := New(tc.cfg)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("New(%+v): got no error, want one", tc.cfg)
				}
				return
			}
			if err != nil {
				t.Fatalf("New(%+v): %v", tc.cfg, err)
			}
			if a.cfg != tc.want {
				t.Errorf("config: got %+v, want %+v", a.cfg, tc.want)
			}
		})
	}
}

// stallJob is the job of the brief: 4 ranks, 30 steps of 3 buckets, rank 2
// arriving 300ms late in steps 10, 11 and 12.
func stallJob() job {
	return job{
		ranks: 4, buckets: 3, steps: 30, jitter: 2 * time.Millisecond, seed: 7, flights: true,
		late: lateIn(2, 300*time.Millisecond, 15, 16, 17),
	}
}

// checkStalls checks that exactly the collectives of steps 15–17 stalled,
// on rank 2.
func checkStalls(t *testing.T, got map[telemetry.Key]telemetry.Collective) {
	t.Helper()
	if len(got) != 30*3 {
		t.Fatalf("complete collectives: got %d, want %d", len(got), 30*3)
	}
	for k, c := range got {
		for i, r := range c.Records {
			if r.Rank != i || !r.Done() {
				t.Fatalf("%v: record %d is rank %d (status %d), want a final record of rank %d", k, i, r.Rank, r.Status, i)
			}
		}
		if want := k.Step >= 15 && k.Step <= 17; (c.Stall != nil) != want {
			t.Errorf("%v (duration %v): stall %+v, want stall %v", k, c.Duration(), c.Stall, want)
			continue
		}
		if c.Stall == nil {
			continue
		}
		s := c.Stall
		if s.Straggler != 2 || s.Waiters != 3 {
			t.Errorf("%v: straggler %d with %d waiters, want 2 with 3", k, s.Straggler, s.Waiters)
		}
		if !near(s.Late, 300*time.Millisecond, 2*time.Millisecond) {
			t.Errorf("%v: late %v, want 300ms ± 2ms", k, s.Late)
		}
		if !near(s.Waited, 900*time.Millisecond, 6*time.Millisecond) {
			t.Errorf("%v: waited %v, want 900ms ± 6ms", k, s.Waited)
		}
		if s.Threshold != 100*time.Millisecond {
			t.Errorf("%v: threshold %v, want the 100ms floor", k, s.Threshold)
		}
		if !near(s.Median, 12*time.Millisecond, 3*time.Millisecond) {
			t.Errorf("%v: median %v, want about 12ms", k, s.Median)
		}
	}
}

func TestStalls(t *testing.T) {
	a := newAnalyzer(t, Config{WorldSize: 4})
	got := feed(t, a, stallJob().records())
	checkStalls(t, got)
	st := a.Stats()
	want := Stats{Gen: 1, Records: 2 * 4 * 90, Complete: 90, Stalls: 9}
	if st != want {
		t.Errorf("stats: got %+v, want %+v", st, want)
	}
}

// TestDeliveryOrder checks that the verdicts do not depend on the order
// the records come in, as long as it is the order a network could produce:
// records delayed by up to 1.5s (so steps interleave), or the ranks of a
// collective reversed.
func TestDeliveryOrder(t *testing.T) {
	ds := stallJob().records()
	reversed := slices.Clone(ds)
	slices.SortStableFunc(reversed, func(a, b delivery) int {
		return cmp.Or(cmp.Compare(a.r.Step, b.r.Step), cmp.Compare(a.r.Bucket, b.r.Bucket), cmp.Compare(b.r.Rank, a.r.Rank))
	})
	tests := []struct {
		name string
		ds   []delivery
	}{
		{"in order", ds},
		{"ranks reversed", reversed},
		{"delayed up to 1.5s, seed 1", delayed(ds, 1500*time.Millisecond, 1)},
		{"delayed up to 1.5s, seed 2", delayed(ds, 1500*time.Millisecond, 2)},
		{"delayed up to 3s, seed 3", delayed(ds, 3*time.Second, 3)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := newAnalyzer(t, Config{WorldSize: 4})
			checkStalls(t, feed(t, a, tc.ds))
			if st := a.Stats(); st.Pending != 0 || st.Complete != 90 || st.Stalls != 9 {
				t.Errorf("stats: got %+v, want 90 complete, 9 stalls, none pending", st)
			}
		})
	}
}

// TestShuffled checks that records in any order at all make up the same
// collectives. (The stall verdicts may differ: a bucket's first MinSamples
// collectives are judged by the early rule, and a full shuffle can put a
// stalled step among them.)
func TestShuffled(t *testing.T) {
	ds := stallJob().records()
	want := feed(t, newAnalyzer(t, Config{WorldSize: 4}), ds)
	shuffled := slices.Clone(ds)
	rand.New(rand.NewPCG(42, 42)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	got := feed(t, newAnalyzer(t, Config{WorldSize: 4}), shuffled)
	if len(got) != len(want) {
		t.Fatalf("complete collectives: got %d, want %d", len(got), len(want))
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("%v: not complete", k)
			continue
		}
		if !slices.Equal(g.Records, w.Records) || g.Bytes != w.Bytes || g.DType != w.DType {
			t.Errorf("%v: got %+v, want %+v", k, g, w)
		}
	}
}

// collective returns the final records of one collective; arrive[r] is
// rank r's arrival after at, and the collective ends dur after the last.
func collective(gen, step uint64, bucket uint32, at time.Time, dur time.Duration, arrive ...time.Duration) []telemetry.Record {
	last := slices.Max(arrive)
	recs := make([]telemetry.Record, len(arrive))
	for r, d := range arrive {
		recs[r] = telemetry.Record{
			Gen: gen, Step: step, Bucket: bucket, Rank: r,
			Arrive: at.Add(d), Start: at.Add(d), End: at.Add(last + dur),
		}
	}
	return recs
}

// add adds recs and returns the collectives completed.
func add(a *Analyzer, recs ...telemetry.Record) []telemetry.Collective {
	var out []telemetry.Collective
	for _, r := range recs {
		out = append(out, a.Add(r)...)
	}
	return out
}

// TestEarly checks the verdicts before a bucket has MinSamples durations.
func TestEarly(t *testing.T) {
	tests := []struct {
		name      string
		dur       time.Duration
		arrive    []time.Duration
		wantStall bool
	}{
		{"NCCL setup: slow on every rank", 3 * time.Second, []time.Duration{0, time.Millisecond, 0, 2 * time.Millisecond}, false},
		{"straggler 2s late", 10 * time.Millisecond, []time.Duration{0, 0, 0, 2 * time.Second}, true},
		{"straggler 300ms late: below 10 × floor", 10 * time.Millisecond, []time.Duration{0, 300 * time.Millisecond, 0, 0}, false},
		{"slow and a straggler, but not mostly its fault", 2 * time.Second, []time.Duration{0, 0, 0, 900 * time.Millisecond}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := newAnalyzer(t, Config{WorldSize: 4})
			cs := add(a, collective(1, 0, 0, t0, tc.dur, tc.arrive...)...)
			if len(cs) != 1 {
				t.Fatalf("complete: got %d collectives, want 1", len(cs))
			}
			if got := cs[0].Stall != nil; got != tc.wantStall {
				t.Fatalf("stall: got %+v, want stall %v", cs[0].Stall, tc.wantStall)
			}
			if s := cs[0].Stall; s != nil && (s.Threshold != time.Second || s.Median != 0 || s.Straggler != 3) {
				t.Errorf("stall: got %+v, want straggler 3, threshold 1s, median 0", s)
			}
		})
	}
}

// TestMedian checks how stalls feed the median: occasional stalls stay
// stalls, a lasting slowdown becomes the new normal.
func TestMedian(t *testing.T) {
	cfg := Config{WorldSize: 2, Floor: time.Millisecond, Window: 20, MinSamples: 5}
	run := func(t *testing.T, dur func(i int) time.Duration, n int) []bool {
		a := newAnalyzer(t, cfg)
		var stalls []bool
		for i := range n {
			at := t0.Add(time.Duration(i) * time.Second)
			cs := add(a, collective(1, uint64(i), 0, at, dur(i), 0, 0)...)
			stalls = append(stalls, cs[0].Stall != nil)
		}
		return stalls
	}

	t.Run("occasional stalls", func(t *testing.T) {
		// One collective in three takes 10×: always a stall, however many.
		stalls := run(t, func(i int) time.Duration {
			if i%3 == 2 {
				return 100 * time.Millisecond
			}
			return 10 * time.Millisecond
		}, 300)
		for i := 5; i < len(stalls); i++ {
			if want := i%3 == 2; stalls[i] != want {
				t.Fatalf("collective %d: stall %v, want %v", i, stalls[i], want)
			}
		}
	})
	t.Run("a big bucket that always takes 128-141ms", func(t *testing.T) {
		// Above the 100ms floor (issue 16 saw these called stalls), but
		// within the bucket's own spread: none is a stall.
		a := newAnalyzer(t, Config{WorldSize: 2})
		rng := rand.New(rand.NewPCG(11, 1))
		for i := range 500 {
			at := t0.Add(time.Duration(i) * time.Second)
			d := 128*time.Millisecond + uniform(rng, 13*time.Millisecond)
			if cs := add(a, collective(1, uint64(i), 0, at, d, 0, 0)...); cs[0].Stall != nil {
				t.Fatalf("collective %d (%v): stall %+v", i, d, cs[0].Stall)
			}
		}
	})
	t.Run("a size sweep under one bucket index", func(t *testing.T) {
		// The all-reduce benchmark goes from 64 KiB in 1 ms to 256 MiB in
		// 150 ms under bucket 0: each size is judged against its own
		// durations, and none is a stall (issue 16 saw these called stalls).
		a := newAnalyzer(t, Config{WorldSize: 2})
		i := 0
		for size := uint64(64 << 10); size <= 256<<20; size *= 4 {
			d := max(time.Millisecond, time.Duration(float64(size)/float64(256<<20)*float64(150*time.Millisecond)))
			for range 20 {
				at := t0.Add(time.Duration(i) * time.Second)
				recs := collective(1, uint64(i), 0, at, d, 0, 0)
				for j := range recs {
					recs[j].Bytes = size
				}
				if cs := add(a, recs...); cs[0].Stall != nil {
					t.Fatalf("collective %d (%d bytes, %v): stall %+v", i, size, d, cs[0].Stall)
				}
				i++
			}
		}
	})
	t.Run("lasting slowdown", func(t *testing.T) {
		// From collective 50 on, every collective takes 10×: stalls at
		// first, until they fill half the window.
		stalls := run(t, func(i int) time.Duration {
			if i >= 50 {
				return 100 * time.Millisecond
			}
			return 10 * time.Millisecond
		}, 200)
		n := 0
		for i, s := range stalls {
			if s && i < 50 {
				t.Fatalf("collective %d: stall before the slowdown", i)
			}
			if s {
				n++
			}
		}
		if n == 0 || n > cfg.Window {
			t.Errorf("stalls after the slowdown: got %d, want 1..%d", n, cfg.Window)
		}
		if slices.Contains(stalls[50+cfg.Window:], true) {
			t.Errorf("stalls %v: still stalling a window after the slowdown", stalls[50:])
		}
	})
}

func TestHang(t *testing.T) {
	a := newAnalyzer(t, Config{WorldSize: 4})
	// Step 6 completes; on step 7 bucket 2, ranks 0, 1 and 3 are inside
	// the all-reduce and rank 2 never comes.
	add(a, collective(1, 6, 0, t0, 10*time.Millisecond, 0, 0, 0, 0)...)
	since := t0.Add(time.Second)
	for _, r := range []int{3, 0, 1} {
		add(a, telemetry.Record{Gen: 1, Step: 7, Bucket: 2, Rank: r, Status: telemetry.StatusInFlight,
			Arrive: since.Add(time.Duration(r) * time.Millisecond)})
	}
	// A later collective with one rank in, younger than the hang.
	add(a, telemetry.Record{Gen: 1, Step: 8, Bucket: 0, Rank: 0, Status: telemetry.StatusInFlight, Arrive: since.Add(time.Second)})

	const timeout = 30 * time.Second
	if h := a.Hang(since.Add(timeout-time.Millisecond), timeout); h != nil {
		t.Fatalf("Hang before the timeout: got %+v, want nil", h)
	}
	want := telemetry.Hang{
		Key:     telemetry.Key{Gen: 1, Step: 7, Bucket: 2},
		Since:   since,
		Waiting: []int{0, 1, 3},
		Missing: []int{2},
	}
	for _, now := range []time.Time{since.Add(timeout), since.Add(time.Hour)} {
		h := a.Hang(now, timeout)
		if h == nil {
			t.Fatalf("Hang at %v: got nil, want %+v", now.Sub(since), want)
		}
		if h.Key != want.Key || !h.Since.Equal(want.Since) || !slices.Equal(h.Waiting, want.Waiting) || !slices.Equal(h.Missing, want.Missing) {
			t.Errorf("Hang at %v: got %+v, want %+v", now.Sub(since), *h, want)
		}
	}

	// Rank 0 gives up (a final record with an error status): it arrived,
	// so it is still not missing.
	add(a, telemetry.Record{Gen: 1, Step: 7, Bucket: 2, Rank: 0, Status: 3, Arrive: since, Start: since, End: since.Add(timeout)})
	if h := a.Hang(since.Add(time.Hour), timeout); h == nil || !slices.Equal(h.Missing, []int{2}) || !slices.Equal(h.Waiting, []int{0, 1, 3}) {
		t.Errorf("Hang after rank 0's final record: got %+v, want waiting [0 1 3], missing [2]", h)
	}

	// Rank 2 comes after all and everyone finishes: the hang is over, the
	// next oldest is step 8's collective.
	end := since.Add(time.Minute)
	for _, r := range []int{1, 2, 3} {
		add(a, telemetry.Record{Gen: 1, Step: 7, Bucket: 2, Rank: r, Arrive: since, Start: since, End: end})
	}
	h := a.Hang(since.Add(time.Hour), timeout)
	if h == nil || h.Step != 8 || !slices.Equal(h.Waiting, []int{0}) || !slices.Equal(h.Missing, []int{1, 2, 3}) {
		t.Errorf("Hang after step 7 completed: got %+v, want step 8, waiting [0], missing [1 2 3]", h)
	}
	if h := a.Hang(since.Add(time.Second+timeout-time.Nanosecond), timeout); h != nil {
		t.Errorf("Hang before step 8's timeout: got %+v, want nil", h)
	}
}

func TestGeneration(t *testing.T) {
	a := newAnalyzer(t, Config{WorldSize: 2})
	// Generation 1: a pending collective, and enough history for the
	// median.
	for s := range 10 {
		add(a, collective(1, uint64(s), 0, t0.Add(time.Duration(s)*time.Second), 10*time.Millisecond, 0, 0)...)
	}
	add(a, collective(1, 10, 0, t0.Add(10*time.Second), 10*time.Millisecond, 0, 0)[0])
	if st := a.Stats(); st.Gen != 1 || st.Pending != 1 {
		t.Fatalf("stats: got %+v, want generation 1, 1 pending", st)
	}

	// A record of generation 2 starts it: generation 1's pending
	// collective is gone, and its records are ignored.
	g2 := collective(2, 0, 0, t0.Add(time.Minute), 10*time.Millisecond, 0, 500*time.Millisecond)
	add(a, g2[0])
	if st := a.Stats(); st.Gen != 2 || st.Pending != 1 {
		t.Fatalf("stats after generation 2: got %+v, want generation 2, 1 pending", st)
	}
	if cs := add(a, collective(1, 10, 0, t0.Add(10*time.Second), 10*time.Millisecond, 0, 0)[1]); len(cs) != 0 {
		t.Errorf("generation 1 record completed %+v, want nothing", cs)
	}
	if h := a.Hang(t0.Add(time.Hour), time.Minute); h == nil || h.Gen != 2 {
		t.Errorf("Hang: got %+v, want generation 2's collective", h)
	}

	// Reset of the current generation, or an older one, keeps what it has:
	// the record of generation 2 may come before the agent's Reset(2).
	a.Reset(2)
	a.Reset(1)
	cs := add(a, g2[1])
	if len(cs) != 1 {
		t.Fatalf("generation 2 collective: got %d complete, want 1", len(cs))
	}
	// The bucket's median started afresh: 510ms with no samples is no
	// stall (it would be against generation 1's 10ms median).
	if cs[0].Stall != nil {
		t.Errorf("first collective of generation 2: stall %+v, want none", cs[0].Stall)
	}

	// Reset to a newer generation drops the pending collectives.
	add(a, collective(2, 1, 0, t0.Add(2*time.Minute), 10*time.Millisecond, 0, 0)[0])
	a.Reset(5)
	if st := a.Stats(); st.Gen != 5 || st.Pending != 0 {
		t.Errorf("stats after Reset(5): got %+v, want generation 5, none pending", st)
	}
	add(a, collective(4, 0, 0, t0, 0, 0, 0)...)
	if st := a.Stats(); st.OtherGen != 3 || st.Complete != 11 {
		t.Errorf("stats: got %+v, want 3 records of other generations, 11 complete", st)
	}
}

func TestIgnored(t *testing.T) {
	recs := collective(1, 0, 0, t0, 10*time.Millisecond, 0, time.Millisecond, 2*time.Millisecond)
	inFlight := func(r telemetry.Record) telemetry.Record {
		r.Status, r.Start, r.End = telemetry.StatusInFlight, time.Time{}, time.Time{}
		return r
	}
	dup := recs[0]
	dup.Bytes = 99 // the first final record wins

	tests := []struct {
		name   string
		in     []telemetry.Record
		wantOK bool // the collective completes, with recs as its records
		want   Stats
	}{
		{
			name: "complete", in: recs, wantOK: true,
			want: Stats{Gen: 1, Records: 3, Complete: 1},
		},
		{
			name: "in-flight then final", in: []telemetry.Record{inFlight(recs[0]), inFlight(recs[0]), recs[0], recs[1], recs[2]}, wantOK: true,
			want: Stats{Gen: 1, Records: 5, Complete: 1},
		},
		{
			name: "in-flight overtaken by final", in: []telemetry.Record{recs[0], inFlight(recs[0]), recs[1], recs[2]}, wantOK: true,
			want: Stats{Gen: 1, Records: 4, Complete: 1},
		},
		{
			name: "duplicate final", in: []telemetry.Record{recs[0], dup, recs[1], recs[2]}, wantOK: true,
			want: Stats{Gen: 1, Records: 3, Complete: 1, Duplicate: 1},
		},
		{
			name: "records after completion", in: []telemetry.Record{recs[0], recs[1], recs[2], dup, inFlight(recs[1])}, wantOK: true,
			want: Stats{Gen: 1, Records: 3, Complete: 1, Stale: 2},
		},
		{
			name: "bad ranks", in: func() []telemetry.Record {
				neg, big := recs[0], recs[0]
				neg.Rank, big.Rank = -1, 3
				newer := big
				newer.Gen = 9 // must not start generation 9
				return []telemetry.Record{neg, recs[0], big, newer, recs[1], recs[2]}
			}(), wantOK: true,
			want: Stats{Gen: 1, Records: 3, Complete: 1, BadRank: 3},
		},
		{
			name: "a rank missing", in: recs[:2],
			want: Stats{Gen: 1, Records: 2, Pending: 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := newAnalyzer(t, Config{WorldSize: 3})
			cs := add(a, tc.in...)
			if (len(cs) == 1) != tc.wantOK || len(cs) > 1 {
				t.Fatalf("complete: got %d collectives, want ok %v", len(cs), tc.wantOK)
			}
			if tc.wantOK && (!slices.Equal(cs[0].Records, recs) || cs[0].Key != recs[0].Key()) {
				t.Errorf("collective: got %+v, want records %+v", cs[0], recs)
			}
			if got := a.Stats(); got != tc.want {
				t.Errorf("stats: got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestMaxPending(t *testing.T) {
	a := newAnalyzer(t, Config{WorldSize: 2, MaxPending: 3})
	// Five collectives with rank 1's record lost.
	for s := range 5 {
		add(a, collective(1, uint64(s), 0, t0.Add(time.Duration(s)*time.Second), time.Millisecond, 0, 0)[0])
	}
	if st := a.Stats(); st.Pending != 3 || st.Dropped != 2 {
		t.Fatalf("stats: got %+v, want 3 pending, 2 dropped", st)
	}
	// The oldest two were dropped: their late records are stale, the
	// oldest left is step 2.
	if cs := add(a, collective(1, 0, 0, t0, time.Millisecond, 0, 0)[1]); len(cs) != 0 {
		t.Errorf("dropped collective completed: %+v", cs)
	}
	if h := a.Hang(t0.Add(time.Hour), time.Minute); h == nil || h.Step != 2 {
		t.Errorf("Hang: got %+v, want step 2", h)
	}
	if cs := add(a, collective(1, 3, 0, t0.Add(3*time.Second), time.Millisecond, 0, 0)[1]); len(cs) != 1 {
		t.Errorf("kept collective: got %d complete, want 1", len(cs))
	}
	if st := a.Stats(); st.Pending != 2 || st.Dropped != 2 || st.Stale != 1 || st.Complete != 1 {
		t.Errorf("stats: got %+v, want 2 pending, 2 dropped, 1 stale, 1 complete", st)
	}
}

func TestWorldSizeOne(t *testing.T) {
	a := newAnalyzer(t, Config{WorldSize: 1})
	for s := range 30 {
		dur := 10 * time.Millisecond
		if s >= 20 {
			dur = 5 * time.Second
		}
		cs := add(a, collective(1, uint64(s), 0, t0.Add(time.Duration(s)*10*time.Second), dur, 0)...)
		if len(cs) != 1 || cs[0].Stall != nil {
			t.Fatalf("step %d: got %+v, want one collective, no stall", s, cs)
		}
	}
	if got := a.Stragglers(); got != nil {
		t.Errorf("Stragglers: got %+v, want nil", got)
	}
	// An in-flight record can still hang.
	add(a, telemetry.Record{Gen: 1, Step: 30, Rank: 0, Status: telemetry.StatusInFlight, Arrive: t0})
	if h := a.Hang(t0.Add(time.Hour), time.Minute); h == nil || !slices.Equal(h.Waiting, []int{0}) || len(h.Missing) != 0 {
		t.Errorf("Hang: got %+v, want waiting [0], none missing", h)
	}
}

// TestConcurrent exercises every method at once for the race detector.
func TestConcurrent(t *testing.T) {
	a := newAnalyzer(t, Config{WorldSize: 4})
	ds := stallJob().records()
	var wg sync.WaitGroup
	for part := range 4 {
		wg.Go(func() {
			for i := part; i < len(ds); i += 4 {
				a.Add(ds[i].r)
			}
		})
	}
	wg.Go(func() {
		for range 200 {
			a.Hang(t0.Add(time.Hour), time.Second)
			a.Stragglers()
			a.Stats()
		}
	})
	wg.Go(func() { a.Reset(1) })
	wg.Wait()
	if st := a.Stats(); st.Complete != 90 || st.Pending != 0 {
		t.Errorf("stats: got %+v, want 90 complete, none pending", st)
	}
}

func TestWindow(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name string
		size int
		add  []time.Duration
		want time.Duration
	}{
		{"empty", 5, nil, 0},
		{"one", 5, []time.Duration{7 * ms}, 7 * ms},
		{"even count: mean of the middle two", 5, []time.Duration{1 * ms, 4 * ms, 2 * ms, 9 * ms}, 3 * ms},
		{"odd count", 5, []time.Duration{5 * ms, 1 * ms, 9 * ms}, 5 * ms},
		{"oldest pushed out", 3, []time.Duration{100 * ms, 100 * ms, 1 * ms, 2 * ms, 3 * ms}, 2 * ms},
		{"equal values pushed out", 2, []time.Duration{4 * ms, 4 * ms, 4 * ms, 6 * ms, 8 * ms}, 7 * ms},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWindow(tc.size)
			for _, d := range tc.add {
				w.add(d)
			}
			if got := w.median(); got != tc.want {
				t.Errorf("median: got %v, want %v", got, tc.want)
			}
		})
	}

	// Against sorting the last size values, over a long random run.
	rng := rand.New(rand.NewPCG(9, 9))
	w := newWindow(50)
	var all []time.Duration
	for i := range 2000 {
		d := time.Duration(rng.IntN(30)) * ms // many equal values
		w.add(d)
		all = append(all, d)
		last := slices.Clone(all[max(0, len(all)-50):])
		slices.Sort(last)
		if !slices.Equal(w.sorted, last) {
			t.Fatalf("after %d adds: sorted %v, want %v", i+1, w.sorted, last)
		}
	}
}

// BenchmarkAdd measures records per second through Add, in order, for a
// 64-rank job with 20 buckets per step.
func BenchmarkAdd(b *testing.B) {
	const ranks, buckets = 64, 20
	one := job{ranks: ranks, buckets: buckets, steps: 1, jitter: 2 * time.Millisecond, seed: 1}.records()
	a := newAnalyzer(b, Config{WorldSize: ranks})
	n := 0
	for b.Loop() {
		d := one[n%len(one)]
		step := n / len(one)
		d.r.Step = uint64(step)
		shift := time.Duration(step) * time.Second
		d.r.Arrive, d.r.Start, d.r.End = d.r.Arrive.Add(shift), d.r.Start.Add(shift), d.r.End.Add(shift)
		a.Add(d.r)
		n++
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
	if st := a.Stats(); st.Pending > buckets || st.Stalls != 0 {
		b.Errorf("stats: got %+v, want at most %d pending, no stalls", st, buckets)
	}
}

// TestAbandon: after the ranks re-formed around a hung one, its collective
// is no hang any more, its late records are ignored, and the new
// communicator's collectives (steps numbered on) complete as before.
func TestAbandon(t *testing.T) {
	a := newAnalyzer(t, Config{WorldSize: 2})
	add(a, collective(1, 6, 0, t0, 10*time.Millisecond, 0, 0)...)
	since := t0.Add(time.Second)
	add(a, telemetry.Record{Gen: 1, Step: 7, Bucket: 0, Rank: 0, Status: telemetry.StatusInFlight, Arrive: since})
	if h := a.Hang(since.Add(time.Hour), time.Minute); h == nil || !slices.Equal(h.Missing, []int{1}) {
		t.Fatalf("Hang: got %+v, want rank 1 missing", h)
	}
	a.Abandon()
	if h := a.Hang(since.Add(time.Hour), time.Minute); h != nil {
		t.Fatalf("Hang after Abandon: got %+v, want nil", h)
	}
	stale := a.Stats().Stale
	add(a, telemetry.Record{Gen: 1, Step: 7, Bucket: 0, Rank: 0, Status: 3, Arrive: since, Start: since, End: since.Add(time.Second)})
	if a.Stats().Stale != stale+1 {
		t.Errorf("a late record of the abandoned collective was not ignored: %+v", a.Stats())
	}
	if got := add(a, collective(1, 8, 0, since.Add(2*time.Second), 10*time.Millisecond, 0, 0)...); len(got) != 1 {
		t.Errorf("the next step's collective: got %d completed, want 1", len(got))
	}
}
