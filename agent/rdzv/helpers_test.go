package rdzv

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// testStore starts an embedded etcd for one test and returns a client
// factory: every agent gets its own client, as separate processes would.
func testStore(t *testing.T) func() *store.Client {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv, err := store.Start(t.Context(), store.ServerConfig{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return func() *store.Client {
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

func open(t *testing.T, cli *store.Client, cfg Config) *Membership {
	t.Helper()
	e, err := Open(t.Context(), cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// nextAll calls Next on every agent at once and returns their rounds.
func nextAll(t *testing.T, es ...*Membership) []*Round {
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
		if r.Generation != rounds[0].Generation || r.WorldSize != rounds[0].WorldSize || r.MasterPort != rounds[0].MasterPort || r.NNodes != len(rounds) ||
			r.Run == "" || r.Run != rounds[0].Run {
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

func rankOf(rounds []*Round, es []*Membership, e *Membership) int {
	for i := range es {
		if es[i] == e {
			return rounds[i].GroupRank
		}
	}
	return -1
}

// revokeGone revokes lease as a dead agent's lease would run out; a lease
// that is gone already (its agent's Close revoked it) is fine.
func revokeGone(t *testing.T, cli *store.Client, lease int64) {
	t.Helper()
	if _, err := cli.Etcd().Revoke(t.Context(), clientv3.LeaseID(lease)); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatal(err)
	}
}
