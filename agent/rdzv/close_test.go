package rdzv

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestDecideClose(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	rule := closeRule{Min: 2, Max: 4, LastCall: 5 * time.Second}
	joined := func(nodes ...string) []JoinInfo {
		var js []JoinInfo
		for _, n := range nodes {
			js = append(js, JoinInfo{Node: n, NProc: 1})
		}
		return js
	}
	live := func(nodes ...string) []NodeInfo {
		var ns []NodeInfo
		for _, n := range nodes {
			ns = append(ns, NodeInfo{Node: n, State: NodeActive})
		}
		return ns
	}
	leaving := append(live("a", "b"), NodeInfo{Node: "s", State: NodeSucceeded}, NodeInfo{Node: "l", State: NodeLeft})
	tests := []struct {
		name        string
		v           roundView
		wantAction  closeAction
		wantWhy     string
		wantSince   time.Time
		wantAwaited []int
	}{
		{name: "below min: wait, no last call yet",
			v:          roundView{Joiners: joined("a"), Live: live("a", "b"), Now: t0, Deadline: t0.Add(time.Minute)},
			wantAction: waitForMore, wantAwaited: []int{1}},
		{name: "below min again: the last call starts over",
			v:          roundView{Joiners: joined("a"), MinSince: t0.Add(-time.Second), Now: t0, Deadline: t0.Add(time.Minute)},
			wantAction: waitForMore},
		{name: "min reached: the last call starts now",
			v:          roundView{Joiners: joined("a", "b"), Live: live("a", "b", "c"), Now: t0, Deadline: t0.Add(time.Minute)},
			wantAction: waitForMore, wantSince: t0, wantAwaited: []int{2}},
		{name: "min reached, last call running",
			v:          roundView{Joiners: joined("a", "b"), MinSince: t0.Add(-4 * time.Second), Now: t0, Deadline: t0.Add(time.Minute)},
			wantAction: waitForMore, wantSince: t0.Add(-4 * time.Second)},
		{name: "last call ended",
			v:          roundView{Joiners: joined("a", "b"), Live: live("a", "b", "c"), MinSince: t0.Add(-5 * time.Second), Now: t0, Deadline: t0.Add(time.Minute)},
			wantAction: closeNow, wantWhy: "last call ended", wantSince: t0.Add(-5 * time.Second), wantAwaited: []int{2}},
		{name: "max joined closes at once",
			v:          roundView{Joiners: joined("a", "b", "c", "d"), Live: live("a", "b", "c", "d", "e"), Now: t0, Deadline: t0.Add(time.Minute)},
			wantAction: closeNow, wantWhy: "all nodes joined", wantSince: t0, wantAwaited: []int{4}},
		{name: "first round waits for the last call although every live node joined",
			v:          roundView{Joiners: joined("a", "b"), Live: live("a", "b"), Now: t0, Deadline: t0.Add(time.Minute)},
			wantAction: waitForMore, wantSince: t0},
		{name: "re-formation: every live node joined",
			v:          roundView{Joiners: joined("a", "b"), Live: live("a", "b"), Reformation: true, Now: t0, Deadline: t0.Add(time.Minute)},
			wantAction: closeNow, wantWhy: "every live node joined", wantSince: t0},
		{name: "re-formation: nodes that succeeded or left are not waited for",
			v:          roundView{Joiners: joined("a", "b"), Live: leaving, Reformation: true, Now: t0, Deadline: t0.Add(time.Minute)},
			wantAction: closeNow, wantWhy: "every live node joined", wantSince: t0},
		{name: "re-formation below min waits for a live node",
			v:          roundView{Joiners: joined("a"), Live: live("a", "b"), Reformation: true, Now: t0, Deadline: t0.Add(time.Minute)},
			wantAction: waitForMore, wantAwaited: []int{1}},
		{name: "re-formation waits for a live node that has not joined",
			v:          roundView{Joiners: joined("a", "b"), Live: live("c", "a", "b"), Reformation: true, Now: t0, Deadline: t0.Add(time.Minute)},
			wantAction: waitForMore, wantSince: t0, wantAwaited: []int{0}},
		{name: "deadline passed below min",
			v:          roundView{Joiners: joined("a"), Live: live("a", "b"), Now: t0.Add(time.Minute + time.Nanosecond), Deadline: t0.Add(time.Minute)},
			wantAction: joinTimedOut, wantAwaited: []int{1}},
		{name: "deadline passed with min joined and the last call running",
			v:          roundView{Joiners: joined("a", "b"), MinSince: t0, Now: t0.Add(time.Second), Deadline: t0},
			wantAction: joinTimedOut, wantSince: t0},
		{name: "a rule to close wins over the deadline",
			v:          roundView{Joiners: joined("a", "b", "c", "d"), Now: t0.Add(time.Hour), Deadline: t0},
			wantAction: closeNow, wantWhy: "all nodes joined", wantSince: t0.Add(time.Hour)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := decideClose(tc.v, rule)
			if d.Action != tc.wantAction || d.Why != tc.wantWhy {
				t.Fatalf("got %v %q, want %v %q", d.Action, d.Why, tc.wantAction, tc.wantWhy)
			}
			if !d.Since.Equal(tc.wantSince) {
				t.Fatalf("got since %v, want %v", d.Since, tc.wantSince)
			}
			if !slices.Equal(d.Awaited, tc.wantAwaited) {
				t.Fatalf("got awaited %v, want %v", d.Awaited, tc.wantAwaited)
			}
			if d.Joined != len(tc.v.Joiners) {
				t.Fatalf("got joined %d, want %d", d.Joined, len(tc.v.Joiners))
			}
		})
	}
}

