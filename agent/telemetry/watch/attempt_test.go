package watch

import (
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestHangTimeoutAuto: with --hang-timeout auto the timeout is 60 s until
// the steps are known to take longer than a tenth of it; then 10 × the
// median step time. Gaps in the step numbers (a restart, a lost record)
// make no interval.
func TestHangTimeoutAuto(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name  string
		step  time.Duration
		steps []uint64
		want  time.Duration
	}{
		{"short steps", 2 * time.Second, []uint64{0, 1, 2, 3, 4, 5, 6}, time.Minute},
		{"long steps", 30 * time.Second, []uint64{0, 1, 2, 3, 4, 5, 6}, 5 * time.Minute},
		{"too few steps", 30 * time.Second, []uint64{0, 1, 2, 3}, time.Minute},
		{"gaps", 30 * time.Second, []uint64{0, 2, 4, 6, 8, 10, 12}, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at := newAttempt(0, plan{size: 2}, nil, 0, "", 0, slog.New(slog.DiscardHandler))
			for _, st := range tc.steps {
				at.steps.observe(st, base.Add(time.Duration(st)*tc.step))
			}
			if got := at.timeout(time.Minute, true); got != tc.want {
				t.Errorf("timeout %v, want %v", got, tc.want)
			}
			if got := at.timeout(time.Minute, false); got != time.Minute {
				t.Errorf("without auto: %v, want the flag's 1m", got)
			}
		})
	}
}

// TestAttemptAdd: an attempt's analyzer counts ranks from base; what it
// hands back is by global rank again, stalls' stragglers too. Records of
// another generation and forward marks complete nothing.
func TestAttemptAdd(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	rec := func(gen uint64, rank int, late time.Duration) telemetry.Record {
		return telemetry.Record{Gen: gen, Step: 3, Bucket: 1, Rank: rank, Arrive: now.Add(late), Start: now.Add(late), End: now.Add(late + time.Millisecond)}
	}
	script := func(r telemetry.Record) telemetry.Record { r.Bucket = 1<<31 - 3; return r }
	for _, tc := range []struct {
		name      string
		base      int
		recs      []telemetry.Record
		wantRanks []int // of the one collective completed; nil: none
	}{
		{name: "single node", base: 0, recs: []telemetry.Record{rec(2, 0, 0), rec(2, 1, 0)}, wantRanks: []int{0, 1}},
		{name: "own ranks of the second node", base: 4, recs: []telemetry.Record{rec(2, 4, 0), rec(2, 5, 0)}, wantRanks: []int{4, 5}},
		{name: "another generation", base: 0, recs: []telemetry.Record{rec(1, 0, 0), rec(1, 1, 0)}},
		{name: "one rank short", base: 0, recs: []telemetry.Record{rec(2, 0, 0)}},
		{name: "the script's own collective", base: 0, recs: []telemetry.Record{script(rec(2, 0, 0)), script(rec(2, 1, 0))}},
		{
			name: "marks are no collectives", base: 0,
			recs: []telemetry.Record{{Gen: 2, Step: 3, Rank: 0, Status: telemetry.StatusMark, Arrive: now}, {Gen: 2, Step: 3, Rank: 1, Status: telemetry.StatusMark, Arrive: now}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at := newAttempt(2, plan{base: tc.base, size: 2}, nil, tc.base, "", 0, quiet())
			before := at.progress
			done := at.add(tc.recs)
			if tc.wantRanks == nil {
				if len(done) != 0 {
					t.Fatalf("got %d collectives, want none", len(done))
				}
				return
			}
			if len(done) != 1 {
				t.Fatalf("got %d collectives, want 1", len(done))
			}
			var got []int
			for _, r := range done[0].Records {
				got = append(got, r.Rank)
			}
			if !slices.Equal(got, tc.wantRanks) {
				t.Errorf("got ranks %v, want %v", got, tc.wantRanks)
			}
			if !at.progress.After(before) {
				t.Errorf("got progress %v, want after %v", at.progress, before)
			}
		})
	}
}

