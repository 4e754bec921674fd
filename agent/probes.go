package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry/export"
)

// phase is where the supervision loop is, as the readiness probe tells it.
type phase string

const (
	phaseRendezvous phase = "rendezvous" // waiting for the next round
	phaseRunning    phase = "running"    // this generation's workers run
	phaseRestarting phase = "restarting" // stopping workers after a fault, backing off
	phaseStopped    phase = "stopped"    // the loop has returned, or the agent is stopping
)

// healthTick is how often the loop ticks while the workers run; a loop
// that has not ticked for healthStale is reported stuck.
const (
	healthTick  = time.Second
	healthStale = 30 * time.Second
)

// loopHealth is what the Kubernetes probes on the metrics server see of
// the agent (export.Health): the loop's phase, when it last ticked, and
// whether the agent is stopping. Safe for concurrent use.
type loopHealth struct {
	now func() time.Time

	mu       sync.Mutex
	phase    phase
	tick     time.Time
	stopping error // why the agent is stopping; nil while it is not
}

var _ export.Health = (*loopHealth)(nil)

func newLoopHealth(now func() time.Time) *loopHealth {
	return &loopHealth{now: now, phase: phaseRendezvous, tick: now()}
}

// set moves the loop to phase p; it counts as a tick.
func (h *loopHealth) set(p phase) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.phase, h.tick = p, h.now()
}

// ticked notes that the loop is alive.
func (h *loopHealth) ticked() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tick = h.now()
}

// stop notes that the agent is stopping (ctx ended) and why.
func (h *loopHealth) stop(ctx context.Context) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopping = context.Cause(ctx)
	if h.stopping == nil {
		h.stopping = errors.New("stopping")
	}
}

// Live is the liveness probe: an error when the agent is stopping, or the
// loop has not ticked for healthStale while the workers run (it ticks
// every healthTick then). In the other phases the loop waits, bounded, on
// the rendezvous, the restart backoff or the workers' stop, and ticks when
// it moves on; those waits are not taken for a stuck loop.
func (h *loopHealth) Live() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopping != nil {
		return fmt.Errorf("agent stopping: %v", h.stopping)
	}
	if since := h.now().Sub(h.tick); h.phase == phaseRunning && since > healthStale {
		return fmt.Errorf("supervision loop stuck: no tick for %v while the workers run", since.Round(time.Second))
	}
	return nil
}

// Ready is the readiness probe: nil while this generation's workers run,
// else an error naming the phase (rendezvous, restarting, stopped).
func (h *loopHealth) Ready() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.stopping != nil:
		return errors.New(string(phaseStopped))
	case h.phase != phaseRunning:
		return errors.New(string(h.phase))
	}
	return nil
}
