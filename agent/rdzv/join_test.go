package rdzv

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/syncbuf"
)

func TestJoinTimeout(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 2, 2)
	cfg.JoinTimeout = 700 * time.Millisecond
	// While it waits, the round says how many joined: a mistyped endpoint
	// (each agent hosting a store of its own) once said nothing for the
	// whole join timeout, 10 minutes by default.
	var log syncbuf.Buffer
	cfg.Logger, cfg.WaitingSaid = slog.New(slog.NewTextHandler(&log, nil)), time.Nanosecond // at its first look
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
	if !strings.Contains(log.String(), `msg="waiting for nodes" generation=0 joined=1 needed=2`) {
		t.Errorf("no line saying how many nodes joined:\n%s", log.String())
	}
	t.Log(err)
}

// TestManyAgents forms one round of many agents sharing one client, as
// the scale benchmark does with more.
func TestManyAgents(t *testing.T) {
	dial := testStore(t)
	cli := dial()
	const n = 64
	cfg := testConfig(t, n, n)
	cfg.Logger = slog.New(slog.DiscardHandler)
	es := make([]*Membership, n)
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

// TestAgentStoreIsGroupRankZeros: whether the agent serves the workers'
// store is group rank 0's choice (its --spares), and every node's round
// says so, the other node's own choice aside: torch 1.13's workers
// prefix the store's keys only when they are told the agent serves it.
func TestAgentStoreIsGroupRankZeros(t *testing.T) {
	dial := testStore(t)
	cfgs := []Config{testConfig(t, 2, 2), testConfig(t, 2, 2)}
	cfgs[0].Host, cfgs[0].AgentStore = "a", true
	cfgs[1].Host = "b"
	rounds := nextAll(t, open(t, dial(), cfgs[0]), open(t, dial(), cfgs[1]))
	checkRounds(t, rounds)
	want := cfgs[0].AgentStore
	if rounds[1].GroupRank == 0 {
		want = cfgs[1].AgentStore
	}
	for i, r := range rounds {
		if r.AgentStore != want {
			t.Fatalf("node %s (group rank %d): agent store %v, want group rank 0's %v", cfgs[i].Host, r.GroupRank, r.AgentStore, want)
		}
	}
}

// TestOfferedStoreCarries: a round names group rank 0's node; after a
// node leaves, the survivors' round keeps the store on the port its agent
// offered (OfferStore), not a new free one, and says the workers carry on
// (agent/keep.go). The first round, and a round after a worker's fault,
// do not.
func TestOfferedStoreCarries(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 2, 3)
	var es []*Membership
	for _, h := range []string{"a", "b", "c"} {
		c := cfg
		c.Host, c.AgentStore = h, true
		es = append(es, open(t, dial(), c))
	}
	rounds := nextAll(t, es...)
	checkRounds(t, rounds)
	master := -1
	for i, r := range rounds {
		if r.Carry {
			t.Fatalf("the first round carries: %+v", r)
		}
		if r.GroupRank == 0 {
			master = i
		}
	}
	for _, r := range rounds {
		if r.MasterNode != es[master].node {
			t.Fatalf("MasterNode %q, want group rank 0's %q", r.MasterNode, es[master].node)
		}
	}
	gone := (master + 1) % 3
	es[gone].Close()
	var survivors []*Membership
	for i, e := range es {
		if i != gone {
			survivors = append(survivors, e)
			<-rounds[i].Done()
		}
	}
	es[master].OfferStore(rounds[master].MasterPort)
	next := nextAll(t, survivors...)
	for _, r := range next {
		if r.NNodes != 2 || !r.Carry || r.MasterNode != es[master].node || r.MasterPort != rounds[master].MasterPort {
			t.Fatalf("after a node left: %+v, want 2 nodes carrying on, the store on %s:%d", r, es[master].node,
				rounds[master].MasterPort)
		}
	}
	// A worker's fault: the workers restart, whatever the store.
	if err := survivors[1].Fail(t.Context(), next[1], "worker rank 3 failed"); err != nil {
		t.Fatal(err)
	}
	<-next[0].Done()
	for _, r := range nextAll(t, survivors...) {
		if r.Carry {
			t.Fatalf("after a worker's fault: %+v carries", r)
		}
	}
}
