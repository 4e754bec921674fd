// Package agent is the node agent's run loop: it joins the job's
// rendezvous, starts the control socket, the host monitor, the GPU health
// watch and the collective watch, then runs attempts of the local worker
// group. Every fault of an attempt (a worker's exit, the end of the
// rendezvous round, a GPU finding, a hang) arrives as one Fault and is
// handled in one place: the job restarts while restarts remain.
package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/hostmon"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
)

// JobFailedError is returned by Run when the job failed and no restarts
// were left. Cause is the root cause when it was a worker of this node;
// Reason says what happened otherwise (a fault on another node).
type JobFailedError struct {
	Attempts int
	Cause    *supervisor.WorkerExitError
	Reason   string
}

func (e *JobFailedError) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("job failed after %d attempt(s): %v", e.Attempts, e.Cause)
	}
	return fmt.Sprintf("job failed after %d attempt(s) on this node: %s", e.Attempts, e.Reason)
}

func (e *JobFailedError) Unwrap() error {
	if e.Cause == nil {
		return nil
	}
	return e.Cause
}

// SignalError is the cause of the agent's context when a signal asked it to
// stop; main exits with 128+Signal.
type SignalError struct{ Signal syscall.Signal }

func (e *SignalError) Error() string { return "received " + e.Signal.String() }

// stopSignal is what the workers get first when the agent stops: SIGINT
// when the user pressed Ctrl-C (Python raises KeyboardInterrupt, as under
// torchrun, where the terminal's SIGINT reaches the workers directly),
// SIGTERM otherwise.
func stopSignal(cause error) syscall.Signal {
	var se *SignalError
	if errors.As(cause, &se) && se.Signal == syscall.SIGINT {
		return syscall.SIGINT
	}
	return syscall.SIGTERM
}

// Agent supervises this node's workers for one job.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	stdout  *supervisor.Console
	stderr  *supervisor.Console
	baseEnv []string

	gpus *GPUs

	losses logLosses // worker log files that miss output, for the exit summary

	mu         sync.Mutex
	group      *supervisor.Group // the current attempt, for the control socket's admission check
	rankOffset int               // its global rank of local rank 0, for the GPU health watcher
}

// New returns an agent for cfg. Worker output and failure reports go to
// stdout and stderr; workers inherit baseEnv (usually os.Environ()).
func New(cfg Config, log *slog.Logger, stdout, stderr *supervisor.Console, baseEnv []string) *Agent {
	return &Agent{cfg: cfg, log: log, stdout: stdout, stderr: stderr, baseEnv: baseEnv}
}

// Run runs the job until every worker has succeeded (nil), the job failed
// (*JobFailedError), or ctx is done: then the workers are stopped within the
// grace period and context.Cause(ctx) is returned.
func (a *Agent) Run(ctx context.Context) (err error) {
	if err := a.cfg.check(); err != nil {
		return err
	}
	runID := a.cfg.RunID
	if runID == "" {
		runID = newRunID()
	}
	runDir, keep, err := a.runDir(runID)
	if err != nil {
		return err
	}
	if !keep {
		defer os.RemoveAll(runDir)
	}

	defer a.summarizeLogLosses() // the last lines of the run: every worker stream has ended

	ctx, cancel := context.WithCancelCause(ctx)
	s := &session{runID: runID, runDir: runDir, keep: keep, events: newEventTally(), faults: newFaults(),
		mon: hostmon.NewMonitor(a.log), health: newLoopHealth(time.Now)}
	stopHealth := context.AfterFunc(ctx, func() { s.health.stop(ctx) })
	defer stopHealth()
	s.stragglers = a.newStragglerPolicy(ctx, s)
	// Last: the notifiers deliver the job's last events, then stop. The
	// job's end is told after the background parts are gone, so nothing
	// (a GPU fault) comes after it.
	defer func() {
		if s.plugins != nil {
			s.tell(event{kind: evEnded, err: err})
			s.plugins.Close(pluginFlush)
		}
	}()
	defer s.bg.Wait()
	defer cancel(nil) // runs first: stop the background parts, then wait for them
	if err := a.startPlugins(runID, s); err != nil {
		return err
	}

	// A drain finding (a plugin, a GPU) can come while the rendezvous
	// waits for its nodes: the node must still exit as drained, not with
	// the cancelled wait's error.
	jctx, stopJoin := s.faults.bound(ctx)
	s.j, err = a.openRendezvous(jctx, runID)
	stopJoin()
	if err != nil {
		return a.drainOr(ctx, s, err)
	}
	defer s.j.close()
	defer s.leave("agent exiting") // unless it left already: drained, failed, succeeded
	closeTelemetry, err := a.startTelemetry(ctx, s)
	if err != nil {
		return a.drainOr(ctx, s, err)
	}
	defer closeTelemetry()
	stopControl, err := a.startControl(ctx, s)
	if err != nil {
		return err
	}
	defer stopControl() // runs before bg.Wait
	a.startMonitors(ctx, s)

	a.log.Info("starting job", "run_id", runID, "nproc_per_node", a.cfg.NProcPerNode, "gpus", a.gpus.summary(),
		"nnodes", a.cfg.nnodes(), "max_restarts", a.cfg.MaxRestarts, "command", a.cfg.Command,
		"log_dir", logDirAttr(runDir, keep), "control_socket", s.srv.Path())
	s.tell(event{kind: evStarted, started: startedJob{runID: runID, command: strings.Join(a.cfg.Command, " "),
		nproc: a.cfg.NProcPerNode, nnodes: a.cfg.nnodes()}})
	return a.loop(ctx, s)
}

// drainOr ends the run with a drain of this node found meanwhile, if one
// is queued, rather than with err: a drain that came while the rendezvous
// waited for its nodes ends that wait, and the node must exit as drained.
func (a *Agent) drainOr(ctx context.Context, s *session, err error) error {
	if f := s.faults.drain(); f != nil {
		_, err := a.recover(ctx, s, nil, f)
		return err
	}
	return err
}

func (a *Agent) setGroup(g *supervisor.Group, rankOffset int) {
	a.mu.Lock()
	a.group, a.rankOffset = g, rankOffset
	a.mu.Unlock()
}

// place is the supervisor's Spec.Place: nil on a CPU-only node.
func (a *Agent) place() func(int) supervisor.Placement {
	if a.gpus == nil || a.gpus.Plan == nil {
		return nil
	}
	return a.gpus.place
}

// authorize admits a control-socket peer only if it is a worker of the
// current attempt or one of its descendants.
func (a *Agent) authorize(pid int) (int, error) {
	a.mu.Lock()
	g := a.group
	a.mu.Unlock()
	if g == nil {
		return 0, errors.New("no workers running")
	}
	return g.RankOf(pid)
}

func newRunID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
