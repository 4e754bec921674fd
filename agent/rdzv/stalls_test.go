package rdzv

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

func publish(t *testing.T, e *Etcd, s NodeStalls) {
	t.Helper()
	if err := e.PublishStalls(t.Context(), s); err != nil {
		t.Fatalf("PublishStalls: %v", err)
	}
}

// stallKeys counts the job's stalls/ keys.
func stallKeys(t *testing.T, cli *store.Client) int64 {
	t.Helper()
	resp, err := cli.Etcd().Get(t.Context(), Prefix(RootPrefix, "job")+stallsDir, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

func TestPublishStallsReadBack(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 1, 1)
	a := open(t, dial(), cfg)
	nextAll(t, a)
	cli := dial()

	var lines []string
	for i := range 12 {
		lines = append(lines, fmt.Sprintf("step %d bucket 3: rank 1 (h, GPU 1, pid 4411) arrived 2.31 s after the others; 1 ranks waited 2.3 GPU-seconds", 800+i))
	}
	lines[10] = "step 810 " + strings.Repeat("é", 400) // 809 bytes
	in := NodeStalls{
		Stalls:     lines,
		Stragglers: []StragglerInfo{{Rank: 1, Host: "h", GPU: "GPU-5c1e", Last: 15, Steps: 20}},
		Hang:       "step 9 bucket 2 (generation 0) has not finished 30.00 s after the first rank arrived\nPython stack of rank 1:\n...",
	}
	before := time.Now()
	publish(t, a, in)

	s := readStatus(t, cli, RootPrefix, "job")
	n := nodeOf(t, s, a.Node())
	if n.Role != RoleRunning || len(s.Malformed) != 0 {
		t.Fatalf("node %+v, malformed %+v", n, s.Malformed)
	}
	got := n.Stalls
	if got == nil {
		t.Fatalf("no stalls read back: %+v", n)
	}
	if got.Updated.Before(before.Add(-time.Second)) || got.Updated.After(time.Now()) {
		t.Errorf("updated %v, want about %v", got.Updated, before)
	}
	if len(got.Stalls) != MaxStallLines || got.Stalls[0] != lines[2] || got.Stalls[9] != lines[11] {
		t.Errorf("stalls %q, want the last %d of %d", got.Stalls, MaxStallLines, len(lines))
	}
	if long := got.Stalls[8]; len(long) > MaxStallLineBytes || !utf8.ValidString(long) || !strings.HasPrefix(long, "step 810 éé") || !strings.HasSuffix(long, "…") {
		t.Errorf("long line: %d bytes, %q", len(long), long)
	}
	if !slices.Equal(got.Stragglers, in.Stragglers) {
		t.Errorf("stragglers %+v, want %+v", got.Stragglers, in.Stragglers)
	}
	if want := "step 9 bucket 2 (generation 0) has not finished 30.00 s after the first rank arrived"; got.Hang != want {
		t.Errorf("hang %q, want %q", got.Hang, want)
	}
	if len(in.Stalls) != 12 || in.Stalls[10] != lines[10] || !in.Updated.IsZero() {
		t.Errorf("the caller's value changed: %+v", in)
	}

	// A later report replaces the last, on the lease of the node entry.
	publish(t, a, NodeStalls{Updated: before, Hang: "step 10 bucket 0 hung"})
	s = readStatus(t, cli, RootPrefix, "job")
	n = nodeOf(t, s, a.Node())
	if g := n.Stalls; g == nil || !g.Updated.Equal(before) || len(g.Stalls) != 0 || len(g.Stragglers) != 0 || g.Hang != "step 10 bucket 0 hung" {
		t.Fatalf("second report: %+v", n.Stalls)
	}
	resp, err := cli.Etcd().Get(t.Context(), Prefix(RootPrefix, "job")+stallsDir+a.Node())
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease != n.Entry.Lease || n.Entry.Lease == 0 {
		t.Fatalf("stalls key: %v, %+v; node entry's lease %x", err, resp.Kvs, n.Entry.Lease)
	}

	// ctx bounds it.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := a.PublishStalls(ctx, NodeStalls{}); err == nil {
		t.Errorf("PublishStalls with a cancelled ctx: no error")
	}
	// A bad straggler is the caller's bug: nothing is written.
	err = a.PublishStalls(t.Context(), NodeStalls{Stalls: []string{"x"}, Stragglers: []StragglerInfo{{Rank: 3, Last: 21, Steps: 20}}})
	if err == nil || !strings.Contains(err.Error(), "straggler rank 3: last in 21 of 20 steps") {
		t.Errorf("bad straggler: %v", err)
	}
	if g := nodeOf(t, readStatus(t, cli, RootPrefix, "job"), a.Node()).Stalls; g == nil || g.Hang != "step 10 bucket 0 hung" {
		t.Errorf("after a refused report: %+v", g)
	}
}

