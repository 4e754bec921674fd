package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/pluginhost"
	"github.com/ddp-agent/ddp-agent/agent/rootcause"
	"github.com/ddp-agent/ddp-agent/agent/straggler"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/watch"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

// Severity is what a fault calls for, least to most. Every source gives
// its fault one; recover alone turns it into what the agent does.
type Severity int

// The severities.
const (
	// NewGeneration: the job moves to a new generation for something
	// outside this node (another node's fault, a node lost, left or
	// joined); not charged to --max-restarts here.
	NewGeneration Severity = iota
	// Restart: a fault of this node's attempt (a worker's exit, a hang, a
	// GPU or plugin finding, a confirmed straggler): the job restarts,
	// charged to --max-restarts; with none left it fails.
	Restart
	// Drain: this node leaves the job, whatever its attempt (a GPU that
	// needs a reset or a drain, a detector's drain-node verdict, a
	// straggler under --straggler-action drain); the agent exits 3.
	Drain
	// Fail: the job ended failed.
	Fail
)

func (s Severity) String() string {
	switch s {
	case NewGeneration:
		return "new-generation"
	case Restart:
		return "restart"
	case Drain:
		return "drain"
	case Fail:
		return "fail"
	}
	return fmt.Sprintf("severity(%d)", int(s))
}

// Fault is why this node's attempt, or its part of the job, must end
// before its workers finish. Every source delivers one, with its
// Severity, to one queue, and the run loop handles them in one place
// (recover): a worker's exit, the end of the rendezvous round, a GPU
// health finding, a hang, a detector plugin's verdict, a confirmed
// persistent straggler.
type Fault struct {
	Source   FaultSource
	Severity Severity
	Gen      uint64    // the generation it belongs to
	Seen     time.Time // when it was observed; a fault from before the attempt started is stale
	Reason   string    // one line, for the rendezvous, the log and the trace
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
	FromGPU                          // a GPU health finding
	FromHang                         // a collective hung
	FromStraggler                    // a persistent straggler confirmed under --straggler-action restart or drain
	FromPlugin                       // a detector plugin's verdict
)

// FaultError is what Run returns when a fault ended this node's part of
// the job: Severity Drain (the node leaves the job; Err is the source's
// error) or Fail (the job failed; Err is a *JobFailedError). It reads as
// Err.
type FaultError struct {
	Severity Severity
	Err      error
}

func (e *FaultError) Error() string { return e.Err.Error() }
func (e *FaultError) Unwrap() error { return e.Err }

// PluginFaultError is a detector plugin's finding that stops this node's
// workers: restart-workers restarts the job (a fault, counted against
// --max-restarts); drain-node makes the node leave the job, and the agent
// exit 3.
type PluginFaultError struct{ Finding pluginhost.Finding }

func (e *PluginFaultError) Error() string {
	f := e.Finding
	what := fmt.Sprintf("plugin %s: %s: %s", f.Plugin, f.Subject, f.Message)
	if e.Drains() {
		return what + ": this node must be drained; it leaves the job"
	}
	return what + ": restarting the workers"
}

// Drains reports whether the finding makes the node leave the job.
func (e *PluginFaultError) Drains() bool { return e.Finding.Action >= detector.ActionDrainNode }

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
func (f *Fault) restartsJob() bool { return f.Severity != NewGeneration }

// stale reports whether f belongs to an earlier attempt than the one of
// generation gen that started at started: stopping workers can itself
// raise XIDs (43 for a process killed in a kernel), and a hang found just
// as its attempt ended must not end the next one. A drain is the node's,
// never an attempt's: it is never stale.
func (f *Fault) stale(gen uint64, started time.Time) bool {
	switch {
	case f.Severity >= Drain:
		return false
	case f.Source == FromGPU || f.Source == FromPlugin: // the watchers know no generations: their findings have times
		return f.Seen.Before(started)
	}
	return f.Gen != gen
}

func workerFault(gen uint64, e *WorkerFailedError) *Fault {
	return &Fault{Source: FromWorker, Severity: Restart, Gen: gen, Seen: e.Decided, Reason: e.Error(), Err: e}
}

func roundFault(gen uint64, reason string) *Fault {
	return &Fault{Source: FromRound, Severity: NewGeneration, Gen: gen, Seen: time.Now(), Reason: reason, Err: &RoundEndedError{Reason: reason}}
}

func hangFault(h *watch.HangError) *Fault {
	return &Fault{Source: FromHang, Severity: Restart, Gen: h.Hang.Gen, Seen: time.Now(), Reason: h.Error(), Err: h}
}

