package comm

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/control"
	"github.com/ddp-agent/ddp-agent/shim/status"
	"github.com/ddp-agent/ddp-agent/wire"
)

// TestFirstArrivalInFlight: rank 0 of 2 opens its communicator for step 3
// bucket 1 under a real control server, and rank 1 never opens. While the
// bootstrap waits, the agent is told (after a second) that rank 0 has
// arrived at step 3 bucket 1: the wait for a rank that never came to the
// first all-reduce is a hang like any other. Without first_step, nothing
// is told.
func TestFirstArrivalInFlight(t *testing.T) {
	for _, c := range []struct {
		name    string
		first   string
		timeout int // ms: room for the in-flight report's tick under load
		want    bool
	}{
		{"first collective named", `, "first_step": 3, "first_bucket": 1`, 5000, true},
		{"none named", ``, 2500, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			var got []wire.CollectiveEvent
			srv, err := control.Listen(control.Config{Dir: t.TempDir(), KV: control.NewMemKV()}, control.PIDAdmission{
				Authorize: func(pid int) (int, error) {
					if pid != os.Getpid() {
						return 0, fmt.Errorf("pid %d", pid)
					}
					return 0, nil
				},
				OnEvents: func(_ int, ev wire.Events) { mu.Lock(); got = append(got, ev.Events...); mu.Unlock() },
			})
			if err != nil {
				t.Fatal(err)
			}
			srv.SetGeneration(0, 2, nil)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = srv.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })

			cfg, err := ParseConfig(fmt.Sprintf(`{"rank": 0, "world_size": 2, "bootstrap": "agent", "socket": %q, "timeout_ms": %d%s}`,
				srv.Path(), c.timeout, c.first))
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if comm, err := Open(cfg); err == nil || status.Of(err) != status.Timeout {
				if comm != nil {
					comm.Close()
				}
				t.Fatalf("open: %v, want a timeout waiting for rank 1", err)
			}
			if !c.want {
				mu.Lock()
				defer mu.Unlock()
				if len(got) != 0 {
					t.Errorf("events %+v, want none", got)
				}
				return
			}
			eventually(t, "the in-flight event", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) > 0 })
			mu.Lock()
			defer mu.Unlock()
			if len(got) != 1 {
				t.Fatalf("events %+v, want one in flight for step 3 bucket 1", got)
			}
			ev := got[0]
			arrived := time.Unix(0, ev.TArrive)
			if ev.Status != wire.StatusInFlight || ev.Step != 3 || ev.Bucket != 1 || ev.TEnd != 0 ||
				arrived.Before(start) || arrived.Sub(start) > time.Second {
				t.Errorf("event %+v (arrived %v after the open), want in flight for step 3 bucket 1, arrived at the open", ev, arrived.Sub(start))
			}
		})
	}
}
