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
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

func publish(t *testing.T, e *Membership, s telemetry.Report) {
	t.Helper()
	if err := publishReport(t.Context(), e, s); err != nil {
		t.Fatalf("PublishStalls: %v", err)
	}
}

// publishReport encodes r as the watch does and publishes it.
func publishReport(ctx context.Context, e *Membership, r telemetry.Report) error {
	b, err := r.Encode(time.Now())
	if err != nil {
		return err
	}
	return e.PublishStalls(ctx, b)
}

// stallsOf decodes n's report, nil when it has none.
func stallsOf(t *testing.T, n NodeStatus) *telemetry.Report {
	t.Helper()
	if n.Stalls == nil {
		return nil
	}
	r, err := telemetry.DecodeReport(n.Stalls)
	if err != nil {
		t.Fatalf("node %s: %v", n.Node, err)
	}
	return &r
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
		lines = append(lines, fmt.Sprintf("step %d bucket 3: rank 1 (h, GPU 1, pid 4411) arrived 2.31 s after the others; 1 rank waited 2.3 GPU-seconds", 800+i))
	}
	lines[10] = "step 810 " + strings.Repeat("é", 400) // 809 bytes
	in := telemetry.Report{
		Stalls:     lines,
		Stragglers: []telemetry.ReportedStraggler{{Rank: 1, Host: "h", GPU: "GPU-5c1e", Last: 15, Steps: 20}},
		Hang:       "step 9 bucket 2 (generation 0) has not finished 30.00 s after the first rank arrived\nPython stack of rank 1:\n...",
	}
	before := time.Now()
	publish(t, a, in)

	s := readStatus(t, cli, RootPrefix, "job")
	n := nodeOf(t, s, a.Node())
	if n.Role != RoleRunning || len(s.Malformed) != 0 {
		t.Fatalf("node %+v, malformed %+v", n, s.Malformed)
	}
	got := stallsOf(t, n)
	if got == nil {
		t.Fatalf("no stalls read back: %+v", n)
	}
	if got.Updated.Before(before.Add(-time.Second)) || got.Updated.After(time.Now()) {
		t.Errorf("updated %v, want about %v", got.Updated, before)
	}
	if len(got.Stalls) != telemetry.MaxStallLines || got.Stalls[0] != lines[2] || got.Stalls[9] != lines[11] {
		t.Errorf("stalls %q, want the last %d of %d", got.Stalls, telemetry.MaxStallLines, len(lines))
	}
	if long := got.Stalls[8]; len(long) > telemetry.MaxStallLineBytes || !utf8.ValidString(long) || !strings.HasPrefix(long, "step 810 éé") || !strings.HasSuffix(long, "…") {
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
	publish(t, a, telemetry.Report{Updated: before, Hang: "step 10 bucket 0 hung"})
	s = readStatus(t, cli, RootPrefix, "job")
	n = nodeOf(t, s, a.Node())
	if g := stallsOf(t, n); g == nil || !g.Updated.Equal(before) || len(g.Stalls) != 0 || len(g.Stragglers) != 0 || g.Hang != "step 10 bucket 0 hung" {
		t.Fatalf("second report: %+v", n.Stalls)
	}
	resp, err := cli.Etcd().Get(t.Context(), Prefix(RootPrefix, "job")+stallsDir+a.Node())
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease != n.Entry.Lease || n.Entry.Lease == 0 {
		t.Fatalf("stalls key: %v, %+v; node entry's lease %x", err, resp.Kvs, n.Entry.Lease)
	}

	// ctx bounds it.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := publishReport(ctx, a, telemetry.Report{}); err == nil {
		t.Errorf("PublishStalls with a cancelled ctx: no error")
	}
	// A bad straggler is the caller's bug: nothing is written.
	err = publishReport(t.Context(), a, telemetry.Report{Stalls: []string{"x"}, Stragglers: []telemetry.ReportedStraggler{{Rank: 3, Last: 21, Steps: 20}}})
	if err == nil || !strings.Contains(err.Error(), "straggler rank 3: last in 21 of 20 steps") {
		t.Errorf("bad straggler: %v", err)
	}
	if g := stallsOf(t, nodeOf(t, readStatus(t, cli, RootPrefix, "job"), a.Node())); g == nil || g.Hang != "step 10 bucket 0 hung" {
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
	publish(t, a, telemetry.Report{Stalls: []string{"from a"}})
	publish(t, b, telemetry.Report{Stalls: []string{"from b"}})
	if n := stallKeys(t, cli); n != 2 {
		t.Fatalf("%d stalls keys, want 2", n)
	}

	a.Leave("test says so")
	if n := stallKeys(t, cli); n != 1 {
		t.Fatalf("after a left: %d stalls keys, want 1", n)
	}
	if err := publishReport(t.Context(), a, telemetry.Report{Stalls: []string{"too late"}}); err == nil {
		t.Errorf("PublishStalls after Leave: no error")
	}

	// b dies; revoking the lease its entry and reports live on is what the
	// lease running out would do, without waiting for it. (Close revokes
	// the lease too, when it still holds it: either may come first.)
	lease := nodeOf(t, readStatus(t, cli, RootPrefix, "job"), b.Node()).Entry.Lease
	b.Close()
	if err := publishReport(t.Context(), b, telemetry.Report{}); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("PublishStalls after Close: %v", err)
	}
	revokeGone(t, cli, lease)
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
	put(t, cli, p+stallsDir+"ghost", telemetry.Report{Hang: "step 2 bucket 1 hung"})

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
	want := &telemetry.Report{Updated: time.Date(2025, 3, 14, 10, 17, 13, 0, time.UTC), Stalls: []string{"step 1 bucket 0: rank 3 late"},
		Stragglers: []telemetry.ReportedStraggler{{Rank: 3, Host: "host-b", GPU: "GPU-1", Last: 15, Steps: 20}}}
	if got := stallsOf(t, nodeOf(t, s, "b")); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("node b stalls %+v, want %+v", got, want)
	}
}