func TestClosedRound(t *testing.T) {
	j := func(node string, rev int64, port int) joiner {
		return joiner{JoinInfo: JoinInfo{Node: node, Addr: node + ".addr", NProc: 2, MasterPort: port}, rev: rev}
	}
	prev := []Member{{Node: "a", GroupRank: 0}, {Node: "b", GroupRank: 1}}
	tests := []struct {
		name     string
		prev     []Member
		joiners  []joiner
		max      int
		want     string
		wantPort int
	}{
		{"first round: the earliest joiner is rank 0 and offers the port", nil, []joiner{j("y", 7, 2002), j("x", 3, 2001)}, 4, "x y", 2001},
		{"a survivor keeps rank 0 and its port", prev, []joiner{j("n", 1, 3000), j("b", 2, 3001), j("a", 9, 3002)}, 4, "a b n", 3002},
		{"rank 0 lost: the newcomer that fills it offers the port", prev, []joiner{j("n", 1, 3000), j("b", 2, 3001)}, 4, "n b", 3000},
		{"spares beyond max stay out", nil, []joiner{j("p", 1, 1), j("q", 2, 2), j("r", 3, 3)}, 2, "p q", 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			joiners := slices.Clone(tc.joiners)
			ms, master, _ := closedRound(tc.prev, tc.joiners, tc.max)
			port := master.MasterPort
			var got string
			for i, m := range ms {
				if i > 0 {
					got += " "
				}
				got += m.Node
			}
			if got != tc.want || port != tc.wantPort {
				t.Fatalf("got %q port %d, want %q port %d", got, port, tc.want, tc.wantPort)
			}
			if !slices.Equal(joiners, tc.joiners) {
				t.Fatalf("got joiners reordered to %v, want them untouched", tc.joiners)
			}
		})
	}
}

func TestRunningState(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	st := State{Generation: 7, Phase: Joining, Reason: "node x lost", Since: t0.Add(-time.Minute), Failures: 2, MaxRestarts: 3,
		Members: []Member{{Node: "old"}}, MembersKey: "old-members", AssignPrefix: "old-assign/"}
	members := []Member{
		{Node: "a", Addr: "10.0.0.1", GroupRank: 0, NProc: 4, RankOffset: 0},
		{Node: "b", Addr: "10.0.0.2", GroupRank: 1, NProc: 2, RankOffset: 4},
	}
	got := runningState(st, members, JoinInfo{Node: "a", MasterPort: 29500, AgentStore: true}, nil, "members/7/a", "assign/7/a/", t0)
	want := State{Generation: 7, Phase: Running, Reason: "node x lost", Since: t0, Failures: 2, MaxRestarts: 3,
		NNodes: 2, MembersKey: "members/7/a", AssignPrefix: "assign/7/a/", WorldSize: 6, MasterAddr: "10.0.0.1", MasterPort: 29500,
		AgentStore: true, MasterNode: "a"}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if err := got.check(); err != nil {
		t.Fatalf("got a state that fails its check: %v", err)
	}
}

// TestRunningStateOwed: a lost node's failure, owed since the bump while
// the workers might carry on past it in process, is counted when the
// round closes without carrying them (and fails a job without restarts
// left), and forgiven when it carries them.
func TestRunningStateOwed(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	members := []Member{{Node: "a", Addr: "10.0.0.1", GroupRank: 0, NProc: 2}}
	for _, tc := range []struct {
		name         string
		agentStore   bool // group rank 0's join: its agent serves the store (then the round carries)
		maxRestarts  int
		wantFailures int
		wantPhase    Phase
	}{
		{"carried: no restart", true, 0, 0, Running},
		{"restarted, restarts left", false, 1, 1, Running},
		{"restarted, none left", false, 0, 1, Failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := State{Generation: 7, Phase: Joining, Reason: "node x lost", End: RoundEnd{Kind: EndNodeLost, Node: "x"},
				Since: t0, MaxRestarts: tc.maxRestarts, Owed: true, LastStore: "a:29500"}
			got := runningState(st, members, JoinInfo{Node: "a", MasterPort: 29500, AgentStore: tc.agentStore}, nil, "m", "a/", t0)
			if got.Owed || got.Failures != tc.wantFailures || got.Phase != tc.wantPhase || got.Carry != tc.agentStore {
				t.Fatalf("got owed %v, failures %d, phase %s, carry %v; want failures %d, phase %s",
					got.Owed, got.Failures, got.Phase, got.Carry, tc.wantFailures, tc.wantPhase)
			}
			if tc.wantPhase == Failed && !strings.Contains(got.Reason, "no restarts left (--max-restarts 0)") {
				t.Errorf("reason %q", got.Reason)
			}
		})
	}
}

