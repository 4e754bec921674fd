// Package backoff is the restart backoff of the agent's loop. torchrun
// restarts a failed group at once, however often it fails, so a worker
// that crashes at start-up burns every restart in seconds (50 in 4 s),
// before anyone can look, and hammers what it crashes on (a file system,
// a store, a GPU). Neither torchrun nor TorchElastic has a setting for it,
// so these are constants, not flags.
//
// The first restart after a failure is immediate: most faults are one-off
// (a lost node, an OOM, an XID) and the job should lose no time. From the
// second quick failure in a row the agent waits, doubling each time, up to
// a cap; an attempt that ran healthily for a while ends the streak. The
// decision is pure (Policy.Delay); the agent does the waiting.
package backoff

import "time"

// The agent's numbers.
const (
	First   = time.Second      // the wait after the second quick failure in a row
	Max     = 30 * time.Second // the most it waits
	Healthy = time.Minute      // an attempt that ran this long was no quick failure: the streak starts again
)

// Policy is the restart backoff's numbers.
type Policy struct {
	First, Max, Healthy time.Duration
}

// For is the agent's policy: the constants, with the cap lowered to half
// the join timeout when joinTimeout > 0 (a rendezvous with a store), so
// that a node waiting out its backoff never makes the next round time out
// without it.
func For(joinTimeout time.Duration) Policy {
	p := Policy{First: First, Max: Max, Healthy: Healthy}
	if joinTimeout > 0 {
		p.Max = min(p.Max, joinTimeout/2)
	}
	return p
}

// Attempt is how one attempt of the worker group ended.
type Attempt struct {
	Ran   time.Duration // from its workers' start to its end
	Fault bool          // a fault of this node (charged to the restarts); false: the round ended (another node's fault, a scale event)
}

// Delay decides how long to wait before the next attempt, from the
// attempts so far (oldest first), and how many quick failures in a row
// led to it. A quick failure is a fault of this node in an attempt that
// ran less than p.Healthy; an attempt that ran longer ends the streak; a
// short attempt that another node ended neither counts nor ends it. The
// delay is 0 unless the last attempt was a quick failure, and for k quick
// failures in a row it is 0, First, 2×First, 4×First, ... up to p.Max.
func (p Policy) Delay(hist []Attempt) (time.Duration, int) {
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

// Recent drops what Delay no longer looks at: everything before the last
// healthy attempt, so a long job's history stays small.
func (p Policy) Recent(hist []Attempt) []Attempt {
	for i := len(hist) - 1; i >= 0; i-- {
		if hist[i].Ran >= p.Healthy {
			return append(hist[:0], hist[i+1:]...)
		}
	}
	return hist
}