// TestAttemptHang: a hang is judged once nothing completed for the
// timeout; it is found once; ranks of a node that never reported, or went
// silent, are not judged (and said so once).
func TestAttemptHang(t *testing.T) {
	now := time.Now()
	const timeout = 2 * time.Second
	for _, tc := range []struct {
		name        string
		quietFor    time.Duration
		local       int                  // this node's ranks, from rank 0
		heard       map[string]time.Time // node -> last sent; ranks 2, 3 on "node-b"
		wantHang    bool
		wantMissing []int
		wantUnjudge []int
		bucket      uint32 // of the collective in flight
	}{
		{name: "collectives still complete", quietFor: time.Second, local: 4},
		{name: "this node's rank missing", quietFor: 3 * time.Second, local: 4, wantHang: true, wantMissing: []int{3}},
		{name: "a node never heard", quietFor: 3 * time.Second, local: 2, wantUnjudge: []int{3}},
		{name: "a node heard a second ago", quietFor: 3 * time.Second, local: 2, heard: map[string]time.Time{"node-b": now.Add(-time.Second)}, wantHang: true, wantMissing: []int{3}},
		{name: "a node silent", quietFor: 3 * time.Second, local: 2, heard: map[string]time.Time{"node-b": now.Add(-silentAfter - time.Second)}, wantUnjudge: []int{3}},
		{name: "the script's barrier", quietFor: 3 * time.Second, local: 4, bucket: 1<<31 - 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			local := make([]telemetry.Worker, tc.local)
			for i := range local {
				local[i] = telemetry.Worker{Rank: i, LocalRank: i}
			}
			at := newAttempt(0, plan{size: 4}, local, 0, "", 0, quiet())
			for node, last := range tc.heard {
				at.heardFrom(node, last, telemetry.Worker{Rank: 2}, telemetry.Worker{Rank: 3})
			}
			for r := range 3 { // rank 3 never arrives
				at.add([]telemetry.Record{{Step: 5, Bucket: tc.bucket, Rank: r, Status: telemetry.StatusInFlight, Arrive: now.Add(-time.Minute)}})
			}
			at.progress = time.Now().Add(-tc.quietFor)
			v := at.hang(now, timeout)
			if got := v.Hang != nil && len(v.Unjudged) == 0; got != tc.wantHang {
				t.Fatalf("got hang %v (%+v), want %v", got, v, tc.wantHang)
			}
			if tc.wantHang && !slices.Equal(v.Hang.Missing, tc.wantMissing) {
				t.Errorf("got missing %v, want %v", v.Hang.Missing, tc.wantMissing)
			}
			if !slices.Equal(v.Unjudged, tc.wantUnjudge) || (len(v.Unjudged) > 0) != v.Log {
				t.Errorf("got unjudged %v (log %v, %q), want %v logged", v.Unjudged, v.Log, v.Why, tc.wantUnjudge)
			}
			again := at.hang(now, timeout)
			if tc.wantHang && again.Hang != nil {
				t.Errorf("found again: got %+v, want nothing", again)
			}
			if len(tc.wantUnjudge) > 0 && (again.Log || !slices.Equal(again.Unjudged, tc.wantUnjudge)) {
				t.Errorf("second look: got %v (log %v), want %v, not logged again", again.Unjudged, again.Log, tc.wantUnjudge)
			}
		})
	}
}

// TestFirstCollectiveGrace: rank 0 comes to the attempt's first
// collective 2 minutes after the start (torch.compile, say), and rank 1
// not yet. With nothing completed, rank 1 has as long again before it is
// a hang, whatever the timeout; once a collective has completed, the
// timeout alone counts.
func TestFirstCollectiveGrace(t *testing.T) {
	const timeout = 2 * time.Second
	for _, tc := range []struct {
		name     string
		done     bool          // step 0 completed first
		after    time.Duration // from rank 0's arrival to the look
		wantHang bool
	}{
		{name: "first collective, a minute on", after: time.Minute},
		{name: "first collective, past twice the first rank's time", after: 2*time.Minute + time.Second, wantHang: true},
		{name: "a later collective, a minute on", done: true, after: time.Minute, wantHang: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			local := []telemetry.Worker{{Rank: 0}, {Rank: 1, LocalRank: 1}}
			at := newAttempt(0, plan{size: 2}, local, 0, "", 0, quiet())
			start := time.Now().Add(-time.Hour)
			at.began = start
			step := uint64(0)
			if tc.done {
				for r := range 2 {
					t0 := start.Add(time.Minute)
					at.add([]telemetry.Record{{Rank: r, Arrive: t0, Start: t0, End: t0.Add(time.Millisecond)}})
				}
				step = 1
			}
			arrived := start.Add(2 * time.Minute)
			at.add([]telemetry.Record{{Step: step, Rank: 0, Status: telemetry.StatusInFlight, Arrive: arrived}})
			at.progress = time.Now().Add(-time.Hour) // quiet since
			v := at.hang(arrived.Add(tc.after), timeout)
			if got := v.Hang != nil; got != tc.wantHang {
				t.Fatalf("got hang %v (%+v), want %v", got, v, tc.wantHang)
			}
			if tc.wantHang && !slices.Equal(v.Hang.Missing, []int{1}) {
				t.Errorf("missing %v, want rank 1", v.Hang.Missing)
			}
		})
	}
}

