package rdzv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// put writes v at key: a string as it is, anything else as JSON.
func put(t *testing.T, cli *store.Client, key string, v any) {
	t.Helper()
	s, ok := v.(string)
	if !ok {
		s = encode(v)
	}
	if _, err := cli.Etcd().Put(t.Context(), key, s); err != nil {
		t.Fatal(err)
	}
}

func readStatus(t *testing.T, cli *store.Client, root, id string) *Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	s, err := ReadStatus(ctx, cli, root, id)
	if err != nil {
		t.Fatalf("ReadStatus(%q): %v", id, err)
	}
	return s
}

// roles renders the nodes as "node:role" in the order ReadStatus gives.
func roles(s *Status) string {
	var out []string
	for _, n := range s.Nodes {
		out = append(out, n.Node+":"+string(n.Role))
	}
	return strings.Join(out, " ")
}

func nodeOf(t *testing.T, s *Status, node string) NodeStatus {
	t.Helper()
	for _, n := range s.Nodes {
		if n.Node == node {
			return n
		}
	}
	t.Fatalf("node %s not in status: %s", node, roles(s))
	return NodeStatus{}
}

// background runs Next on each agent until the test ends, and waits for
// them before the agents are closed.
func background(t *testing.T, es ...*Membership) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, e := range es {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = e.Next(ctx)
		}()
	}
	t.Cleanup(func() { cancel(); wg.Wait() }) // runs before the agents' Close: cleanups run last-in first-out
}

// waitStatus reads the job until ok accepts it.
func waitStatus(t *testing.T, cli *store.Client, id string, within time.Duration, ok func(*Status) bool) *Status {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		s := readStatus(t, cli, RootPrefix, id)
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("status not as expected within %v: state %+v, nodes %s", within, s.State, roles(s))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestStatusRunningJobWithSpare(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 2, 2)
	a, b := open(t, dial(), cfg), open(t, dial(), cfg)
	rounds := nextAll(t, a, b)
	spare := open(t, dial(), cfg)
	background(t, spare) // the job is full: it stands by

	s := readStatus(t, dial(), RootPrefix, "job")
	if s.ID != "job" || s.Revision == 0 || s.Hosted || len(s.Malformed) != 0 {
		t.Fatalf("status: %+v", s)
	}
	if s.Job == nil || s.Job.NNodesMin != 2 || s.Job.NNodesMax != 2 || s.Job.MaxRestarts != 3 {
		t.Fatalf("job: %+v", s.Job)
	}
	if s.State == nil || s.State.Phase != Running || s.State.Generation != rounds[0].Generation || s.State.WorldSize != 4 {
		t.Fatalf("state: %+v", s.State)
	}
	byRank := map[int]*Membership{rankOf(rounds, []*Membership{a, b}, a): a, rankOf(rounds, []*Membership{a, b}, b): b}
	want := fmt.Sprintf("%s:running %s:running %s:spare", byRank[0].Node(), byRank[1].Node(), spare.Node())
	if got := roles(s); got != want {
		t.Fatalf("roles %q, want %q", got, want)
	}
	for r, n := range s.Nodes[:2] {
		if n.Member == nil || n.Member.GroupRank != r || n.Member.RankOffset != 2*r || n.Entry == nil || n.Entry.PID != os.Getpid() || n.Host() != "h" || n.Addr() != "127.0.0.1" {
			t.Fatalf("member %d: %+v / %+v / %+v", r, n, n.Member, n.Entry)
		}
	}
	if sp := s.Nodes[2]; sp.Member != nil || sp.Entry == nil || sp.Entry.State != NodeActive {
		t.Fatalf("spare: %+v", sp)
	}
}

func TestStatusOpenRound(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 3, 3)
	a, b, late := open(t, dial(), cfg), open(t, dial(), cfg), open(t, dial(), cfg)
	background(t, a)
	cli := dial()
	waitStatus(t, cli, "job", 5*time.Second, func(s *Status) bool { return s.Joined() == 1 })
	background(t, b) // b joins after a, so a leads the round
	s := waitStatus(t, cli, "job", 5*time.Second, func(s *Status) bool { return s.Joined() == 2 })
	if s.State.Phase != Joining || s.State.Generation != 0 {
		t.Fatalf("state: %+v", s.State)
	}
	want := fmt.Sprintf("%s:joined %s:joined %s:joining", a.Node(), b.Node(), late.Node())
	if got := roles(s); got != want {
		t.Fatalf("roles %q, want %q", got, want)
	}
	if j := nodeOf(t, s, a.Node()).Join; j == nil || j.NProc != 2 || j.MasterPort == 0 {
		t.Fatalf("join info: %+v", j)
	}
}

