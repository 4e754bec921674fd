package straggler

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

var t0 = time.Unix(1_700_000_000, 0)

// named is the stragglers of ranks, with a cost each so ties are broken
// by rank alone.
func named(ranks ...int) []telemetry.Straggler {
	out := make([]telemetry.Straggler, len(ranks))
	for i, r := range ranks {
		out[i] = telemetry.Straggler{Rank: r, Share: 0.1, Cause: telemetry.CauseCompute, Evidence: "forward and backward take 120ms longer"}
	}
	return out
}

// TestStragglerClock: a rank is confirmed once it has been named at every
// look for the window; a look without it, or a gap between looks, starts
// its clock again; one decision per attempt; a new generation starts over.
func TestStragglerClock(t *testing.T) {
	type look struct {
		gen   uint64
		at    time.Duration // since t0
		ranks []int
	}
	tests := []struct {
		name  string
		looks []look
		want  []int // the decided rank at each look, -1 for none
	}{
		{"confirmed at the window", []look{{0, 0, []int{1}}, {0, time.Second, []int{1}}, {0, 2 * time.Second, []int{1}}, {0, 3 * time.Second, []int{1}}},
			[]int{-1, -1, -1, 1}},
		{"once per attempt", []look{{0, 0, []int{1}}, {0, 3 * time.Second, []int{1}}, {0, 4 * time.Second, []int{1}}, {0, 5 * time.Second, []int{1, 2}}},
			[]int{-1, 1, -1, -1}},
		{"a look without it resets", []look{{0, 0, []int{1}}, {0, 2 * time.Second, nil}, {0, 3 * time.Second, []int{1}}, {0, 5 * time.Second, []int{1}}, {0, 6 * time.Second, []int{1}}},
			[]int{-1, -1, -1, -1, 1}},
		{"a gap between looks resets", []look{{0, 0, []int{1}}, {0, 11 * time.Second, []int{1}}, {0, 13 * time.Second, []int{1}}, {0, 14 * time.Second, []int{1}}},
			[]int{-1, -1, -1, 1}},
		{"a new generation starts over", []look{{0, 0, []int{1}}, {0, 2 * time.Second, []int{1}}, {1, 3 * time.Second, []int{1}}, {1, 5 * time.Second, []int{1}}, {1, 6 * time.Second, []int{1}}},
			[]int{-1, -1, -1, -1, 1}},
		{"the next generation decides again", []look{{0, 0, []int{1}}, {0, 3 * time.Second, []int{1}}, {1, 4 * time.Second, []int{1}}, {1, 7 * time.Second, []int{1}}},
			[]int{-1, 1, -1, 1}},
		{"the one named longest", []look{{0, 0, []int{2}}, {0, time.Second, []int{1, 2}}, {0, 4 * time.Second, []int{1, 2}}},
			[]int{-1, -1, 2}},
		{"a tie goes to the lower rank", []look{{0, 0, []int{3, 1}}, {0, 3 * time.Second, []int{3, 1}}},
			[]int{-1, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var c clock
			for i, l := range tc.looks {
				d, ok := c.look(l.gen, t0.Add(l.at), named(l.ranks...), ActionRestart, 3*time.Second)
				got := -1
				if ok {
					got = d.Straggler.Rank
					if d.Action != ActionRestart || d.Named < 3*time.Second {
						t.Errorf("look %d: decision %+v, want restart after at least 3s", i, d)
					}
				}
				if got != tc.want[i] {
					t.Errorf("look %d (%v, ranks %v): decided rank %d, want %d", i, l.at, l.ranks, got, tc.want[i])
				}
			}
		})
	}
}

// TestStragglerClockRandom: over seeded random sequences of looks (the
// watch's 1-2 s ticks, now and then a late one, ranks named and not,
// windows from 2 to 16 s), the
// clock decides exactly when a brute-force reading of the whole history
// says a rank has been named without a gap for the window, and on the
// same rank.
func TestStragglerClockRandom(t *testing.T) {
	decided := 0
	for seed := uint64(1); seed <= 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, 16))
		window := time.Duration(2+rng.IntN(15)) * time.Second
		var (
			c      clock
			times  []time.Time
			looks  [][]int
			now    = t0
			decide = -1
		)
		for i := 0; i < 60; i++ {
			now = now.Add(time.Duration(500+rng.IntN(2000)) * time.Millisecond)
			if rng.IntN(40) == 0 {
				now = now.Add(lookGap)
			}
			var ranks []int
			for r := 0; r < 4; r++ {
				if rng.IntN(10) < 5+r/2 { // the higher ranks named more often
					ranks = append(ranks, r)
				}
			}
			times, looks = append(times, now), append(looks, ranks)
			d, ok := c.look(0, now, named(ranks...), ActionLog, window)
			want := -1
			if decide < 0 {
				want = referenceDecision(times, looks, window)
			}
			got := -1
			if ok {
				got = d.Straggler.Rank
			}
			if got != want {
				t.Fatalf("seed %d look %d: decided rank %d, want %d\nlooks %v", seed, i, got, want, looks)
			}
			if ok {
				decide = got
				decided++
			}
		}
	}
	t.Logf("%d of 300 sequences decided", decided)
	if decided < 100 || decided > 290 {
		t.Errorf("%d of 300 sequences decided: the test exercises too little", decided)
	}
}