// TestAttemptEvidence: a rank's GPU slowdown counts only when most of the
// other GPUs show none; other nodes' ranks bring their evidence with
// them; this node's are read (readLocal) at most every evidenceEvery.
func TestAttemptEvidence(t *testing.T) {
	for _, tc := range []struct {
		name    string
		slowed  []int // of this node's ranks 0-3, whose GPU is slowed
		remote  string
		rank    int
		wantGPU string
	}{
		{name: "only its GPU", slowed: []int{1}, rank: 1, wantGPU: "throttled"},
		{name: "half the others too", slowed: []int{0, 1, 2}, rank: 1, wantGPU: ""},
		{name: "a fast rank", slowed: []int{1}, rank: 0, wantGPU: ""},
		{name: "another node's rank, as sent", slowed: nil, remote: "clocked down", rank: 4, wantGPU: "clocked down"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var local []telemetry.Worker
			for r := range 4 {
				local = append(local, telemetry.Worker{Rank: r, LocalRank: r, GPU: fmt.Sprint("GPU-", r), GPUIndex: r})
			}
			at := newAttempt(0, plan{size: 5}, local, 0, "", 0, quiet())
			reads := 0
			at.readLocal = func(w telemetry.Worker) evidence {
				reads++
				if slices.Contains(tc.slowed, w.Rank) {
					return evidence{gpuState: "hot", gpuSlow: "throttled"}
				}
				return evidence{gpuState: "fine"}
			}
			at.heardFrom("node-b", time.Now(), telemetry.Worker{Rank: 4, GPU: "GPU-b0", GPUSlowdown: tc.remote})
			if got := at.evidenceFor(tc.rank).gpuSlow; got != tc.wantGPU {
				t.Errorf("got GPU slowdown %q, want %q", got, tc.wantGPU)
			}
			at.evidenceFor(tc.rank)
			if reads != 4 {
				t.Errorf("got %d reads of this node's evidence, want 4 (once per rank, then cached)", reads)
			}
		})
	}
}

// TestAttemptStragglers: a look names the persistent stragglers, by
// global rank, with their cause, and says what changed since the look
// before.
func TestAttemptStragglers(t *testing.T) {
	at := newAttempt(0, plan{base: 2, size: 2}, []telemetry.Worker{{Rank: 2}, {Rank: 3, LocalRank: 1}}, 2, "", 0, quiet())
	base := time.Unix(1_700_000_000, 0)
	feed := func(from, to uint64, late time.Duration) {
		for step := from; step < to; step++ {
			t0 := base.Add(time.Duration(step) * time.Second)
			for i, late := range []time.Duration{0, late} {
				arrive := t0.Add(late)
				at.add([]telemetry.Record{{Step: step, Rank: 2 + i, Arrive: arrive, Start: arrive, End: t0.Add(110 * time.Millisecond)}})
			}
		}
	}
	for _, tc := range []struct {
		name        string
		from, to    uint64
		late        time.Duration
		wantNamed   []int
		wantGone    []int
		wantChanged bool
	}{
		{name: "nothing yet", from: 0, to: 3, late: 100 * time.Millisecond},
		{name: "named", from: 3, to: 20, late: 100 * time.Millisecond, wantNamed: []int{3}, wantChanged: true},
		{name: "named again", from: 20, to: 22, late: 100 * time.Millisecond, wantNamed: []int{3}},
		{name: "recovered", from: 22, to: 100, wantGone: []int{3}, wantChanged: true},
		{name: "still none", from: 100, to: 101},
	} {
		t.Run(tc.name, func(t *testing.T) {
			feed(tc.from, tc.to, tc.late)
			look := at.stragglers()
			var named []int
			for _, st := range look.named {
				named = append(named, st.Rank)
				if st.Cause == "" {
					t.Errorf("rank %d named without a cause", st.Rank)
				}
			}
			if !slices.Equal(named, tc.wantNamed) || !slices.Equal(look.gone, tc.wantGone) || look.changed != tc.wantChanged {
				t.Errorf("got named %v, gone %v, changed %v; want %v, %v, %v", named, look.gone, look.changed, tc.wantNamed, tc.wantGone, tc.wantChanged)
			}
		})
	}
}

func TestDescribe(t *testing.T) {
	for _, tc := range []struct {
		w    telemetry.Worker
		want string
	}{
		{telemetry.Worker{Rank: 5, Host: "node-b", GPU: "GPU-1", GPUIndex: 1, PID: 4411}, "5 (node-b, GPU 1, pid 4411)"},
		{telemetry.Worker{Rank: 2, Host: "node-a", GPUIndex: -1}, "2 (node-a)"},
		{unknownWorker(7), "7"},
	} {
		if got := describe(tc.w.Rank, tc.w); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
}