// TestStallsGoWithTheAgent: the report lives on the agent's lease, so it
// goes when the agent leaves or dies, and cannot be written after.
func TestStallsGoWithTheAgent(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 2, 2)
	a, b := open(t, dial(), cfg), open(t, dial(), cfg)
	nextAll(t, a, b)
	cli := dial()
	publish(t, a, NodeStalls{Stalls: []string{"from a"}})
	publish(t, b, NodeStalls{Stalls: []string{"from b"}})
	if n := stallKeys(t, cli); n != 2 {
		t.Fatalf("%d stalls keys, want 2", n)
	}

	a.Leave("test says so")
	if n := stallKeys(t, cli); n != 1 {
		t.Fatalf("after a left: %d stalls keys, want 1", n)
	}
	if err := a.PublishStalls(t.Context(), NodeStalls{Stalls: []string{"too late"}}); err == nil {
		t.Errorf("PublishStalls after Leave: no error")
	}

	// b dies; revoking its lease is what the lease running out would do,
	// without waiting for it.
	lease := nodeOf(t, readStatus(t, cli, RootPrefix, "job"), b.Node()).Entry.Lease
	b.Close()
	if err := b.PublishStalls(t.Context(), NodeStalls{}); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("PublishStalls after Close: %v", err)
	}
	if _, err := cli.Etcd().Revoke(t.Context(), clientv3.LeaseID(lease)); err != nil {
		t.Fatal(err)
	}
	if n := stallKeys(t, cli); n != 0 {
		t.Fatalf("after b died: %d stalls keys, want 0", n)
	}
	for _, n := range readStatus(t, cli, RootPrefix, "job").Nodes {
		if n.Stalls != nil {
			t.Fatalf("node %s still has stalls: %+v", n.Node, n.Stalls)
		}
	}
}

// TestStatusStallsWrittenByHand: a malformed report is listed, and
// changes nothing else about its node; a report of no known node is not
// shown.
func TestStatusStallsWrittenByHand(t *testing.T) {
	cli := testStore(t)()
	p := Prefix(RootPrefix, "fx")
	members := []Member{{Node: "a", Host: "host-a", GroupRank: 0, NProc: 2}, {Node: "b", Host: "host-b", GroupRank: 1, NProc: 2, RankOffset: 2}}
	put(t, cli, p+jobKey, JobInfo{ID: "fx", NNodesMin: 2, NNodesMax: 2})
	put(t, cli, p+stateKey, State{Generation: 1, Phase: Running, Members: members, WorldSize: 4})
	put(t, cli, p+nodesDir+"a", NodeInfo{Node: "a", Host: "host-a", State: NodeActive})
	put(t, cli, p+nodesDir+"b", NodeInfo{Node: "b", Host: "host-b", State: NodeActive})
	put(t, cli, p+stallsDir+"a", "{not json")
	put(t, cli, p+stallsDir+"b", `{"updated": "2025-03-14T10:17:13Z", "stalls": ["step 1 bucket 0: rank 3 late"], "stragglers": [{"rank": 3, "host": "host-b", "gpu": "GPU-1", "last": 15, "steps": 20}]}`)
	put(t, cli, p+stallsDir+"ghost", NodeStalls{Hang: "step 2 bucket 1 hung"})

	s := readStatus(t, cli, RootPrefix, "fx")
	if got, want := roles(s), "a:running b:running"; got != want {
		t.Fatalf("roles %q, want %q", got, want)
	}
	if len(s.Malformed) != 1 || s.Malformed[0].Key != p+stallsDir+"a" || !strings.Contains(s.Malformed[0].Error, "malformed value at "+p+stallsDir+"a") {
		t.Fatalf("malformed: %+v", s.Malformed)
	}
	if n := nodeOf(t, s, "a"); n.Stalls != nil || n.Malformed != "" || n.Entry == nil {
		t.Fatalf("node a: %+v", n)
	}
	want := &NodeStalls{Updated: time.Date(2025, 3, 14, 10, 17, 13, 0, time.UTC), Stalls: []string{"step 1 bucket 0: rank 3 late"},
		Stragglers: []StragglerInfo{{Rank: 3, Host: "host-b", GPU: "GPU-1", Last: 15, Steps: 20}}}
	if got := nodeOf(t, s, "b").Stalls; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("node b stalls %+v, want %+v", got, want)
	}
}

