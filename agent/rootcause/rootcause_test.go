package rootcause

import (
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/hostmon"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
)

var t0 = time.Unix(1_700_000_000, 0)

// at is t0 plus ms milliseconds.
func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// exited is an outcome of a worker that exited with code at ms.
func exited(rank, code, ms int) supervisor.Outcome {
	return supervisor.Outcome{Rank: rank, LocalRank: rank, PID: 100 + rank,
		Exit: &supervisor.WorkerExitError{Rank: rank, LocalRank: rank, PID: 100 + rank, Code: code, Time: at(ms)}}
}

func running(rank int) supervisor.Outcome {
	return supervisor.Outcome{Rank: rank, LocalRank: rank, PID: 100 + rank}
}

// noted adds a note: peer failed o's collective (kind) at ms.
func noted(o supervisor.Outcome, peer int, kind string, ms int) supervisor.Outcome {
	o.Peer = &supervisor.PeerFailure{Peer: peer, Kind: kind, Time: at(ms), Message: "peer " + kind}
	return o
}

// closedAt adds when o last closed a communicator.
func closedAt(o supervisor.Outcome, ms int) supervisor.Outcome {
	o.Closed = at(ms)
	return o
}

// raisedAt adds when o wrote its error file.
func raisedAt(o supervisor.Outcome, ms int) supervisor.Outcome {
	o.Raised = at(ms)
	return o
}

func killed(rank, ms int) supervisor.Outcome {
	o := exited(rank, -1, ms)
	o.Exit.Signal = syscall.SIGKILL
	return o
}

