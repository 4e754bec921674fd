// Package agent is the node agent's main loop: it starts the control socket
// and host monitor, then runs attempts of the local worker group, restarting
// the whole group after a failure while restarts remain.
package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/control"
	"github.com/ddp-agent/ddp-agent/agent/health"
	"github.com/ddp-agent/ddp-agent/agent/launch"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
)

// JobFailedError is returned by Run when a worker failed and no restarts
// were left. Cause is the root cause of the last attempt.
type JobFailedError struct {
	Attempts int
	Cause    *supervisor.WorkerExitError
}

func (e *JobFailedError) Error() string {
	return fmt.Sprintf("job failed after %d attempt(s): %v", e.Attempts, e.Cause)
}

func (e *JobFailedError) Unwrap() error { return e.Cause }

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
	cfg     *launch.Config
	log     *slog.Logger
	stdout  *supervisor.Console
	stderr  *supervisor.Console
	baseEnv []string

	mu    sync.Mutex
	group *supervisor.Group // the current attempt, for the control socket's admission check
}

// New returns an agent for cfg. Worker output and failure reports go to
// stdout and stderr; workers inherit baseEnv (usually os.Environ()).
func New(cfg *launch.Config, log *slog.Logger, stdout, stderr *supervisor.Console, baseEnv []string) *Agent {
	return &Agent{cfg: cfg, log: log, stdout: stdout, stderr: stderr, baseEnv: baseEnv}
}