// TestStallsObject: the store keeps a report as opaque JSON: any object,
// compacted onto one line; anything else is malformed.
func TestStallsObject(t *testing.T) {
	for _, tc := range []struct {
		name, raw, want string
		err             bool
	}{
		{name: "a report", raw: `{"updated":"2025-03-14T10:17:13Z","stalls":[],"stragglers":[]}`, want: `{"updated":"2025-03-14T10:17:13Z","stalls":[],"stragglers":[]}`},
		{name: "written by hand", raw: "{\n  \"hang\": \"step 2\",\n  \"x\": [1, 2]\n}\n", want: `{"hang":"step 2","x":[1,2]}`},
		{name: "not json", raw: "{not json", err: true},
		{name: "null", raw: "null", err: true},
		{name: "a list", raw: "[]", err: true},
		{name: "empty", raw: "", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := stallsObject([]byte(tc.raw))
			if (err != nil) != tc.err {
				t.Fatalf("got error %v, want one: %v", err, tc.err)
			}
			if string(got) != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

// TestPublishStallsRefuses: what status could not show is not written.
func TestPublishStallsRefuses(t *testing.T) {
	dial := testStore(t)
	a := open(t, dial(), testConfig(t, 1, 1))
	nextAll(t, a)
	for _, tc := range []struct {
		name, raw, err string
	}{
		{name: "not an object", raw: "[1]", err: "not a JSON object"},
		{name: "not json", raw: "{", err: "unexpected end of JSON input"},
		{name: "too large", raw: `{"hang":"` + strings.Repeat("x", MaxStallsBytes) + `"}`, err: "more than 65536"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := a.PublishStalls(t.Context(), []byte(tc.raw))
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("got %v, want an error with %q", err, tc.err)
			}
		})
	}
	if n := stallKeys(t, dial()); n != 0 {
		t.Errorf("got %d stalls keys, want 0", n)
	}
}