// TestBlame: the root cause is the earliest failure that is not a
// victim's, whatever order the workers exited in.
func TestBlame(t *testing.T) {
	later := at(10_000)
	tests := []struct {
		name    string
		outs    []supervisor.Outcome
		cutoff  time.Time
		root    int
		local   bool
		exit    bool // the root's exit is known
		victims []int
		others  []int
		reason  []string // in the reason, in this order
	}{
		{name: "victim exited first, root still tearing down",
			outs: []supervisor.Outcome{running(0), noted(exited(1, 1, 700), 0, "closed", 500)},
			root: 0, local: true, victims: []int{1},
			reason: []string{"worker rank 0 closed its communicator and has not exited yet", "; rank 1 failed only because rank 0 closed its communicator"}},
		{name: "victim exited first, root exited since",
			outs: []supervisor.Outcome{exited(0, 1, 1500), noted(exited(1, 1, 700), 0, "closed", 500)},
			root: 0, local: true, exit: true, victims: []int{1},
			reason: []string{"worker rank 0 (local rank 0, pid 100) exited with code 1", "; rank 1 failed only because rank 0 closed its communicator"}},
		{name: "root exited cleanly after closing early",
			outs: []supervisor.Outcome{exited(0, 0, 1500), noted(exited(1, 1, 700), 0, "closed", 500)},
			root: 0, local: true, exit: true, victims: []int{1},
			reason: []string{"exited with code 0", "rank 1 failed only because"}},
		{name: "killed",
			outs: []supervisor.Outcome{killed(0, 100), noted(exited(1, 1, 600), 0, "lost", 110)},
			root: 0, local: true, exit: true, victims: []int{1},
			reason: []string{"killed by signal 9", "rank 1 failed only because rank 0 dropped its connection"}},
		{name: "a chain in a ring of three",
			outs: []supervisor.Outcome{exited(0, 1, 2000), noted(exited(1, 1, 700), 0, "closed", 500), noted(exited(2, 1, 650), 1, "lost", 600)},
			root: 0, local: true, exit: true, victims: []int{1, 2},
			reason: []string{"rank 1 failed only because rank 0 closed", "rank 2 failed only because rank 1 dropped"}},
		{name: "two victims of one rank",
			outs:   []supervisor.Outcome{running(0), noted(exited(1, 1, 700), 0, "aborted", 500), noted(exited(2, 1, 650), 0, "aborted", 520)},
			cutoff: at(800), root: 0, local: true, victims: []int{1, 2},
			reason: []string{"; ranks 1, 2 failed only because rank 0 aborted its communicator"}},
		{name: "the echo of a failure does not close a cycle",
			outs: []supervisor.Outcome{noted(exited(0, 1, 1500), 1, "lost", 900), noted(exited(1, 1, 700), 0, "closed", 500)},
			root: 0, local: true, exit: true, victims: []int{1}},
		{name: "the root is another node's",
			outs: []supervisor.Outcome{noted(exited(3, 1, 700), 0, "closed", 500), running(2)},
			root: 0, victims: []int{3},
			reason: []string{"rank 0 (a worker of another node) closed its communicator", "; rank 3 failed only because rank 0"}},
		{name: "no notes: the first exit",
			outs: []supervisor.Outcome{exited(0, 1, 900), exited(1, 2, 300), running(2)},
			root: 1, local: true, exit: true, others: []int{0},
			reason: []string{"worker rank 1 (local rank 1, pid 101) exited with code 2"}},
		{name: "an independent failure before",
			outs: []supervisor.Outcome{exited(0, 1, 1000), noted(exited(1, 1, 700), 0, "closed", 500), exited(2, 1, 400)},
			root: 2, local: true, exit: true, victims: []int{1}, others: []int{0}},
		{name: "notes after the cutoff are the agent's stopping",
			outs:   []supervisor.Outcome{exited(0, 1, 900), noted(exited(1, 1, 700), 0, "aborted", 950)},
			cutoff: at(920), root: 1, local: true, exit: true, others: []int{0}},
		{name: "exits after the cutoff are the agent's stopping",
			outs:   []supervisor.Outcome{exited(0, 1, 900), killed(1, 1000)},
			cutoff: at(920), root: 0, local: true, exit: true},
		{name: "only victims of an unknown peer",
			outs: []supervisor.Outcome{running(0), noted(exited(1, 1, 700), -1, "closed", 500)},
			root: 1, local: true, exit: true,
			reason: []string{"exited with code 1 after a peer (a rank of a smaller communicator) closed its communicator"}},
		{name: "the root's close comes before a chain through another node",
			outs: []supervisor.Outcome{noted(exited(2, 1, 700), 1, "lost", 600), closedAt(exited(3, 1, 2000), 400)},
			root: 3, local: true, exit: true, victims: []int{2},
			reason: []string{"worker rank 3 (local rank 3, pid 103) exited with code 1", "; rank 2 failed only because rank 1 dropped"}},
		{name: "without the close, the exit is too late to tell",
			outs: []supervisor.Outcome{noted(exited(2, 1, 700), 1, "lost", 600), exited(3, 1, 2000)},
			root: 1, victims: []int{2}, others: []int{3}},
		{name: "a note after its own close is an echo",
			outs: []supervisor.Outcome{closedAt(noted(running(0), 7, "lost", 900), 300), noted(exited(1, 1, 700), 7, "lost", 500)},
			root: 0, local: true, victims: []int{1}},
		{name: "no notes: the first to raise, though it exited last",
			outs: []supervisor.Outcome{raisedAt(exited(0, 1, 2400), 300), raisedAt(exited(1, 1, 2350), 2320)},
			root: 0, local: true, exit: true, others: []int{1},
			reason: []string{"worker rank 0 (local rank 0, pid 100) exited with code 1"}},
		{name: "no notes: the first to raise, still tearing down",
			outs: []supervisor.Outcome{raisedAt(running(0), 300), raisedAt(exited(1, 1, 2350), 2320)},
			root: 0, local: true, others: []int{1},
			reason: []string{"worker rank 0 raised and has not exited yet"}},
		{name: "an error file after the cutoff is the agent's stopping",
			outs:   []supervisor.Outcome{raisedAt(running(0), 950), exited(1, 1, 900)},
			cutoff: at(920), root: 1, local: true, exit: true},
		{name: "a tie goes to the lower rank",
			outs: []supervisor.Outcome{exited(2, 1, 500), exited(1, 1, 500)},
			root: 1, local: true, exit: true, others: []int{2}},
	}
	rng := rand.New(rand.NewPCG(16, 1))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cutoff := tc.cutoff
			if cutoff.IsZero() {
				cutoff = later
			}
			for range 5 { // the order of the outcomes does not matter
				outs := slices.Clone(tc.outs)
				rng.Shuffle(len(outs), func(i, j int) { outs[i], outs[j] = outs[j], outs[i] })
				slices.SortFunc(outs, func(a, b supervisor.Outcome) int { return a.LocalRank - b.LocalRank })
				b := Decide(outs, cutoff)
				checkBlame(t, b, tc.root, tc.local, tc.exit, tc.victims, tc.others)
				r := b.Reason()
				pos := 0
				for _, want := range tc.reason {
					i := strings.Index(r[pos:], want)
					if i < 0 {
						t.Fatalf("reason %q lacks %q (after position %d)", r, want, pos)
					}
					pos += i + len(want)
				}
			}
		})
	}
}

