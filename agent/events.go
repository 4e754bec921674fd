package agent

import (
	"log/slog"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/wire"
)

// eventTally counts the collective timing events that the workers' shims
// send over the control socket during one attempt. (Turning them into
// stall analysis and traces is the telemetry package's job.)
type eventTally struct {
	mu       sync.Mutex
	received uint64
	dropped  uint64
	failed   uint64 // events whose collective returned an error
	ranks    map[int]bool
}

func newEventTally() *eventTally { return &eventTally{ranks: map[int]bool{}} }

// add is the control server's OnEvents; it runs on connection goroutines.
func (t *eventTally) add(rank int, ev wire.Events) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.received += uint64(len(ev.Events))
	t.dropped += ev.Dropped
	for _, e := range ev.Events {
		if e.Failed() {
			t.failed++
		}
	}
	t.ranks[rank] = true
}

// report logs the attempt's counts, if any shim sent events, and resets
// them. It first waits (briefly) for the workers' control connections to
// close, so that the last batch, sent as a worker exits, is counted.
func (t *eventTally) report(log *slog.Logger, gen uint64, conns func() int) {
	for deadline := time.Now().Add(time.Second); conns() > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	t.mu.Lock()
	received, dropped, failed, ranks := t.received, t.dropped, t.failed, len(t.ranks)
	t.received, t.dropped, t.failed, t.ranks = 0, 0, 0, map[int]bool{}
	t.mu.Unlock()
	if received == 0 && dropped == 0 {
		return
	}
	log.Info("collective events", "generation", gen, "received", received, "dropped", dropped, "failed", failed, "ranks", ranks)
}
