package agent

import (
	"context"
	"fmt"
	"time"
)

// The restart backoff. torchrun restarts a failed group at once, however
// often it fails, so a worker that crashes at start-up burns every restart
// in seconds (50 in 4 s), before anyone can look, and hammers what it
// crashes on (a file system, a store, a GPU). Neither torchrun nor
// TorchElastic has a setting for it, so these are constants, not flags.
//
// The first restart after a failure is immediate: most faults are one-off
// (a lost node, an OOM, an XID) and the job should lose no time. From the
// second quick failure in a row the agent waits, doubling each time, up to
// a cap; an attempt that ran healthily for a while ends the streak.
const (
	backoffFirst   = time.Second      // the wait after the second quick failure in a row
	backoffMax     = 30 * time.Second // the most it waits
	backoffHealthy = time.Minute      // an attempt that ran this long was no quick failure: the streak starts again
)

// backoffPolicy is the restart backoff's numbers.
type backoffPolicy struct {
	First, Max, Healthy time.Duration
}

// attemptEnd is how one attempt of the worker group ended, for the
// backoff.
type attemptEnd struct {
	Ran   time.Duration // from its workers' start to its end
	Fault bool          // a fault of this node (charged to the restarts); false: the round ended (another node's fault, a scale event)
}

// restartDelay decides how long to wait before the next attempt, from the
// attempts so far (oldest first), and how many quick failures in a row
// led to it. A quick failure is a fault of this node in an attempt that
// ran less than p.Healthy; an attempt that ran longer ends the streak; a
// short attempt that another node ended neither counts nor ends it. The
// delay is 0 unless the last attempt was a quick failure, and for k quick
// failures in a row it is 0, First, 2×First, 4×First, ... up to p.Max.
func restartDelay(hist []attemptEnd, p backoffPolicy) (time.Duration, int) {
	if len(hist) == 0 || !hist[len(hist)-1].Fault || hist[len(hist)-1].Ran >= p.Healthy {
		return 0, 0
	}
	quick := 0
	for i := len(hist) - 1; i >= 0 && hist[i].Ran < p.Healthy; i-- {
		if hist[i].Fault {
			quick++
		}
	}
	if quick < 2 {
		return 0, quick
	}
	d := p.First
	for i := 2; i < quick && d < p.Max; i++ {
		d *= 2
	}
	return min(d, p.Max), quick
}

// recentAttempts drops what restartDelay no longer looks at: everything
// before the last healthy attempt, so a long job's history stays small.
func recentAttempts(hist []attemptEnd, p backoffPolicy) []attemptEnd {
	for i := len(hist) - 1; i >= 0; i-- {
		if hist[i].Ran >= p.Healthy {
			return append(hist[:0], hist[i+1:]...)
		}
	}
	return hist
}

// backoff is the agent's policy: the constants, with the cap lowered
// under a store to half the join timeout, so that a node waiting out its
// backoff never makes the next round time out without it.
func (a *Agent) backoff() backoffPolicy {
	p := backoffPolicy{First: backoffFirst, Max: backoffMax, Healthy: backoffHealthy}
	if r := a.cfg.Rendezvous; r.Backend.UsesStore() && r.JoinTimeout > 0 {
		p.Max = min(p.Max, r.JoinTimeout/2)
	}
	return p
}

// waitBackoff waits before the next attempt as restartDelay says, unless
// ctx ends first (a signal: its cause is returned) or urgent is closed (a
// drain is queued: nil, for the caller to handle it).
func (a *Agent) waitBackoff(ctx context.Context, urgent <-chan struct{}, hist []attemptEnd) error {
	d, quick := restartDelay(hist, a.backoff())
	if d <= 0 {
		return nil
	}
	a.log.Warn(fmt.Sprintf("restarting in %v (backoff after %d quick failures)", d, quick),
		"delay", d, "quick_failures", quick, "healthy_after", backoffHealthy, "max_delay", a.backoff().Max)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-urgent:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