func checkBlame(t *testing.T, b Blame, root int, local, exit bool, victims, others []int) {
	t.Helper()
	var gotOthers []int
	for _, e := range b.Others {
		gotOthers = append(gotOthers, e.Rank)
	}
	if b.Root != root || b.Local != local || (b.Exit != nil) != exit || !slices.Equal(b.VictimRanks(), victims) ||
		!slices.Equal(gotOthers, others) {
		t.Fatalf("got root %d local %v exit %v victims %v others %v; want root %d local %v exit %v victims %v others %v",
			b.Root, b.Local, b.Exit != nil, b.VictimRanks(), gotOthers, root, local, exit, victims, others)
	}
	if b.Exit != nil && b.Exit.Rank != root {
		t.Fatalf("the root's exit is rank %d's", b.Exit.Rank)
	}
}

// TestBlameRandom: seeded random failures of one rank in worlds of 2 to 8
// ranks, its peers failing in cascades (each on the root or on a rank
// that failed before it) and exiting in any order, the root often last or
// not yet: the root cause is always the rank that failed first, every
// other failed rank its victim. Half the trials look from one node that
// holds the root and some of the others: victims there may name ranks of
// other nodes, which failed before them but after the root closed its
// communicator or died.
func TestBlameRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 2))
	kinds := []string{"closed", "lost", "aborted"}
	for trial := range 4000 {
		n := 2 + rng.IntN(7)
		root := rng.IntN(n)
		order := rng.Perm(n) // who noticed when: the root first
		order = append([]int{root}, slices.DeleteFunc(order, func(r int) bool { return r == root })...)
		outs := make([]supervisor.Outcome, n)
		switch rng.IntN(3) {
		case 0: // it raised, closed its communicator at exit, and is still tearing down
			outs[root] = closedAt(running(root), 90)
		case 1: // the same, and it has exited since
			outs[root] = closedAt(exited(root, rng.IntN(3), 100+rng.IntN(3000)), 90)
		default: // it died
			outs[root] = killed(root, 90)
		}
		for i, r := range order[1:] {
			peer := order[rng.IntN(i+1)] // the root or an earlier victim
			noticed := 100 + 50*(i+1) + rng.IntN(40)
			outs[r] = noted(exited(r, 1, noticed+rng.IntN(2000)), peer, kinds[rng.IntN(3)], noticed)
			if rng.IntN(4) == 0 { // still running
				outs[r].Exit = nil
			}
		}
		// A victim's echo: the root's own note, after its close, naming a victim.
		if !outs[root].Closed.IsZero() && rng.IntN(3) == 0 {
			outs[root].Peer = &supervisor.PeerFailure{Peer: order[1], Kind: "lost", Time: at(5000)}
		}
		if trial%2 == 1 { // one node's view: the root and some others
			outs = slices.DeleteFunc(outs, func(o supervisor.Outcome) bool { return o.Rank != root && rng.IntN(2) == 0 })
		}
		var want []int
		failed := false
		for _, o := range outs {
			if o.Rank != root {
				want = append(want, o.Rank)
			}
			failed = failed || o.Exit != nil && o.Exit.Failed()
		}
		if !failed { // the agent works out a root cause when a worker of its node failed
			continue
		}
		b := Decide(outs, at(10_000))
		if b.Root != root || !b.Local || !slices.Equal(b.VictimRanks(), want) || len(b.Others) != 0 {
			t.Fatalf("trial %d, %d ranks, root %d: got root %d victims %v others %d\n%s", trial, n, root, b.Root, b.VictimRanks(),
				len(b.Others), b.Reason())
		}
	}
}

// TestBlameAgain: the report keeps the decided root while more victims
// show up once the workers have stopped.
func TestBlameAgain(t *testing.T) {
	outs := []supervisor.Outcome{killed(0, 3000), noted(exited(1, 1, 700), 0, "closed", 500), noted(killed(2, 3000), 0, "closed", 900)}
	b := Reclassify(outs, at(1000), Blame{Root: 0, At: at(500)})
	checkBlame(t, b, 0, true, true, []int{1, 2}, nil)
}