// Run runs the job until every worker has succeeded (nil), the job failed
// (*JobFailedError), or ctx is done: then the workers are stopped within the
// grace period and context.Cause(ctx) is returned.
func (a *Agent) Run(ctx context.Context) error {
	cfg := a.cfg
	runID := cfg.RdzvID
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

	ctx, cancel := context.WithCancelCause(ctx)
	var bg sync.WaitGroup
	defer bg.Wait()
	defer cancel(nil) // runs first: stop the background parts, then wait for them

	events := newEventTally()
	srv, err := control.Listen(control.Config{JobID: runID, Authorize: a.authorize, OnEvents: events.add, Logger: a.log})
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	// The control socket outlives ctx: when a signal stops the job, the
	// workers must still receive Abort while they are being stopped.
	srvCtx, stopSrv := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSrv() // runs before bg.Wait
	bg.Add(1)
	go func() {
		defer bg.Done()
		if err := srv.Run(srvCtx); err != nil {
			a.log.Error("control socket stopped", "err", err)
		}
	}()
	// abort tells the workers' shims to abort their communicators, so a
	// collective hung on a dead peer returns; best effort, and never allowed
	// to delay the stop (a wedged connection can take seconds to time out).
	abort := func(reason string) {
		bg.Add(1)
		go func() {
			defer bg.Done()
			srv.Abort(reason)
		}()
	}
	mon := health.NewMonitor(a.log)
	bg.Add(1)
	go func() {
		defer bg.Done()
		_ = mon.Run(ctx)
	}()

	a.log.Info("starting job", "run_id", runID, "nproc_per_node", cfg.NProcPerNode, "max_restarts", cfg.MaxRestarts,
		"command", cfg.Command(), "log_dir", logDirAttr(runDir, keep), "control_socket", srv.Path())

	for attempt := 0; ; attempt++ {
		gen := uint64(attempt)
		port, err := a.masterPort()
		if err != nil {
			return err
		}
		worldSize := cfg.NProcPerNode * cfg.NNodesMax
		srv.SetGeneration(gen, worldSize, nil)
		spec := &supervisor.Spec{
			Argv:          cfg.Command(),
			BaseEnv:       a.baseEnv,
			NProc:         cfg.NProcPerNode,
			RankOffset:    cfg.NodeRank * cfg.NProcPerNode,
			WorldSize:     worldSize,
			NodeRank:      cfg.NodeRank,
			NNodes:        cfg.NNodesMax,
			MasterAddr:    a.masterAddr(),
			MasterPort:    port,
			RunID:         runID,
			Role:          cfg.Role,
			RestartCount:  attempt,
			MaxRestarts:   cfg.MaxRestarts,
			Generation:    gen,
			ControlSocket: srv.Path(),
			AttemptDir:    filepath.Join(runDir, "attempt_"+strconv.Itoa(attempt)),
			Streams:       a.streams(keep),
			Stdout:        a.stdout,
			Stderr:        a.stderr,
		}
		started := time.Now()
		g := supervisor.New(spec, a.log)
		a.setGroup(g) // before the first worker runs: it may dial the control socket at once
		if err := g.Start(); err != nil {
			return fmt.Errorf("attempt %d: %w", attempt, err)
		}
		mon.SetWorkers(g.PIDs())
		mon.Sample() // a worker that dies at once still gets a line in the report
		a.log.Info("workers started", "attempt", attempt, "generation", gen, "world_size", worldSize, "master", net.JoinHostPort(spec.MasterAddr, strconv.Itoa(port)), "pids", g.PIDs())

		err = g.Wait(ctx)
		if err == nil {
			events.report(a.log, gen, srv.Conns)
			a.log.Info("all workers succeeded", "attempt", attempt, "elapsed", time.Since(started).Round(time.Millisecond))
			return nil
		}
		var failed *supervisor.WorkerExitError
		if !errors.As(err, &failed) { // ctx done: a signal or the caller
			cause := context.Cause(ctx)
			sig := stopSignal(cause)
			a.log.Info("stopping workers", "reason", cause, "signal", sig, "grace", cfg.StopTimeout)
			abort("agent stopping: " + cause.Error())
			g.Stop(sig, cfg.StopTimeout)
			events.report(a.log, gen, srv.Conns)
			return cause
		}
		mon.Sample() // the failed worker is gone; this captures the survivors' state at failure time
		abort(fmt.Sprintf("worker rank %d failed", failed.Rank))
		g.Stop(syscall.SIGTERM, cfg.StopTimeout)
		events.report(a.log, gen, srv.Conns)
		if err := srv.DropGeneration(srvCtx, gen); err != nil {
			a.log.Warn("drop control store keys", "generation", gen, "err", err)
		}
		a.report(failed, attempt, time.Since(started), g.PIDs(), mon)
		if attempt >= cfg.MaxRestarts {
			return &JobFailedError{Attempts: attempt + 1, Cause: failed}
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		a.log.Warn("restarting worker group", "restart", attempt+1, "max_restarts", cfg.MaxRestarts)
	}
}

func (a *Agent) setGroup(g *supervisor.Group) {
	a.mu.Lock()
	a.group = g
	a.mu.Unlock()
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

// runDir returns the directory for this run's attempts. With --log-dir (or
// --redirects/--tee, which need files, as in torchrun) it is kept;
// otherwise it only holds error files and is removed at exit.
func (a *Agent) runDir(runID string) (dir string, keep bool, err error) {
	cfg := a.cfg
	switch {
	case cfg.LogDir != "":
		if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
			return "", false, fmt.Errorf("create log dir: %w", err)
		}
		// A run id reused across launches gets a fresh directory: nothing is overwritten.
		for i := 0; ; i++ {
			dir = filepath.Join(cfg.LogDir, runID)
			if i > 0 {
				dir += "_" + strconv.Itoa(i)
			}
			err := os.Mkdir(dir, 0o755)
			if err == nil {
				return dir, true, nil
			}
			if !errors.Is(err, os.ErrExist) {
				return "", false, fmt.Errorf("create run log dir: %w", err)
			}
		}
	case cfg.Redirects.Any() || cfg.Tee.Any():
		dir, err = os.MkdirTemp("", "ddp-agent-logs-"+runID+"-")
		if err != nil {
			return "", false, fmt.Errorf("create log dir: %w", err)
		}
		return dir, true, nil
	default:
		dir, err = os.MkdirTemp("", "ddp-agent-run-")
		if err != nil {
			return "", false, fmt.Errorf("create run dir: %w", err)
		}
		return dir, false, nil
	}
}

func logDirAttr(dir string, keep bool) string {
	if keep {
		return dir
	}
	return "(none)"
}

// streams maps --redirects and --tee onto each worker: redirected streams
// go to their file only, teed ones to file and console, and with --log-dir
// every stream is also written to its file.
func (a *Agent) streams(logging bool) func(int) supervisor.Streams {
	cfg := a.cfg
	return func(lr int) supervisor.Streams {
		red, tee := cfg.Redirects.For(lr), cfg.Tee.For(lr)
		all := logging && cfg.LogDir != ""
		return supervisor.Streams{
			ConsoleOut: !red.Has(launch.StdOut),
			ConsoleErr: !red.Has(launch.StdErr),
			FileOut:    logging && (all || red.Has(launch.StdOut) || tee.Has(launch.StdOut)),
			FileErr:    logging && (all || red.Has(launch.StdErr) || tee.Has(launch.StdErr)),
		}
	}
}

func (a *Agent) masterAddr() string {
	if a.cfg.MasterAddr != "" {
		return a.cfg.MasterAddr
	}
	return "127.0.0.1"
}

// masterPort returns --master-port, or a port free right now: a fresh one
// for every attempt, so a restart never trips over the last attempt's
// store socket lingering in TIME_WAIT.
func (a *Agent) masterPort() (int, error) {
	if a.cfg.MasterPort != 0 {
		return a.cfg.MasterPort, nil
	}
	l, err := net.Listen("tcp", net.JoinHostPort(a.masterAddr(), "0"))
	if err != nil {
		return 0, fmt.Errorf("pick a free master port on %s: %w", a.masterAddr(), err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func newRunID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