func TestLimitStalls(t *testing.T) {
	now := time.Date(2025, 3, 14, 10, 17, 13, 0, time.UTC)
	many := func(n int, f func(int) string) []string {
		var out []string
		for i := range n {
			out = append(out, f(i))
		}
		return out
	}
	for _, tc := range []struct {
		name string
		in   NodeStalls
		want NodeStalls
		err  string
	}{
		{name: "empty", want: NodeStalls{Updated: now, Stalls: []string{}, Stragglers: []StragglerInfo{}}},
		{
			name: "first lines only, blank lines dropped",
			in:   NodeStalls{Updated: now.Add(-time.Minute), Stalls: []string{"a\nb", "  ", "\n", " c \r\n"}, Hang: "h1\r\nh2"},
			want: NodeStalls{Updated: now.Add(-time.Minute), Stalls: []string{"a", "c"}, Stragglers: []StragglerInfo{}, Hang: "h1"},
		},
		{
			name: "the newest lines stay",
			in:   NodeStalls{Stalls: many(25, func(i int) string { return fmt.Sprint(i) })},
			want: NodeStalls{Updated: now, Stalls: many(10, func(i int) string { return fmt.Sprint(15 + i) }), Stragglers: []StragglerInfo{}},
		},
		{
			name: "long lines are cut",
			in:   NodeStalls{Stalls: []string{strings.Repeat("x", 500), strings.Repeat("x", 501), strings.Repeat("x", 498) + "é"}, Hang: strings.Repeat("€", 200)},
			want: NodeStalls{Updated: now, Stalls: []string{strings.Repeat("x", 500), strings.Repeat("x", 497) + "…", strings.Repeat("x", 498) + "é"},
				Stragglers: []StragglerInfo{}, Hang: strings.Repeat("€", 165) + "…"},
		},
		{
			name: "invalid UTF-8 counts as JSON stores it",
			in:   NodeStalls{Stalls: []string{"a\xffb", strings.Repeat("\xff", 200)}},
			want: NodeStalls{Updated: now, Stalls: []string{"a\uFFFDb", "\uFFFD"}, Stragglers: []StragglerInfo{}},
		},
		{
			name: "stragglers capped, names cut",
			in: NodeStalls{Stragglers: append([]StragglerInfo{{Rank: 0, Host: strings.Repeat("h", 300), GPU: "GPU-0\nx", Last: 0, Steps: 0}},
				slices.Repeat([]StragglerInfo{{Rank: 1, Last: 1, Steps: 2}}, 12)...)},
			want: NodeStalls{Updated: now, Stalls: []string{}, Stragglers: append([]StragglerInfo{{Rank: 0, Host: strings.Repeat("h", 253) + "…", GPU: "GPU-0"}},
				slices.Repeat([]StragglerInfo{{Rank: 1, Last: 1, Steps: 2}}, 9)...)},
		},
		{name: "negative rank", in: NodeStalls{Stragglers: []StragglerInfo{{Rank: -1}}}, err: "straggler rank -1: last in 0 of 0 steps"},
		{name: "negative count", in: NodeStalls{Stragglers: []StragglerInfo{{Rank: 1, Last: -1, Steps: 2}}}, err: "straggler rank 1: last in -1 of 2 steps"},
		{name: "negative late", in: NodeStalls{Stragglers: []StragglerInfo{{Rank: 1, Last: 1, Steps: 2, LateMS: -1}}}, err: "straggler rank 1: late -1 ms, share 0 of step time"},
		{name: "share above 1", in: NodeStalls{Stragglers: []StragglerInfo{{Rank: 1, Last: 1, Steps: 2, Share: 1.5}}}, err: "straggler rank 1: late 0 ms, share 1.5 of step time"},
		{
			name: "a bad straggler past the cap",
			in:   NodeStalls{Stragglers: append(slices.Repeat([]StragglerInfo{{Rank: 1, Last: 1, Steps: 2}}, 10), StragglerInfo{Rank: 2, Last: 3, Steps: 2})},
			err:  "straggler rank 2: last in 3 of 2 steps",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := limitStalls(tc.in, now)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("got error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if encode(got) != encode(tc.want) {
				t.Fatalf("got %s, want %s", encode(got), encode(tc.want))
			}
			for _, l := range append(slices.Clone(got.Stalls), got.Hang) {
				if len(l) > MaxStallLineBytes {
					t.Fatalf("a line of %d bytes", len(l))
				}
			}
		})
	}
}
