// Package agent is the node agent's run loop: it joins the job's
// rendezvous, starts the control socket, the host monitor, the GPU health
// watch and the collective watch, then runs attempts of the local worker
// group. Every fault (a worker's exit, the end of the rendezvous round, a
// GPU finding, a detector's verdict, a hang, a confirmed straggler)
// arrives as one fault.Fault with its Severity, through one queue, and is
// handled in one place: the job restarts while restarts remain, moves to
// a new generation, or this node drains or fails.
//
// An Agent holds what lives from its construction (the Config, the
// console, the workers' base environment); each Run makes one run of the
// job (run.go), whose methods are the loop: start, wait, recover, fail,
// succeed, stop.
package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"syscall"

	"github.com/ddp-agent/ddp-agent/agent/rundir"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
)

// JobFailedError is the Err of the *fault.Error Run returns when the job
// failed and no restarts were left. Cause is the root cause when it was a
// worker of this node; Reason says what happened otherwise (a fault on
// another node).
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
// torchrun, where the terminal's SIGINT reaches the workers directly);
// SIGTERM for SIGTERM, SIGHUP, SIGQUIT and any other cause; a signal
// --signals-to-handle added (SIGUSR1: Slurm's warning before the time
// limit, which Lightning checkpoints on) as it is, as torchrun forwards it.
func stopSignal(cause error) syscall.Signal {
	var se *SignalError
	if !errors.As(cause, &se) {
		return syscall.SIGTERM
	}
	switch se.Signal {
	case syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT:
		return syscall.SIGTERM
	}
	return se.Signal
}

// Agent supervises this node's workers for one job. It holds only what
// lives from New; it is not changed by Run.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	stdout  *supervisor.Console
	stderr  *supervisor.Console
	baseEnv []string
}

// New returns an agent for cfg. Worker output and failure reports go to
// stdout and stderr; workers inherit baseEnv (usually os.Environ()).
func New(cfg Config, log *slog.Logger, stdout, stderr *supervisor.Console, baseEnv []string) *Agent {
	return &Agent{cfg: cfg, log: log, stdout: stdout, stderr: stderr, baseEnv: baseEnv}
}

// Run runs the job until every worker has succeeded (nil), a fault ended
// this node's part (*fault.Error: the node drained, or the job failed), or
// ctx is done: then the workers are stopped within the grace period and
// context.Cause(ctx) is returned. Only a signal or the caller ends ctx.
func (a *Agent) Run(ctx context.Context) error {
	if err := a.cfg.check(); err != nil {
		return err
	}
	runID := a.cfg.RunID
	if runID == "" {
		runID = newRunID()
	}
	dir, err := a.runDir(runID)
	if err != nil {
		return err
	}
	return newRun(a, runID, dir).execute(ctx)
}

// runDir makes the directory of run runID (package rundir).
func (a *Agent) runDir(runID string) (*rundir.Dir, error) {
	return rundir.Make(a.cfg.LogDir, a.cfg.KeepLogs, runID)
}

func newRunID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