// TestClosedRoundPlain: closedRound names the members whose agents would
// serve no store (no --spares), in group rank order; a joiner left out of
// the round is not one.
func TestClosedRoundPlain(t *testing.T) {
	j := func(node string, rev int64, store bool) joiner {
		return joiner{JoinInfo: JoinInfo{Node: node, NProc: 2, MasterPort: 4000, AgentStore: store}, rev: rev}
	}
	prev := []Member{{Node: "a", GroupRank: 0}, {Node: "b", GroupRank: 1}}
	_, master, plain := closedRound(prev, []joiner{j("c", 1, false), j("b", 2, true), j("a", 3, true), j("d", 4, false)}, 3)
	if !master.AgentStore || master.Node != "a" || !slices.Equal(plain, []string{"c"}) {
		t.Fatalf("got master %+v, plain %q; want a's join, and [c] (d stays out)", master, plain)
	}
	_, _, plain = closedRound(nil, []joiner{j("x", 1, false), j("y", 2, true), j("z", 3, false)}, 3)
	if !slices.Equal(plain, []string{"x", "z"}) {
		t.Fatalf("got plain %q, want [x z]", plain)
	}
}

// TestPlainNodesNeverCarry: a round whose nodes differ in --spares names
// those without it, and never carries workers on, since theirs can neither
// wait in a re-formation nor join one; where all agree it names none.
func TestPlainNodesNeverCarry(t *testing.T) {
	st := State{Generation: 3, Phase: Joining, End: RoundEnd{Kind: EndNodeJoined, Node: "c"}, LastStore: "a:4000"}
	members := []Member{{Node: "a", NProc: 2}, {Node: "b", GroupRank: 1, NProc: 2, RankOffset: 2}, {Node: "c", GroupRank: 2, NProc: 2, RankOffset: 4}}
	master := JoinInfo{Node: "a", MasterPort: 4000, AgentStore: true}
	for _, tc := range []struct {
		name      string
		plain     []string
		master    JoinInfo
		wantPlain string
		wantCarry bool
	}{
		{"every node under --spares", nil, master, "", true},
		{"one without", []string{"c"}, master, "node c", false},
		{"group rank 0 without", []string{"a"}, JoinInfo{Node: "a", MasterPort: 4000}, "node a", false},
		{"none under --spares", []string{"a", "b", "c"}, JoinInfo{Node: "a", MasterPort: 4000}, "", false},
	} {
		got := runningState(st, members, tc.master, tc.plain, "m", "a/", time.Time{})
		if got.PlainNodes != tc.wantPlain || got.Carry != tc.wantCarry {
			t.Errorf("%s: got plain %q carry %v, want %q %v", tc.name, got.PlainNodes, got.Carry, tc.wantPlain, tc.wantCarry)
		}
	}
}

func TestNodeList(t *testing.T) {
	for _, tc := range []struct {
		nodes []string
		want  string
	}{
		{[]string{"a"}, "node a"},
		{[]string{"a", "b"}, "nodes a, b"},
		{[]string{"a", "b", "c"}, "nodes a, b, c"},
		{[]string{"a", "b", "c", "d", "e"}, "nodes a, b, c and 2 more"},
	} {
		if got := nodeList(tc.nodes); got != tc.want {
			t.Errorf("nodeList(%q) = %q, want %q", tc.nodes, got, tc.want)
		}
	}
}

// TestCarries: the workers carry on into a round after a change of the
// job's nodes, where the last round ran with an agent's store and this
// one's agent serves one too: the same store, or a new one where the
// store's node left.
func TestCarries(t *testing.T) {
	st := func(kind EndKind, last string) State {
		return State{End: RoundEnd{Kind: kind, Node: "x"}, LastStore: last}
	}
	master := JoinInfo{Node: "a", MasterPort: 4000, AgentStore: true}
	for _, tc := range []struct {
		name   string
		st     State
		master JoinInfo
		want   bool
	}{
		{"a node lost", st(EndNodeLost, "a:4000"), master, true},
		{"a node left", st(EndNodeLeft, "a:4000"), master, true},
		{"a node joined", st(EndNodeJoined, "a:4000"), master, true},
		{"a worker's fault", st(EndRestart, "a:4000"), master, false},
		{"the store's node lost: another serves a new one", st(EndNodeLost, "x:4000"),
			JoinInfo{Node: "b", MasterPort: 4001, AgentStore: true}, true},
		{"no store of the agent's before", st(EndNodeLost, ""), master, false},
		{"rank 0's worker serves it now", st(EndNodeLost, "a:4000"), JoinInfo{Node: "a", MasterPort: 4000}, false},
	} {
		if got := carries(tc.st, tc.master); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}
