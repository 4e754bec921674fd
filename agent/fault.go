package agent

import (
	"errors"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rootcause"
	"github.com/ddp-agent/ddp-agent/agent/straggler"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/watch"
)

// Fault is why this node's attempt must end before its workers finish.
// Every source delivers one, to one queue, and the run loop handles them
// in one place (Agent.recover): a worker's exit, the end of the
// rendezvous round (another node's fault, or a node joining or leaving), a
// GPU health finding, a hang, a confirmed persistent straggler
// (--straggler-action restart).
type Fault struct {
	Source FaultSource
	Gen    uint64    // the generation it belongs to
	Seen   time.Time // when it was observed; a fault from before the attempt started is stale
	Reason string    // one line, for the rendezvous, the log and the trace
	// Err is the source's own error: *WorkerFailedError, *GPUFaultError,
	// *watch.HangError, *straggler.Error, *PluginFaultError or
	// *RoundEndedError.
	Err error
}

// FaultSource says where a fault came from.
type FaultSource int

// The fault sources.
const (
	FromWorker    FaultSource = iota // a worker exited non-zero or was killed
	FromRound                        // the rendezvous moved the job to another generation
	FromGPU                          // a GPU health finding that calls for a restart
	FromHang                         // a collective hung
	FromStraggler                    // a persistent straggler confirmed under --straggler-action restart
	FromPlugin                       // a detector plugin's finding that calls for a restart
)

// RoundEndedError is the cause of a round's end when the job moved to
// another generation because of something outside this node.
type RoundEndedError struct{ Reason string }

func (e *RoundEndedError) Error() string { return "generation ended: " + e.Reason }

// WorkerFailedError is the fault of an attempt in which this node's
// workers failed, with its root cause: the rank whose failure came first
// (maybe not the first to exit), and the ranks that failed only because of
// it.
type WorkerFailedError struct {
	Blame rootcause.Blame
	// Decided is when the root cause was worked out: what workers noted
	// or how they exited after it comes from the agent stopping them.
	Decided time.Time
}

func (e *WorkerFailedError) Error() string { return e.Blame.Reason() }

// Unwrap is the root cause's exit, when it is a worker of this node that
// has exited.
func (e *WorkerFailedError) Unwrap() error {
	if e.Blame.Exit == nil {
		return nil
	}
	return e.Blame.Exit
}

// restartsJob reports whether the fault is this node's, to be told to the
// rendezvous and charged to the restart budget; a round that ended is
// somebody else's (or no fault at all: a membership change).
func (f *Fault) restartsJob() bool { return f.Source != FromRound }

// stale reports whether f belongs to an earlier attempt than the one of
// generation gen that started at started: stopping workers can itself
// raise XIDs (43 for a process killed in a kernel), and a hang found just
// as its attempt ended must not end the next one.
func (f *Fault) stale(gen uint64, started time.Time) bool {
	if f.Source == FromGPU || f.Source == FromPlugin { // the watchers know no generations: their findings have times
		return f.Seen.Before(started)
	}
	return f.Gen != gen
}

func workerFault(gen uint64, e *WorkerFailedError) *Fault {
	return &Fault{Source: FromWorker, Gen: gen, Seen: e.Decided, Reason: e.Error(), Err: e}
}

func roundFault(gen uint64, reason string) *Fault {
	return &Fault{Source: FromRound, Gen: gen, Seen: time.Now(), Reason: reason, Err: &RoundEndedError{Reason: reason}}
}

func hangFault(h *watch.HangError) *Fault {
	return &Fault{Source: FromHang, Gen: h.Hang.Gen, Seen: time.Now(), Reason: h.Error(), Err: h}
}

// stragglerFault restarts the attempt of generation gen for a persistent
// straggler confirmed at seen, like a hang: the job moves to a new
// generation and the restart counts against --max-restarts.
func stragglerFault(gen uint64, seen time.Time, se *straggler.Error) *Fault {
	return &Fault{Source: FromStraggler, Gen: gen, Seen: seen, Reason: se.Finding(), Err: se}
}

// faults is the one queue every fault source reports to. The run loop
// takes the first fault that belongs to the current attempt.
type faults struct {
	mu      sync.Mutex
	pending []*Fault
	ready   chan struct{} // has a value when pending may be non-empty
}

func newFaults() *faults { return &faults{ready: make(chan struct{}, 1)} }

// report queues f; it never blocks. A GPU fault takes the place of one
// that still waits, with its findings: the report then names them all.
func (q *faults) report(f *Fault) {
	q.mu.Lock()
	if gf, ok := f.Err.(*GPUFaultError); ok {
		for i, p := range q.pending {
			if old, ok := p.Err.(*GPUFaultError); ok {
				gf.Findings = append(gf.Findings, old.Findings...)
				f.Seen, f.Reason = gf.last(), gf.finding()
				q.pending = append(q.pending[:i], q.pending[i+1:]...)
				break
			}
		}
	}
	q.pending = append(q.pending, f)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// take returns the first queued fault of the attempt of generation gen
// that started at started, dropping the stale ones before it (passed to
// drop, for the log); nil when there is none.
func (q *faults) take(gen uint64, started time.Time, drop func(*Fault)) *Fault {
	var stale []*Fault
	defer func() { // outside the lock: drop logs, and a blocked stderr must not block report
		for _, f := range stale {
			drop(f)
		}
	}()
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.pending) > 0 {
		f := q.pending[0]
		q.pending = q.pending[1:]
		if !f.stale(gen, started) {
			return f
		}
		stale = append(stale, f)
	}
	return nil
}

// clear drops every queued fault: between attempts they are all stale.
func (q *faults) clear() {
	q.mu.Lock()
	q.pending = nil
	q.mu.Unlock()
}

// errorsAs is errors.As for a fault's error.
func errorsAs[T error](f *Fault) (T, bool) {
	var t T
	ok := f != nil && errors.As(f.Err, &t)
	return t, ok
}