func TestStatusLostMember(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 1, 2)
	a, b := open(t, dial(), cfg), open(t, dial(), cfg)
	rounds := nextAll(t, a, b)
	cli := dial()
	// b dies; revoking its lease is what the lease running out would do,
	// without waiting for it (Close may have revoked it already).
	lease := nodeOf(t, readStatus(t, cli, RootPrefix, "job"), b.Node()).Entry.Lease
	b.Close()
	revokeGone(t, cli, lease)
	waitDone(t, rounds[0], 5*time.Second) // a moved the job on
	s := waitStatus(t, cli, "job", 5*time.Second, func(s *Status) bool { return s.State.Phase == Joining })
	if !strings.Contains(s.State.Reason, "lost") || s.State.Failures != 1 {
		t.Fatalf("state: %+v", s.State)
	}
	// the last round's members keep their places until the round closes
	lost := nodeOf(t, s, b.Node())
	if lost.Role != RoleLost || lost.Member == nil || lost.Entry != nil {
		t.Fatalf("lost node: %+v", lost)
	}
	if n := nodeOf(t, s, a.Node()); n.Role != RoleJoining || n.Entry == nil {
		t.Fatalf("survivor: %+v", n)
	}
}

// TestStatusFinishedEarly: b's workers finish and its agent goes home
// (after the exit barrier) while a's still train: b has succeeded, it is
// not lost.
func TestStatusFinishedEarly(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 2, 2)
	a, b := open(t, dial(), cfg), open(t, dial(), cfg)
	rounds := nextAll(t, a, b)
	cli := dial()
	lease := nodeOf(t, readStatus(t, cli, RootPrefix, "job"), b.Node()).Entry.Lease
	if err := b.Succeed(t.Context(), rounds[1]); err != nil {
		t.Fatal(err)
	}
	b.Close()
	revokeGone(t, cli, lease)
	s := waitStatus(t, cli, "job", 5*time.Second, func(s *Status) bool { return nodeOf(t, s, b.Node()).Entry == nil })
	if s.State.Phase != Running {
		t.Fatalf("state: %+v", s.State)
	}
	if n := nodeOf(t, s, b.Node()); n.Role != RoleSucceeded || !n.Finished {
		t.Fatalf("the node that finished first: %+v", n)
	}
	if n := nodeOf(t, s, a.Node()); n.Role != RoleRunning {
		t.Fatalf("the node still training: %+v", n)
	}
}

// TestStatusRoles checks how members, node entries and join keys combine,
// on keys written by hand, including states real agents pass through only
// for an instant (a member lost while the state still says running).
func TestStatusRoles(t *testing.T) {
	cli := testStore(t)()
	p := Prefix(RootPrefix, "fx")
	member := func(node string, rank int) Member {
		return Member{Node: node, Host: "host-" + node, Addr: "10.0.0." + fmt.Sprint(rank+1), GroupRank: rank, NProc: 2, RankOffset: 2 * rank}
	}
	entry := func(node string, st NodeState, reason string) NodeInfo {
		return NodeInfo{Node: node, Host: "host-" + node, Addr: "10.0.1.1", PID: 100, NProc: 2, State: st, Reason: reason}
	}
	put(t, cli, p+jobKey, JobInfo{ID: "fx", NNodesMin: 2, NNodesMax: 4, MaxRestarts: 3})
	put(t, cli, p+nodesDir+"a", entry("a", NodeActive, ""))
	put(t, cli, p+nodesDir+"c", entry("c", NodeSucceeded, ""))
	put(t, cli, p+nodesDir+"d", entry("d", NodeLeft, "stopped by SIGTERM"))
	put(t, cli, p+nodesDir+"e", entry("e", NodeActive, ""))
	put(t, cli, p+nodesDir+"f", "{not json")
	members := []Member{member("a", 0), member("b", 1), member("c", 2), member("d", 3)}

	put(t, cli, p+stateKey, State{Generation: 7, Phase: Running, Members: members, WorldSize: 8})
	s := readStatus(t, cli, RootPrefix, "fx")
	if got, want := roles(s), "a:running b:lost c:succeeded d:left e:spare f:malformed"; got != want {
		t.Fatalf("running: roles %q, want %q", got, want)
	}
	if n := nodeOf(t, s, "f"); n.Malformed == "" || len(s.Malformed) != 1 || s.Malformed[0].Key != p+nodesDir+"f" {
		t.Fatalf("malformed node: %+v; %+v", n, s.Malformed)
	}
	if n := nodeOf(t, s, "b"); n.Host() != "host-b" || n.Addr() != "10.0.0.2" {
		t.Fatalf("a lost member keeps its member record: %+v", n)
	}
	// A member without an entry whose workers finished this generation
	// went home early (its done marker outlives its agent); a marker of
	// an earlier generation says nothing of this one.
	put(t, cli, p+doneDir+genKey(6)+"/b", "2026-12-01T00:00:00Z")
	if got, want := roles(readStatus(t, cli, RootPrefix, "fx")), "a:running b:lost c:succeeded d:left e:spare f:malformed"; got != want {
		t.Fatalf("an earlier generation's marker: roles %q, want %q", got, want)
	}
	put(t, cli, p+doneDir+genKey(7)+"/b", "2026-12-01T00:00:00Z")
	if got, want := roles(readStatus(t, cli, RootPrefix, "fx")), "a:running b:succeeded c:succeeded d:left e:spare f:malformed"; got != want {
		t.Fatalf("finished early: roles %q, want %q", got, want)
	}

	// An open round: join keys of this round count, those of the last
	// one (not cleaned up yet) do not.
	put(t, cli, p+stateKey, State{Generation: 8, Phase: Joining, Members: members})
	put(t, cli, RoundPrefix(p, 7)+"e", JoinInfo{Node: "e", NProc: 2})
	put(t, cli, RoundPrefix(p, 8)+"e", JoinInfo{Node: "e", NProc: 4})
	put(t, cli, RoundPrefix(p, 8)+"a", JoinInfo{Node: "a", NProc: 2})
	put(t, cli, RoundPrefix(p, 8)+"g", JoinInfo{Node: "g", Host: "host-g", NProc: 1})
	put(t, cli, RoundPrefix(p, 8)+"zz", "\x00")
	s = readStatus(t, cli, RootPrefix, "fx")
	if got, want := roles(s), "a:joined b:lost c:succeeded d:left e:joined g:joined f:malformed"; got != want {
		t.Fatalf("joining: roles %q, want %q", got, want)
	}
	if s.Joined() != 3 || nodeOf(t, s, "e").Join.NProc != 4 || nodeOf(t, s, "g").Host() != "host-g" {
		t.Fatalf("joiners: %+v", s.Nodes)
	}
	if len(s.Malformed) != 2 || s.Malformed[1].Key != RoundPrefix(p, 8)+"zz" {
		t.Fatalf("malformed: %+v", s.Malformed)
	}

	// Over: members without an agent are gone, not lost.
	put(t, cli, p+stateKey, State{Generation: 8, Phase: Failed, Members: members, Reason: "no restarts left"})
	s = readStatus(t, cli, RootPrefix, "fx")
	if got, want := roles(s), "a:active b:gone c:succeeded d:left e:active f:malformed"; got != want {
		t.Fatalf("failed: roles %q, want %q", got, want)
	}
}