// referenceDecision reads the whole history: for each rank named at the
// last look, the earliest look from which it was named at every look with
// no gap over lookGap; the rank named longest past the window (the lower
// on a tie), or -1.
func referenceDecision(times []time.Time, looks [][]int, window time.Duration) int {
	last := len(looks) - 1
	best, bestFrom := -1, 0
	for _, r := range looks[last] {
		from := last
		for from > 0 && contains(looks[from-1], r) && times[from].Sub(times[from-1]) <= lookGap {
			from--
		}
		if times[last].Sub(times[from]) < window {
			continue
		}
		if best < 0 || from < bestFrom || from == bestFrom && r < best {
			best, bestFrom = r, from
		}
	}
	return best
}

func contains(v []int, x int) bool {
	for _, y := range v {
		if y == x {
			return true
		}
	}
	return false
}

// TestDrainCheck: only the node of the straggler's rank drains, and only
// when MIN nodes remain without it or a spare waits.
func TestDrainCheck(t *testing.T) {
	tests := []struct {
		name       string
		d          drainCheck
		needSpares bool
		refusal    string // "" allowed
	}{
		{"local, MIN remain", drainCheck{Rank: 1, Local: true, Nodes: 3, Min: 2}, false, ""},
		{"local, one node, no spare", drainCheck{Rank: 1, Local: true, Nodes: 1, Min: 1}, true, "drain refused: 1 nodes, MIN 1, no spare"},
		{"local, at MIN, a spare", drainCheck{Rank: 1, Local: true, Nodes: 2, Min: 2, Spares: 1}, true, ""},
		{"another node's rank", drainCheck{Rank: 5, Owner: "node node-b", Nodes: 3, Min: 1}, false,
			"not drained here: rank 5 runs on node node-b, whose agent drains it (it reads the stragglers this agent publishes)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.d.needsSpares(); got != tc.needSpares {
				t.Errorf("needsSpares: %v, want %v", got, tc.needSpares)
			}
			if got := tc.d.refusal(); got != tc.refusal {
				t.Errorf("refusal: %q, want %q", got, tc.refusal)
			}
		})
	}
}

// policyRig is a Policy with its effects recorded.
type policyRig struct {
	p      *Policy
	logs   *bytes.Buffer
	mu     sync.Mutex
	faults []restartCall
	drains []*Error
	now    time.Time
}

// restartCall is one call of the policy's restart: the fault it reports.
type restartCall struct {
	gen  uint64
	seen time.Time
	se   *Error
}

func newPolicyRig(action Action, minNodes, maxRestarts int, spares func(context.Context) (int, error)) *policyRig {
	rig := &policyRig{logs: &bytes.Buffer{}, now: t0}
	rig.p = &Policy{
		log: slog.New(slog.NewTextHandler(rig.logs, nil)), action: action, confirm: 3 * time.Second,
		minNodes: minNodes, maxRestarts: maxRestarts, now: func() time.Time { return rig.now },
		restart: func(gen uint64, seen time.Time, se *Error) {
			rig.mu.Lock()
			rig.faults = append(rig.faults, restartCall{gen, seen, se})
			rig.mu.Unlock()
		},
		drain:      func(se *Error) { rig.mu.Lock(); rig.drains = append(rig.drains, se); rig.mu.Unlock() },
		spares:     spares,
		owner:      func(rank int) string { return map[int]string{4: "node-b"}[rank] },
		background: func(f func()) { f() },
		runCtx:     context.Background(),
	}
	return rig
}

// run gives the policy looks naming ranks every second for 5 s.
func (rig *policyRig) run(ranks ...int) {
	for i := 0; i <= 5; i++ {
		rig.p.Look(named(ranks...))
		rig.now = rig.now.Add(time.Second)
	}
}