// TestFormatReport: the report names the root cause first, with its last
// words, and lists the victims as such.
func TestFormatReport(t *testing.T) {
	root := exited(0, 1, 1500)
	root.Exit.ErrorFile = &supervisor.ErrorFile{Message: "RuntimeError: injected failure", Traceback: "Traceback:\n  line 1"}
	root.Exit.StderrTail = []string{"RuntimeError: injected failure"}
	outs := []supervisor.Outcome{root, noted(exited(1, 1, 700), 0, "closed", 500), exited(2, 1, 900)}
	b := Decide(outs, at(2000))
	mon := hostmon.NewMonitor(slog.New(slog.DiscardHandler))
	got := Format(b, 0, 1, t0, map[int]int{0: 100, 1: 101, 2: 102}, mon)
	pos := 0
	for _, want := range []string{
		"root cause (attempt 0, restarts used 0 of 1)",
		"\n  worker rank 0 (local rank 0, pid 100) exited with code 1, 1.5s after start\n",
		"error file: RuntimeError: injected failure",
		"last 1 stderr lines of rank 0",
		"failed only because of another rank (victims, not root causes):\n    rank 1 failed only because rank 0 closed its communicator\n",
		"    rank 1: peer closed\n",
		"also failed, later:\n    worker rank 2 (local rank 2, pid 102) exited with code 1, 900ms after start\n",
		"workers at failure:\n    rank 0 pid 100: not sampled yet",
	} {
		i := strings.Index(got[pos:], want)
		if i < 0 {
			t.Fatalf("report lacks %q (after position %d):\n%s", want, pos, got)
		}
		pos += i + len(want)
	}

	// Another node's rank: named, and the reader pointed at its node.
	b = Decide([]supervisor.Outcome{noted(exited(3, 1, 700), 0, "lost", 500)}, at(2000))
	got = Format(b, 1, 1, t0, map[int]int{3: 103}, mon)
	for _, want := range []string{"\n  rank 0 (a worker of another node) dropped its connection", "its own node's agent reports it",
		"rank 3 failed only because rank 0 dropped its connection"} {
		if !strings.Contains(got, want) {
			t.Fatalf("report lacks %q:\n%s", want, got)
		}
	}
}

// TestFormatPendingSpare: a rank whose warm spare the others never
// re-formed with is reported by its dead worker's death, and the report
// says a spare took it (supervisor's Outcomes, before Settled).
func TestFormatPendingSpare(t *testing.T) {
	root := exited(0, -1, 700)
	root.Exit.Signal, root.Exit.SparePID = syscall.SIGKILL, 205
	b := Decide([]supervisor.Outcome{root, noted(exited(1, 1, 900), 0, "lost", 750)}, at(2000))
	got := Format(b, 0, 0, t0, map[int]int{0: 205, 1: 101}, hostmon.NewMonitor(slog.New(slog.DiscardHandler)))
	for _, want := range []string{
		"\n  worker rank 0 (local rank 0, pid 100) killed by signal 9 (killed), 700ms after start\n" +
			"  a warm spare (pid 205) took its rank, and the other workers never re-formed with it (a script without ddp_agent.InProcess cannot)\n",
		"rank 1 failed only because rank 0 dropped its connection",
	} {
		if !strings.Contains(got, want) {
			t.Fatalf("report lacks %q:\n%s", want, got)
		}
	}
}

// TestBlameElsewhere: when another node's agent told the rendezvous
// first, its reason is the root cause here too.
func TestBlameElsewhere(t *testing.T) {
	b := Decide([]supervisor.Outcome{noted(exited(2, 1, 700), 1, "lost", 500), noted(exited(3, 1, 720), 2, "lost", 600)}, at(2000))
	b.Elsewhere = "node a (a, group rank 0): worker rank 0 (local rank 0, pid 7) exited with code 1"
	want := "the job moved to a new generation first: node a (a, group rank 0): worker rank 0 (local rank 0, pid 7) exited with code 1" +
		"; rank 2 failed only because rank 1 dropped its connection (it died, or its communicator failed)" +
		"; rank 3 failed only because rank 2 dropped its connection (it died, or its communicator failed)"
	if got := b.Reason(); got != want {
		t.Errorf("reason:\n got %s\nwant %s", got, want)
	}
	if again := Reclassify(nil, at(2000), b); again.Elsewhere != b.Elsewhere {
		t.Errorf("blameAgain lost the other node's reason")
	}
}