func TestStatusMalformedValues(t *testing.T) {
	cli := testStore(t)()
	p := Prefix(RootPrefix, "bad")
	put(t, cli, p+jobKey, "[]")
	put(t, cli, p+stateKey, `{"generation": "many"}`)
	s := readStatus(t, cli, RootPrefix, "bad")
	if s.Job != nil || s.State != nil || len(s.Malformed) != 2 || len(s.Nodes) != 0 {
		t.Fatalf("status: %+v", s)
	}
	for _, m := range s.Malformed {
		if !strings.Contains(m.Error, "malformed value at "+m.Key) {
			t.Fatalf("malformed: %+v", m)
		}
	}
	put(t, cli, p+stateKey, `{"phase": "dancing", "members": [{"node": "a"}]}`)
	s = readStatus(t, cli, RootPrefix, "bad")
	if s.State != nil || !strings.Contains(s.Malformed[1].Error, `unknown phase "dancing"`) || len(s.Nodes) != 0 {
		t.Fatalf("unknown phase: %+v", s)
	}
}

func TestStatusNoJob(t *testing.T) {
	cli := testStore(t)()
	ctx := t.Context()
	if _, err := ReadStatus(ctx, cli, RootPrefix, "nope"); !errors.Is(err, ErrNoJob) {
		t.Fatalf("empty store: %v", err)
	}
	// workers' keys left behind are no job
	put(t, cli, KVPrefix(Prefix(RootPrefix, "old"))+"old/0/key", "v")
	if _, err := ReadStatus(ctx, cli, RootPrefix, "old"); !errors.Is(err, ErrNoJob) {
		t.Fatalf("leftover keys: %v", err)
	}
	l, err := ListJobs(ctx, cli, RootPrefix)
	if err != nil || len(l.Jobs) != 0 {
		t.Fatalf("ListJobs: %+v, %v", l, err)
	}
}

func TestStatusUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	cli := store.NewClient(etcd)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	begin := time.Now()
	if _, err := ReadStatus(ctx, cli, RootPrefix, "job"); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), `read job "job"`) {
		t.Fatalf("ReadStatus: %v", err)
	}
	if _, err := ListJobs(ctx, cli, RootPrefix); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ListJobs: %v", err)
	}
	if d := time.Since(begin); d > 2*time.Second {
		t.Fatalf("took %v past a 300ms deadline", d)
	}
}
