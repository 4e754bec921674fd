package watch

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/relay"
)

// fakeKV is a KV made of funcs.
type fakeKV struct {
	get func(ctx context.Context, key string) ([]byte, error)
	set func(ctx context.Context, key string, value []byte) error
}

func (k fakeKV) Get(ctx context.Context, key string) ([]byte, error) { return k.get(ctx, key) }
func (k fakeKV) Set(ctx context.Context, key string, value []byte) error {
	return k.set(ctx, key, value)
}

// memKV is a fakeKV over a map, shared by a leader and its followers.
func memKV() fakeKV {
	var mu sync.Mutex
	vals := map[string][]byte{}
	return fakeKV{
		get: func(ctx context.Context, key string) ([]byte, error) {
			for {
				mu.Lock()
				v, ok := vals[key]
				mu.Unlock()
				if ok {
					return v, nil
				}
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(10 * time.Millisecond):
				}
			}
		},
		set: func(_ context.Context, key string, value []byte) error {
			mu.Lock()
			defer mu.Unlock()
			vals[key] = value
			return nil
		},
	}
}

// fakeHandler is a relay.Handler made of funcs; nil ones drop.
type fakeHandler struct {
	records func(node string, recs []telemetry.Record)
	stacks  func(node string, stacks map[int]string)
}

func (h fakeHandler) Records(node string, recs []telemetry.Record) {
	if h.records != nil {
		h.records(node, recs)
	}
}
func (h fakeHandler) Workers(string, []telemetry.Worker) {}
func (h fakeHandler) Stacks(node string, stacks map[int]string) {
	if h.stacks != nil {
		h.stacks(node, stacks)
	}
}

func testPlanner(t *testing.T, h relay.Handler) *planner {
	t.Helper()
	if h == nil {
		h = fakeHandler{}
	}
	p := &planner{log: quiet(), handler: h, stacks: func(context.Context, telemetry.Hang) (map[int]string, bool) { return nil, false }}
	t.Cleanup(p.relay.close)
	return p
}

func attemptOf(groupRank, nnodes int, kv KV) Attempt {
	ws := []telemetry.Worker{{Rank: 2 * groupRank, LocalRank: 0}, {Rank: 2*groupRank + 1, LocalRank: 1}}
	return Attempt{Gen: 3, GroupRank: groupRank, NNodes: nnodes, WorldSize: 2 * nnodes, RankOffset: 2 * groupRank,
		MasterAddr: "127.0.0.1", Done: make(chan struct{}), Workers: ws, KV: kv, JobID: "job", Token: "secret"}
}

// TestPlanOwnRanks: whenever the records cannot be gathered, a node
// analyzes its own ranks, and never waits past relayWait.
func TestPlanOwnRanks(t *testing.T) {
	failGet := fakeKV{get: func(context.Context, string) ([]byte, error) { return nil, errors.New("store down") },
		set: func(context.Context, string, []byte) error { return errors.New("store down") }}
	badValue := fakeKV{get: func(context.Context, string) ([]byte, error) { return []byte("not an endpoint"), nil }}
	for _, tc := range []struct {
		name string
		a    Attempt
	}{
		{name: "a single node", a: attemptOf(0, 1, memKV())},
		{name: "no store", a: attemptOf(1, 2, nil)},
		{name: "the leader cannot publish", a: attemptOf(0, 2, failGet)},
		{name: "a follower without the leader's address", a: attemptOf(1, 2, failGet)},
		{name: "a follower with a malformed endpoint", a: attemptOf(1, 2, badValue)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := testPlanner(t, nil).plan(t.Context(), tc.a)
			if got.base != tc.a.RankOffset || got.size != 2 || got.fwd != nil || got.asker != nil {
				t.Errorf("got %+v, want ranks %d-%d of this node analyzed here", got, tc.a.RankOffset, tc.a.RankOffset+1)
			}
		})
	}
}

// TestPlanFollowerStopsWaiting: a follower waits for the leader's address
// until the round ends, not the whole relayWait.
func TestPlanFollowerStopsWaiting(t *testing.T) {
	a := attemptOf(1, 2, memKV()) // the leader never publishes
	done := make(chan struct{})
	a.Done = done
	time.AfterFunc(100*time.Millisecond, func() { close(done) })
	start := time.Now()
	got := testPlanner(t, nil).plan(t.Context(), a)
	if took := time.Since(start); took > relayWait/2 || got.fwd != nil {
		t.Errorf("got %+v after %v, want this node's ranks once the round ended", got, took)
	}
}

// TestPlanLeaderAndFollower: the leader analyzes every rank and publishes
// its endpoint at LeaderKey; a follower dials it and forwards its records
// there, and answers the leader's hang with its stacks.
func TestPlanLeaderAndFollower(t *testing.T) {
	kv := memKV()
	recs := make(chan []telemetry.Record, 1)
	stacks := make(chan map[int]string, 1)
	leader := testPlanner(t, fakeHandler{
		records: func(_ string, r []telemetry.Record) { recs <- r },
		stacks:  func(_ string, s map[int]string) { stacks <- s },
	})
	lp := leader.plan(t.Context(), attemptOf(0, 2, kv))
	if lp.base != 0 || lp.size != 4 || lp.fwd != nil || lp.asker == nil {
		t.Fatalf("leader: got %+v, want all 4 ranks and a way to ask for stacks", lp)
	}
	raw, err := kv.get(t.Context(), LeaderKey("job", 3))
	if err != nil {
		t.Fatal(err)
	}
	if ep, err := relay.DecodeEndpoint(raw); err != nil || ep.Secret != "" {
		t.Fatalf("published %+v, %v: want an endpoint without a secret (--rdzv-token derives it)", ep, err)
	}

	remote := make(chan telemetry.Hang, 1)
	follower := testPlanner(t, nil)
	follower.stacks = func(_ context.Context, h telemetry.Hang) (map[int]string, bool) {
		return map[int]string{3: "stack of rank 3"}, h.Gen == 3
	}
	follower.onRemote = func(h telemetry.Hang) { remote <- h }
	fp := follower.plan(t.Context(), attemptOf(1, 2, kv))
	if fp.fwd == nil || fp.done == nil {
		t.Fatalf("follower: got %+v, want a forwarder", fp)
	}
	defer fp.done()

	fp.fwd.Send([]telemetry.Record{{Gen: 3, Step: 1, Rank: 3, Arrive: time.Now()}})
	select {
	case got := <-recs:
		if len(got) != 1 || got[0].Rank != 3 {
			t.Errorf("got records %+v, want rank 3's", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the leader got no records")
	}

	h := telemetry.Hang{Key: telemetry.Key{Gen: 3, Step: 1}, Waiting: []int{0, 1, 2}, Missing: []int{3}}
	lp.asker.RequestStacks(h)
	select {
	case got := <-stacks:
		if got[3] != "stack of rank 3" {
			t.Errorf("got stacks %v, want rank 3's", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the leader got no stacks")
	}
	select {
	case got := <-remote:
		if got.Step != 1 {
			t.Errorf("got remote hang %+v, want step 1's", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the follower was not told of the hang")
	}
}