// gpuFault is a GPU health finding's fault: a restart, or a drain.
func gpuFault(gf *GPUFaultError) *Fault {
	if gf.Drains() {
		return &Fault{Source: FromGPU, Severity: Drain, Seen: gf.last(), Reason: gf.Error(), Err: gf}
	}
	return &Fault{Source: FromGPU, Severity: Restart, Seen: gf.last(), Reason: gf.finding(), Err: gf}
}

// pluginFault is a detector's verdict's fault: a restart, or a drain.
func pluginFault(pf *PluginFaultError) *Fault {
	sev := Restart
	if pf.Drains() {
		sev = Drain
	}
	return &Fault{Source: FromPlugin, Severity: sev, Seen: pf.Finding.Time, Reason: pf.Error(), Err: pf}
}

// stragglerFault is a persistent straggler confirmed at seen in the
// attempt of generation gen: under --straggler-action restart, like a
// hang, the job moves to a new generation and the restart counts against
// --max-restarts; under drain this node leaves the job.
func stragglerFault(gen uint64, seen time.Time, se *straggler.Error) *Fault {
	if se.Action == straggler.ActionDrain {
		return &Fault{Source: FromStraggler, Severity: Drain, Gen: gen, Seen: seen, Reason: se.Error(), Err: se}
	}
	return &Fault{Source: FromStraggler, Severity: Restart, Gen: gen, Seen: seen, Reason: se.Finding(), Err: se}
}

// faults is the one queue every fault source reports to. The run loop
// takes the first fault that belongs to the current attempt, a drain
// before anything else; a drain also closes urgent, which ends what the
// loop waits on between attempts (the rendezvous, the backoff).
type faults struct {
	mu      sync.Mutex
	pending []*Fault
	ready   chan struct{} // has a value when pending may be non-empty
	urgent  chan struct{} // closed on the first drain reported
	once    sync.Once
}

func newFaults() *faults {
	return &faults{ready: make(chan struct{}, 1), urgent: make(chan struct{})}
}

// report queues f; it never blocks. A GPU fault takes the place of one of
// the same severity that still waits, with its findings: the report then
// names them all.
func (q *faults) report(f *Fault) {
	q.mu.Lock()
	if gf, ok := f.Err.(*GPUFaultError); ok && f.Severity == Restart {
		for i, p := range q.pending {
			if old, ok := p.Err.(*GPUFaultError); ok && p.Severity == Restart {
				gf.Findings = append(gf.Findings, old.Findings...)
				f.Seen, f.Reason = gf.last(), gf.finding()
				q.pending = append(q.pending[:i], q.pending[i+1:]...)
				break
			}
		}
	}
	q.pending = append(q.pending, f)
	q.mu.Unlock()
	if f.Severity >= Drain {
		q.once.Do(func() { close(q.urgent) })
	}
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// take returns the first queued drain, else the first queued fault of
// the attempt of generation gen that started at started, dropping the
// stale ones before it (passed to drop, for the log); nil when there is
// none.
func (q *faults) take(gen uint64, started time.Time, drop func(*Fault)) *Fault {
	if f := q.drain(); f != nil {
		return f
	}
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

// drain returns the first queued drain, left in the queue; nil when there
// is none.
func (q *faults) drain() *Fault {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, f := range q.pending {
		if f.Severity >= Drain {
			return f
		}
	}
	return nil
}

// takeWorker takes the queued failure of generation gen's workers, if
// there is one.
func (q *faults) takeWorker(gen uint64) *Fault {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, f := range q.pending {
		if f.Source == FromWorker && f.Gen == gen {
			q.pending = append(q.pending[:i], q.pending[i+1:]...)
			return f
		}
	}
	return nil
}

// clear drops every queued fault but a drain: between attempts the others
// are all stale.
func (q *faults) clear() {
	q.mu.Lock()
	defer q.mu.Unlock()
	kept := q.pending[:0]
	for _, f := range q.pending {
		if f.Severity >= Drain {
			kept = append(kept, f)
		}
	}
	q.pending = kept
}

// errorsAs is errors.As for a fault's error.
func errorsAs[T error](f *Fault) (T, bool) {
	var t T
	ok := f != nil && errors.As(f.Err, &t)
	return t, ok
}

// bound is ctx, ended too when a drain is reported: what the loop waits
// on outside an attempt's wait (the rendezvous, spawning the workers)
// gives way to it. Call cancel when done.
func (q *faults) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-q.urgent:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}
