package rdzv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// testStore starts an embedded etcd for one test and returns a client
// factory: every agent gets its own client, as separate processes would.
func testStore(t *testing.T) func() *clientv3.Client {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv, err := store.Start(t.Context(), store.ServerConfig{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return func() *clientv3.Client {
		cli, err := store.Dial(t.Context(), store.ClientConfig{Endpoints: []string{srv.Endpoint()}, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		return cli
	}
}

func testConfig(t *testing.T, min, max int) Config {
	return Config{
		JobID: "job", Prefix: Prefix(RootPrefix, "job"), Endpoint: "test",
		Host: "h", Addr: "127.0.0.1", NProc: 2,
		NNodesMin: min, NNodesMax: max, MaxRestarts: 3,
		JoinTimeout: 20 * time.Second, LastCall: 300 * time.Millisecond, TTL: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
}

func open(t *testing.T, cli *clientv3.Client, cfg Config) *Etcd {
	t.Helper()
	e, err := Open(t.Context(), cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// nextAll calls Next on every agent at once and returns their rounds.
func nextAll(t *testing.T, es ...*Etcd) []*Round {
	t.Helper()
	rounds := make([]*Round, len(es))
	errs := make([]error, len(es))
	var wg sync.WaitGroup
	for i, e := range es {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			rounds[i], errs[i] = e.Next(ctx)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("agent %d: Next: %v", i, err)
		}
	}
	return rounds
}

// checkRounds verifies that rounds form one consistent world.
func checkRounds(t *testing.T, rounds []*Round) {
	t.Helper()
	ranks := map[int]bool{}
	for _, r := range rounds {
		if r.Generation != rounds[0].Generation || r.WorldSize != rounds[0].WorldSize || r.MasterPort != rounds[0].MasterPort || r.NNodes != len(rounds) {
			t.Fatalf("rounds disagree: %+v vs %+v", r, rounds[0])
		}
		if r.GroupRank < 0 || r.GroupRank >= len(rounds) || ranks[r.GroupRank] {
			t.Fatalf("group rank %d repeated or out of range", r.GroupRank)
		}
		ranks[r.GroupRank] = true
		if r.RankOffset != r.GroupRank*2 || r.WorldSize != 2*len(rounds) {
			t.Fatalf("rank offset %d for group rank %d, world %d", r.RankOffset, r.GroupRank, r.WorldSize)
		}
	}
}

func waitDone(t *testing.T, r *Round, within time.Duration) string {
	t.Helper()
	select {
	case <-r.Done():
		return r.Reason()
	case <-time.After(within):
		t.Fatalf("round %d did not end within %v", r.Generation, within)
		return ""
	}
}

func rankOf(rounds []*Round, es []*Etcd, e *Etcd) int {
	for i := range es {
		if es[i] == e {
			return rounds[i].GroupRank
		}
	}
	return -1
}

func TestRoundFormsAndFaultsMoveEveryone(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 2, 3)
	es := []*Etcd{open(t, dial(), cfg), open(t, dial(), cfg), open(t, dial(), cfg)}
	begin := time.Now()
	rounds := nextAll(t, es...)
	t.Logf("3 agents formed generation %d in %v", rounds[0].Generation, time.Since(begin))
	checkRounds(t, rounds)
	if rounds[0].Generation != 0 || rounds[0].Restarts != 0 {
		t.Fatalf("first round: generation %d restarts %d", rounds[0].Generation, rounds[0].Restarts)
	}

	// A worker failure on one node ends the round everywhere and counts.
	if err := es[1].Fail(t.Context(), rounds[1], "worker rank 3 failed"); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*Round{rounds[0], rounds[2]} {
		if why := waitDone(t, r, 2*time.Second); !strings.Contains(why, "worker rank 3 failed") {
			t.Fatalf("round ended with %q", why)
		}
	}
	old := rounds
	rounds = nextAll(t, es...)
	checkRounds(t, rounds)
	if rounds[0].Generation != 1 || rounds[0].Restarts != 1 {
		t.Fatalf("after a failure: generation %d restarts %d", rounds[0].Generation, rounds[0].Restarts)
	}
	for i := range es {
		if rounds[i].GroupRank != old[i].GroupRank {
			t.Fatalf("agent %d moved from group rank %d to %d", i, old[i].GroupRank, rounds[i].GroupRank)
		}
	}

	// An agent that dies (no keep-alives, probe refusing) is found by the
	// others, who re-form without it; it counts as a fault.
	victim := es[0]
	for i := range es {
		if rounds[i].GroupRank == 1 {
			victim = es[i]
		}
	}
	var rest []*Etcd
	var restRounds []*Round
	for i := range es {
		if es[i] != victim {
			rest = append(rest, es[i])
			restRounds = append(restRounds, rounds[i])
		}
	}
	victim.Close() // keep-alives stop and the probe port refuses, as after SIGKILL
	lost := time.Now()
	for _, r := range restRounds {
		if why := waitDone(t, r, 5*time.Second); !strings.Contains(why, "lost") {
			t.Fatalf("round ended with %q", why)
		}
	}
	t.Logf("lost node noticed after %v", time.Since(lost))
	prev := restRounds
	rounds = nextAll(t, rest...)
	t.Logf("re-formed without it %v after it died", time.Since(lost))
	checkRounds(t, rounds)
	if rounds[0].Generation != 2 || rounds[0].Restarts != 2 {
		t.Fatalf("after a lost node: generation %d restarts %d", rounds[0].Generation, rounds[0].Restarts)
	}
	for i := range rest {
		// rank 0 keeps rank 0; old rank 2 takes the free rank 1
		if prev[i].GroupRank == 0 && rounds[i].GroupRank != 0 {
			t.Fatalf("rank 0 survivor moved to %d", rounds[i].GroupRank)
		}
	}
}

func TestLateNodeRescalesAndLeavingIsNoFault(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 1, 3)
	a, b := open(t, dial(), cfg), open(t, dial(), cfg)
	rounds := nextAll(t, a, b)
	checkRounds(t, rounds)

	c := open(t, dial(), cfg)
	var cr *Round
	done := make(chan error, 1)
	go func() {
		var err error
		cr, err = c.Next(t.Context())
		done <- err
	}()
	for _, r := range rounds {
		if why := waitDone(t, r, 3*time.Second); !strings.Contains(why, "scaling up") {
			t.Fatalf("round ended with %q", why)
		}
	}
	rounds = nextAll(t, a, b)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	all := append(rounds, cr)
	checkRounds(t, all)
	if cr.Restarts != 0 {
		t.Fatalf("a scale-up counted as a restart: %d", cr.Restarts)
	}

	c.Leave("test says so")
	for _, r := range rounds {
		if why := waitDone(t, r, 3*time.Second); !strings.Contains(why, "left: test says so") {
			t.Fatalf("round ended with %q", why)
		}
	}
	rounds = nextAll(t, a, b)
	checkRounds(t, rounds)
	if rounds[0].Restarts != 0 {
		t.Fatalf("a node leaving counted as a restart: %d", rounds[0].Restarts)
	}
}

func TestNoRestartsLeftFailsTheJobEverywhere(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 2, 2)
	cfg.MaxRestarts = 0
	a, b := open(t, dial(), cfg), open(t, dial(), cfg)
	rounds := nextAll(t, a, b)
	var jf *JobFailedError
	if err := a.Fail(t.Context(), rounds[0], "worker rank 1 failed"); !errors.As(err, &jf) {
		t.Fatalf("Fail with no restarts: %v", err)
	}
	waitDone(t, rounds[1], 2*time.Second)
	if _, err := b.Next(t.Context()); !errors.As(err, &jf) || !strings.Contains(jf.Reason, "worker rank 1 failed") || !strings.Contains(jf.Reason, "no restarts left") {
		t.Fatalf("the other node's Next: %v", err)
	}
}

func TestSucceedEndsTheJobForSpares(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 1, 1)
	a := open(t, dial(), cfg)
	r := nextAll(t, a)[0]
	spare := open(t, dial(), cfg)
	done := make(chan error, 1)
	go func() {
		_, err := spare.Next(t.Context())
		done <- err
	}()
	time.Sleep(300 * time.Millisecond) // let it stand by
	if err := a.Succeed(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrJobSucceeded) {
			t.Fatalf("spare's Next: %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("spare still waiting after the job succeeded")
	}
	select {
	case <-r.Done():
		t.Fatalf("success ended the round as if superseded: %s", r.Reason())
	default:
	}
}

func TestRefusals(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 1, 2)
	cfg.Hosted, cfg.Token = true, "secret"
	open(t, dial(), cfg)

	other := cfg
	other.Hosted, other.JobID, other.Prefix = false, "otherjob", Prefix(RootPrefix, "otherjob")
	var fe *ForeignJobError
	if _, err := Open(t.Context(), dial(), other); !errors.As(err, &fe) || !strings.Contains(err.Error(), `"job"`) {
		t.Fatalf("agent of another job: %v", err)
	}
	wrong := cfg
	wrong.Hosted, wrong.Token = false, "guess"
	if _, err := Open(t.Context(), dial(), wrong); !errors.Is(err, ErrTokenMismatch) {
		t.Fatalf("wrong token: %v", err)
	}
	wrong.Token = ""
	if _, err := Open(t.Context(), dial(), wrong); !errors.Is(err, ErrTokenMismatch) {
		t.Fatalf("missing token: %v", err)
	}
}

func TestMalformedValuesDoNotStopTheJob(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 2, 2)
	cli := dial()
	a, b := open(t, dial(), cfg), open(t, dial(), cfg)
	// garbage in a node entry and a join entry of the first round
	if _, err := cli.Put(t.Context(), cfg.Prefix+nodesDir+"garbage", "{not json"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(t.Context(), RoundPrefix(cfg.Prefix, 0)+"garbage", "\x00\x01"); err != nil {
		t.Fatal(err)
	}
	rounds := nextAll(t, a, b)
	checkRounds(t, rounds)
	// garbage in the state itself: the job moves to a fresh generation
	if _, err := cli.Put(t.Context(), cfg.Prefix+stateKey, `{"generation": "many"}`); err != nil {
		t.Fatal(err)
	}
	for _, r := range rounds {
		waitDone(t, r, 2*time.Second)
	}
	next := nextAll(t, a, b)
	checkRounds(t, next)
	if next[0].Generation <= rounds[0].Generation {
		t.Fatalf("generation went from %d to %d", rounds[0].Generation, next[0].Generation)
	}
	// a malformed job entry refuses newcomers with a clear error, no panic
	if _, err := cli.Put(t.Context(), cfg.Prefix+jobKey, "[]"); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(t.Context(), dial(), cfg); err == nil || !strings.Contains(err.Error(), "malformed value at "+cfg.Prefix+jobKey) {
		t.Fatalf("malformed job entry: %v", err)
	}
}

func TestJoinTimeout(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 2, 2)
	cfg.JoinTimeout = 700 * time.Millisecond
	a := open(t, dial(), cfg)
	begin := time.Now()
	_, err := a.Next(t.Context())
	var jt *JoinTimeoutError
	if !errors.As(err, &jt) || jt.Joined != 1 || jt.Min != 2 {
		t.Fatalf("Next: %v", err)
	}
	if d := time.Since(begin); d > 3*time.Second {
		t.Fatalf("join timeout of 700ms took %v", d)
	}
	t.Log(err)
}

func TestAssignKeepsRanks(t *testing.T) {
	j := func(node string, rev int64) joiner { return joiner{JoinInfo: JoinInfo{Node: node, NProc: 1}, rev: rev} }
	prev := []Member{{Node: "a", GroupRank: 0}, {Node: "b", GroupRank: 1}, {Node: "c", GroupRank: 2}}
	tests := []struct {
		name    string
		prev    []Member
		joiners []joiner
		max     int
		want    string
	}{
		{"first round in join order", nil, []joiner{j("x", 5), j("y", 3), j("z", 9)}, 3, "y x z"},
		{"all survive", prev, []joiner{j("c", 1), j("b", 2), j("a", 3)}, 3, "a b c"},
		{"rank 0 lost: the highest survivor takes it", prev, []joiner{j("b", 1), j("c", 2)}, 3, "c b"},
		{"middle lost", prev, []joiner{j("a", 1), j("c", 2)}, 3, "a c"},
		{"newcomer fills the gap", prev, []joiner{j("n", 1), j("a", 2), j("c", 3)}, 3, "a n c"},
		{"too many: survivors first", prev, []joiner{j("n", 1), j("c", 2), j("b", 3), j("a", 4)}, 3, "a b c"},
		{"too many newcomers: earliest first", nil, []joiner{j("p", 4), j("q", 2), j("r", 3)}, 2, "q r"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ms := assign(tc.prev, tc.joiners, tc.max)
			var got []string
			for r, m := range ms {
				if m.GroupRank != r || m.RankOffset != r {
					t.Fatalf("member %d: %+v", r, m)
				}
				got = append(got, m.Node)
			}
			if g := strings.Join(got, " "); g != tc.want {
				t.Fatalf("got %q, want %q", g, tc.want)
			}
		})
	}
}

