// Package fault is the agent's faults: why this node's attempt, or its
// part of the job, must end before its workers finish. Every source (a
// worker's exit, the end of the rendezvous round, a GPU health finding, a
// hang, a detector plugin's verdict, a confirmed persistent straggler)
// makes a Fault with its Severity and reports it to the one Queue; the
// agent's run loop takes them from there and decides, in one place, what
// to do (agent/recover.go).
package fault

import (
	"errors"
	"fmt"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/straggler"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/watch"
)

// Severity is what a fault calls for, least to most. Every source gives
// its fault one; the agent's recover alone turns it into what the agent
// does.
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
// (agent/recover.go): a worker's exit, the end of the rendezvous round, a GPU
// health finding, a hang, a detector plugin's verdict, a confirmed
// persistent straggler.
type Fault struct {
	Source   Source
	Severity Severity
	Gen      uint64    // the generation it belongs to
	Seen     time.Time // when it was observed; a fault from before the attempt started is stale
	Reason   string    // one line, for the rendezvous, the log and the trace
	// Err is the source's own error: *WorkerFailedError, *GPUError,
	// *watch.HangError, *straggler.Error, *PluginError,
	// *supervisor.StoreExitError or *RoundEndedError.
	Err error
}

// Source says where a fault came from.
type Source int

// The fault sources.
const (
	FromWorker    Source = iota // a worker exited non-zero or was killed
	FromRound                   // the rendezvous moved the job to another generation
	FromGPU                     // a GPU health finding
	FromHang                    // a collective hung
	FromStraggler               // a persistent straggler confirmed under --straggler-action restart or drain
	FromPlugin                  // a detector plugin's verdict
	FromStore                   // the process serving the workers' store exited
)

// Error is what agent.Run returns when a fault ended this node's part of
// the job: Severity Drain (the node leaves the job; Err is the source's
// error) or Fail (the job failed; Err is an *agent.JobFailedError). It
// reads as Err.
type Error struct {
	Severity Severity
	Err      error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// RestartsJob reports whether the fault is this node's, to be told to the
// rendezvous and charged to the restart budget; a round that ended is
// somebody else's (or no fault at all: a membership change).
func (f *Fault) RestartsJob() bool { return f.Severity != NewGeneration }

// Stale reports whether f belongs to an earlier attempt than the one of
// generation gen that started at started: stopping workers can itself
// raise XIDs (43 for a process killed in a kernel), and a hang found just
// as its attempt ended must not end the next one. A drain is the node's,
// never an attempt's: it is never stale.
func (f *Fault) Stale(gen uint64, started time.Time) bool {
	switch {
	case f.Severity >= Drain:
		return false
	case f.Source == FromGPU || f.Source == FromPlugin: // the watchers know no generations: their findings have times
		return f.Seen.Before(started)
	}
	return f.Gen != gen
}

func Worker(gen uint64, e *WorkerFailedError) *Fault {
	return &Fault{Source: FromWorker, Severity: Restart, Gen: gen, Seen: e.Decided, Reason: e.Error(), Err: e}
}

// Store is the workers' store's process exiting under the attempt of
// generation gen: every worker's next use of the store fails.
func Store(gen uint64, se *supervisor.StoreExitError) *Fault {
	return &Fault{Source: FromStore, Severity: Restart, Gen: gen, Seen: se.Time, Reason: se.Error(), Err: se}
}

func Round(gen uint64, reason string) *Fault {
	return &Fault{Source: FromRound, Severity: NewGeneration, Gen: gen, Seen: time.Now(), Reason: reason, Err: &RoundEndedError{Reason: reason}}
}

func Hang(h *watch.HangError) *Fault {
	return &Fault{Source: FromHang, Severity: Restart, Gen: h.Hang.Gen, Seen: time.Now(), Reason: h.Error(), Err: h}
}

// GPU is a GPU health finding's fault: a restart, or a drain.
func GPU(gf *GPUError) *Fault {
	if gf.Drains() {
		return &Fault{Source: FromGPU, Severity: Drain, Seen: gf.Last(), Reason: gf.Error(), Err: gf}
	}
	return &Fault{Source: FromGPU, Severity: Restart, Seen: gf.Last(), Reason: gf.Finding(), Err: gf}
}

// Plugin is a detector's verdict's fault: a restart, or a drain.
func Plugin(pf *PluginError) *Fault {
	sev := Restart
	if pf.Drains() {
		sev = Drain
	}
	return &Fault{Source: FromPlugin, Severity: sev, Seen: pf.Finding.Time, Reason: pf.Error(), Err: pf}
}

// Straggler is a persistent straggler confirmed at seen in the
// attempt of generation gen: under --straggler-action restart, like a
// hang, the job moves to a new generation and the restart counts against
// --max-restarts; under drain this node leaves the job.
func Straggler(gen uint64, seen time.Time, se *straggler.Error) *Fault {
	if se.Action == straggler.ActionDrain {
		return &Fault{Source: FromStraggler, Severity: Drain, Gen: gen, Seen: seen, Reason: se.Error(), Err: se}
	}
	return &Fault{Source: FromStraggler, Severity: Restart, Gen: gen, Seen: seen, Reason: se.Finding(), Err: se}
}

// As is errors.As for a fault's error.
func As[T error](f *Fault) (T, bool) {
	var t T
	ok := f != nil && errors.As(f.Err, &t)
	return t, ok
}