// TestStragglerPolicy: what each action does once a straggler is
// confirmed, and what it falls back to when it must not.
func TestStragglerPolicy(t *testing.T) {
	one := Attempt{Gen: 7, Nodes: 1, RankOffset: 0, NProc: 2, Restarts: 0}
	three := Attempt{Gen: 7, Nodes: 3, RankOffset: 2, NProc: 2}
	spares := func(n int) func(context.Context) (int, error) {
		return func(context.Context) (int, error) { return n, nil }
	}
	tests := []struct {
		name        string
		action      Action
		at          Attempt
		min, maxRst int
		spares      func(context.Context) (int, error)
		rank        int
		faults      int
		drains      int
		log         string
	}{
		{"log", ActionLog, one, 1, 3, nil, 1, 0, 0, "persistent straggler rank 1 confirmed for 3s; action log: nothing done"},
		{"restart", ActionRestart, one, 1, 3, nil, 1, 1, 0,
			"persistent straggler rank 1 confirmed for 3s (cause compute: forward and backward take 120ms longer); action restart: restarting the job"},
		{"restart with none left", ActionRestart, one, 1, 0, nil, 1, 0, 0,
			"persistent straggler rank 1 confirmed for 3s; restart refused: no restarts left (0 of --max-restarts 0 used); action log: nothing done"},
		{"drain, MIN remain", ActionDrain, three, 2, 0, nil, 3, 0, 1, "action drain: this node leaves the job (3 nodes, MIN 2, 0 spare(s))"},
		{"drain, a spare waits", ActionDrain, one, 1, 0, spares(1), 1, 0, 1, "action drain: this node leaves the job (1 nodes, MIN 1, 1 spare(s))"},
		{"drain refused, no spare", ActionDrain, one, 1, 0, spares(0), 1, 0, 0,
			"persistent straggler rank 1 confirmed for 3s; drain refused: 1 nodes, MIN 1, no spare; action log: nothing done"},
		{"drain refused, spares unreadable", ActionDrain, one, 1, 0,
			func(context.Context) (int, error) { return 0, errors.New("store down") }, 1, 0, 0, "drain refused: 1 nodes, MIN 1, no spare"},
		{"drain of another node's rank", ActionDrain, three, 1, 0, nil, 4, 0, 0,
			"not drained here: rank 4 runs on node node-b, whose agent drains it"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rig := newPolicyRig(tc.action, tc.min, tc.maxRst, tc.spares)
			rig.p.Begin(tc.at)
			rig.run(tc.rank)
			logs := rig.logs.String()
			if len(rig.faults) != tc.faults || len(rig.drains) != tc.drains {
				t.Fatalf("%d faults, %d drains; want %d, %d\n%s", len(rig.faults), len(rig.drains), tc.faults, tc.drains, logs)
			}
			if !strings.Contains(logs, tc.log) {
				t.Errorf("log lacks %q:\n%s", tc.log, logs)
			}
			if n := strings.Count(logs, "persistent straggler rank"); n != 1 {
				t.Errorf("%d lines about the straggler, want 1:\n%s", n, logs)
			}
			// The agent makes each restart a fault of the straggler's source,
			// with se.Finding() its reason (agent's TestStragglerFault).
			for _, f := range rig.faults {
				if f.gen != 7 || f.se == nil || f.se.Straggler.Rank != tc.rank {
					t.Errorf("fault %+v, want one from the straggler, of generation 7, that restarts the job", f)
				}
				for _, want := range []string{"rank 1", "cause compute", "forward and backward take 120ms longer"} {
					if !strings.Contains(f.se.Finding(), want) {
						t.Errorf("reason %q lacks %q", f.se.Finding(), want)
					}
				}
			}
			for _, se := range rig.drains {
				if se.Action != ActionDrain || se.Straggler.Rank != tc.rank || !strings.Contains(se.Error(), "this node leaves the job") {
					t.Errorf("drain %v, want rank %d's", se, tc.rank)
				}
			}
		})
	}
}

// TestStragglerPolicyBetweenAttempts: looks between attempts, when the
// workers are being stopped, act on nothing.
func TestStragglerPolicyBetweenAttempts(t *testing.T) {
	rig := newPolicyRig(ActionRestart, 1, 3, nil)
	rig.run(1)
	rig.p.Begin(Attempt{Gen: 1, Nodes: 1, NProc: 2})
	rig.p.End()
	rig.run(1)
	if len(rig.faults) != 0 {
		t.Errorf("%d faults without an attempt, want none", len(rig.faults))
	}
}
