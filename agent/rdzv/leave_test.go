package rdzv

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
	"github.com/ddp-agent/ddp-agent/internal/syncbuf"
)

func TestLateNodeRescalesAndLeavingIsNoFault(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 1, 3)
	a, b := open(t, dial(), cfg), open(t, dial(), cfg)
	if running, err := a.Running(t.Context()); err != nil || running {
		t.Fatalf("Running before the first round: %v, %v", running, err)
	}
	rounds := nextAll(t, a, b)
	checkRounds(t, rounds)
	run := rounds[0].Run

	c := open(t, dial(), cfg)
	// A node about to join can tell that its join would stop the others.
	if running, err := c.Running(t.Context()); err != nil || !running {
		t.Fatalf("Running with a round closed: %v, %v", running, err)
	}
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
	if cr.Run != run {
		t.Fatalf("a scale-up changed the run: %q, then %q", run, cr.Run)
	}
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

// TestLeaveThenCloseRevokesOnce: an agent stopped by a signal leaves, then
// closes. Close revoked the lease Leave had revoked, and the store's host
// logged a WARN "failed to apply request ... lease not found" on every
// SIGTERM of a multi-node job.
func TestLeaveThenCloseRevokesOnce(t *testing.T) {
	logs := &syncbuf.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv, err := store.Start(t.Context(), store.ServerConfig{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cli, err := store.Dial(t.Context(), store.ClientConfig{Endpoints: []string{srv.Endpoint()}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	e, err := Open(t.Context(), cli, testConfig(t, 1, 2))
	if err != nil {
		t.Fatal(err)
	}
	e.Leave("received terminated")
	e.Close() // its revoke, if any, is applied (and logged) before it returns
	if got := logs.String(); strings.Contains(got, "lease not found") {
		t.Fatalf("the store logged a second revoke:\n%s", got)
	}
	// The lease is gone all the same: nothing of the node is left.
	resp, err := cli.Etcd().Get(t.Context(), testConfig(t, 1, 2).Prefix+nodesDir, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 0 {
		t.Fatalf("%d node keys left after Leave and Close", resp.Count)
	}
}

// TestKeeperLeavesWithoutTheQuorum: every node's workers finished, the
// mark saying so did not land, and the other agents stopped their store
// members on the way out, taking the quorum (a CI run of a 3-node job).
// The store's keeper leaves within succeededGrace all the same. It waited
// 10 s for a linearizable read of the member list, which with the quorum
// gone could only time out; then (a review) 10 s for a spare agent, which
// without the mark cannot learn that the job is over.
func TestKeeperLeavesWithoutTheQuorum(t *testing.T) {
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := store.StartCluster(t.Context(), 3, log)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The keeper reads its own member; the others' clients fail over, so
	// that no lease runs out while a quorum is left to end it (a spare
	// would take the place of a member lost so).
	dial := func(i int) *store.Client {
		eps := c.Endpoints()
		if i == 0 {
			eps = eps[:1]
		}
		cli, err := store.Dial(t.Context(), store.ClientConfig{Endpoints: eps, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		return cli
	}
	cfg := testConfig(t, 1, 3)
	keeper := cfg
	keeper.Keeper = func() bool { return true }
	a, b, d := open(t, dial(0), keeper), open(t, dial(1), cfg), open(t, dial(1), cfg)
	nextAll(t, a, b, d)
	// A fourth agent stands by as a spare (the round has its 3 nodes).
	spare := open(t, dial(1), cfg)
	go func() { _, _ = spare.Next(t.Context()) }()
	for {
		resp, err := a.cli.Get(t.Context(), cfg.Prefix+nodesDir, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == 4 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, e := range []*Membership{b, d} {
		if err := e.putNode(t.Context(), NodeSucceeded, ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := errors.Join(c.Stop(1), c.Stop(2)); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	a.jobDone = true // as Succeed sets it, having counted every node's marker
	a.mu.Unlock()
	start := time.Now()
	if a.waitOthersGone(t.Context(), false) {
		t.Fatal("the keeper counted itself alone with two agents registered")
	}
	// succeededGrace and a poll or two; the bound is loose for loaded
	// machines, and well under the read's opTimeout.
	if took := time.Since(start); took > 6*time.Second {
		t.Fatalf("the keeper took %v to leave a finished job (succeededGrace %v, opTimeout %v)", took, succeededGrace, opTimeout)
	}
}