// TestManyAgents forms one round of many agents sharing one client, as
// the scale benchmark does with more.
func TestManyAgents(t *testing.T) {
	dial := testStore(t)
	cli := dial()
	const n = 64
	cfg := testConfig(t, n, n)
	cfg.Logger = slog.New(slog.DiscardHandler)
	es := make([]*Etcd, n)
	for i := range es {
		c := cfg
		c.Host = fmt.Sprintf("h%d", i)
		es[i] = open(t, cli, c)
	}
	begin := time.Now()
	rounds := nextAll(t, es...)
	t.Logf("%d agents formed a round in %v", n, time.Since(begin))
	checkRounds(t, rounds)
}

// TestReusedIDStartsANewRun: a job id whose last run ended (succeeded,
// or was killed without leaving) serves a new run.
func TestReusedIDStartsANewRun(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 1, 1)
	a := open(t, dial(), cfg)
	r := nextAll(t, a)[0]
	if err := a.Succeed(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	a.Leave("done")
	b := open(t, dial(), cfg)
	rb := nextAll(t, b)[0]
	if rb.Generation <= r.Generation || rb.Restarts != 0 {
		t.Fatalf("new run: generation %d (last run %d), restarts %d", rb.Generation, r.Generation, rb.Restarts)
	}
	// killed without leaving: the lease runs out, the state still says running
	b.Close()
	c := open(t, dial(), cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	rc, err := c.Next(ctx)
	if err != nil {
		t.Fatalf("after a killed run: %v", err)
	}
	if rc.Generation <= rb.Generation {
		t.Fatalf("generation %d after %d", rc.Generation, rb.Generation)
	}
}