// TestBlameAt: the root is first seen failing at the earliest sign of it.
func TestBlameAt(t *testing.T) {
	for _, tc := range []struct {
		name string
		outs []supervisor.Outcome
		want time.Time
	}{
		{"its exit", []supervisor.Outcome{exited(0, 1, 900), running(1)}, at(900)},
		{"its close", []supervisor.Outcome{closedAt(exited(0, 1, 900), 300), running(1)}, at(300)},
		{"a victim's note", []supervisor.Outcome{exited(0, 1, 900), noted(exited(1, 1, 800), 0, "closed", 350)}, at(350)},
		{"its close, still running", []supervisor.Outcome{closedAt(running(0), 340), noted(exited(1, 1, 800), 0, "closed", 350)}, at(340)},
		{"a close after the cutoff", []supervisor.Outcome{closedAt(running(0), 9000), noted(exited(1, 1, 800), 0, "closed", 350)}, at(350)},
	} {
		if b := Decide(tc.outs, at(5000)); b.Root != 0 || !b.At.Equal(tc.want) {
			t.Errorf("%s: root %d at %v, want rank 0 at %v", tc.name, b.Root, b.At, tc.want)
		}
	}
}

// TestLostPeer: a failure without notes whose last words say a peer's
// connection was lost, once the job moved on for a lost node, has that
// node as root cause and this node's failed workers as its victims, in
// the decision and again in the report's reclassification.
func TestLostPeer(t *testing.T) {
	gloo := exited(0, 1, 10)
	gloo.Exit.StderrTail = []string{"RuntimeError: [./gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:26532"}
	own := exited(0, 1, 10)
	own.Exit.StderrTail = []string{"ValueError: bad batch"}
	store := exited(0, 1, 10) // torch 2.x's TCP store, in its error file
	store.Exit.ErrorFile = &supervisor.ErrorFile{Message: "ReformError: the workers' store failed (Failed to recv, got 0 bytes. Connection was likely closed.)"}
	if !LooksLikeLostPeer(gloo.Exit) || !LooksLikeLostPeer(store.Exit) || LooksLikeLostPeer(own.Exit) || LooksLikeLostPeer(running(1).Exit) {
		t.Fatal("LooksLikeLostPeer: want true for gloo's and the store's lost connections only")
	}
	outs := []supervisor.Outcome{gloo, exited(1, 1, 20)}
	b := Decide(outs, at(30))
	if !b.NoNotes() {
		t.Fatalf("Decide = %+v, want a local root without notes", b)
	}
	const reason = "node n1 (h1, group rank 1) lost: its agent is gone or cut off (lease ended)"
	lost := b.LostPeer(reason)
	again := Reclassify(outs, at(30), lost)
	for _, b := range []Blame{lost, again} {
		if b.Local || b.Exit != nil || len(b.Victims) != 2 || b.Victims[0].Rank != 0 || b.Victims[1].Rank != 1 {
			t.Errorf("blame %+v, want ranks 0 and 1 victims of the lost node", b)
		}
		want := "the job moved to a new generation first: " + reason + "; ranks 0, 1 failed only because a worker of the lost node dropped its connection"
		if !strings.HasPrefix(b.Reason(), want) {
			t.Errorf("Reason() = %q, want it to start %q", b.Reason(), want)
		}
	}
	text := Format(again, 0, 3, t0, map[int]int{0: 100, 1: 101}, hostmon.NewMonitor(slog.New(slog.DiscardHandler)))
	if strings.Contains(text, "its own node's agent reports it") {
		t.Errorf("the report says the lost node's agent reports it:\n%s", text)
	}
}

// TestLostNodeVictims: when the job moved on for a lost node before this
// node decided a failure of its own, its workers that failed by then, or
// after on a lost connection, are that node's victims; a worker the stop
// killed is not, and with no failure there is nothing to report.
func TestLostNodeVictims(t *testing.T) {
	const reason = "node n1 (h1, group rank 1) lost: its agent is gone or cut off (lease ended)"
	lostLate := exited(1, 1, 80) // raised before the stop, exited after it
	lostLate.Exit.StderrTail = []string{"RuntimeError: [./gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:26532"}
	stopped := exited(2, -15, 90)
	b, ok := LostNodeVictims([]supervisor.Outcome{exited(0, 1, 10), lostLate, stopped}, at(50), reason)
	if !ok || b.Local || b.Exit != nil || len(b.Victims) != 2 || b.Victims[0].Rank != 0 || b.Victims[1].Rank != 1 {
		t.Fatalf("blame %+v, want ranks 0 and 1 victims of the lost node", b)
	}
	want := "the job moved to a new generation first: " + reason + "; ranks 0, 1 failed only because a worker of the lost node dropped its connection"
	if !strings.HasPrefix(b.Reason(), want) {
		t.Errorf("Reason() = %q, want it to start %q", b.Reason(), want)
	}
	if b, ok := LostNodeVictims([]supervisor.Outcome{stopped, running(3)}, at(50), reason); ok {
		t.Errorf("workers the stop ended: blame %+v, want none", b)
	}
}
