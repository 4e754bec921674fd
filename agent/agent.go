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
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/control"
	"github.com/ddp-agent/ddp-agent/agent/hostmon"
	"github.com/ddp-agent/ddp-agent/agent/launch"
	"github.com/ddp-agent/ddp-agent/agent/rdzv"
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
	cfg     *launch.Config
	log     *slog.Logger
	stdout  *supervisor.Console
	stderr  *supervisor.Console
	baseEnv []string

	gpus *GPUs

	mu         sync.Mutex
	group      *supervisor.Group // the current attempt, for the control socket's admission check
	rankOffset int               // its global rank of local rank 0, for the GPU health watcher
}

// New returns an agent for cfg. Worker output and failure reports go to
// stdout and stderr; workers inherit baseEnv (usually os.Environ()).
func New(cfg *launch.Config, log *slog.Logger, stdout, stderr *supervisor.Console, baseEnv []string) *Agent {
	return &Agent{cfg: cfg, log: log, stdout: stdout, stderr: stderr, baseEnv: baseEnv}
}

// errRoundEnded is the cause of a round's context when the job moved to
// another generation because of something outside this node.
type errRoundEnded struct{ reason string }

func (e *errRoundEnded) Error() string { return "generation ended: " + e.reason }

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

	j, err := a.openRendezvous(ctx, runID)
	if err != nil {
		return err
	}
	defer j.close()
	left := false
	leave := func(reason string) {
		if !left {
			left = true
			j.rz.Leave(reason)
		}
	}
	defer func() {
		reason := "agent exiting"
		var gf *GPUFaultError
		if errors.As(context.Cause(ctx), &gf) {
			reason = "drained: " + gf.Error()
		}
		leave(reason)
	}()

	events := newEventTally()
	stalls := newStallWatch(a.log, cfg.HangTimeout)
	stalls.rankOf = a.authorize
	stalls.hangAuto = cfg.HangAuto
	if a.gpus != nil {
		stalls.readGPU = a.gpus.State
	}
	relays := &leaderRelay{}
	defer relays.close()
	exp, closeExp, err := a.openExporter(ctx, runID, runDir, keep, stalls.worker)
	if err != nil {
		return err
	}
	defer closeExp()
	stalls.exp = exp
	if pub, ok := j.rz.(stallPublisher); ok {
		bg.Add(1)
		go func() {
			defer bg.Done()
			stalls.publish(ctx, pub)
		}()
	}
	bg.Add(1)
	go func() {
		defer bg.Done()
		stalls.run(ctx)
	}()
	onEvents := func(rank int, ev control.Events) {
		events.add(rank, ev)
		stalls.add(rank, ev)
	}
	srv, err := control.Listen(control.Config{JobID: runID, Authorize: a.authorize, OnEvents: onEvents, Logger: a.log, KV: j.kv})
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
	mon := hostmon.NewMonitor(a.log)
	bg.Add(1)
	go func() {
		defer bg.Done()
		_ = mon.Run(ctx)
	}()

	// A GPU fault that calls for a restart waits here for the round
	// watcher; one that drains the node cancels ctx.
	gpuRestarts := make(chan *GPUFaultError, 1)
	bg.Add(1)
	go func() {
		defer bg.Done()
		a.watchGPUs(ctx, cancel, gpuRestarts)
	}()

	bootstrap := ""
	if j.nodeLocalKV {
		bootstrap = "external"
	}
	a.log.Info("starting job", "run_id", runID, "nproc_per_node", cfg.NProcPerNode, "gpus", a.gpus.summary(), "nnodes", nnodesAttr(cfg), "max_restarts", cfg.MaxRestarts,
		"command", cfg.Command(), "log_dir", logDirAttr(runDir, keep), "control_socket", srv.Path())

	for attempt := 0; ; attempt++ {
		waitStart := time.Now()
		r, err := j.rz.Next(ctx)
		if err != nil {
			var failed *rdzv.JobFailedError
			switch {
			case ctx.Err() != nil:
				return context.Cause(ctx)
			case errors.Is(err, rdzv.ErrJobSucceeded):
				a.log.Info("the job finished without this node")
				return nil
			case errors.As(err, &failed):
				return &JobFailedError{Attempts: attempt, Reason: failed.Reason}
			}
			leave("gave up: " + err.Error())
			return err
		}
		gen := r.Generation
		srv.SetGeneration(gen, r.WorldSize, nil)
		attemptDir := filepath.Join(runDir, "attempt_"+strconv.Itoa(attempt))
		stackDir := filepath.Join(attemptDir, "stacks")
		spec := &supervisor.Spec{
			Argv:          cfg.Command(),
			BaseEnv:       append(slices.Clip(a.baseEnv), "DDP_AGENT_STACK_DIR="+stackDir),
			NProc:         cfg.NProcPerNode,
			RankOffset:    r.RankOffset,
			WorldSize:     r.WorldSize,
			NodeRank:      r.GroupRank,
			NNodes:        r.NNodes,
			MasterAddr:    r.MasterAddr,
			MasterPort:    r.MasterPort,
			RunID:         runID,
			Role:          cfg.Role,
			RestartCount:  r.Restarts,
			MaxRestarts:   cfg.MaxRestarts,
			Generation:    gen,
			ControlSocket: srv.Path(),
			Bootstrap:     bootstrap,
			AttemptDir:    attemptDir,
			Place:         a.place(),
			Streams:       a.streams(keep),
			Stdout:        a.stdout,
			Stderr:        a.stderr,
		}
		a.setGroup(nil, 0) // the last attempt's workers are gone: no ranks on the GPUs until the next start
		started := time.Now()
		g := supervisor.New(spec, a.log)
		a.setGroup(g, r.RankOffset) // before the first worker runs: it may dial the control socket at once
		if err := g.Start(); err != nil {
			r.Stop()
			return fmt.Errorf("attempt %d: %w", attempt, err)
		}
		plan := a.planAnalysis(ctx, j, r, g, runID, stalls, relays)
		stalls.start(gen, plan.base, plan.size, a.workers(g, r.RankOffset), r.RankOffset, stackDir, plan.fwd, plan.asker)
		mon.SetWorkers(g.PIDs())
		mon.Sample() // a worker that dies at once still gets a line in the report
		a.log.Info("workers started", "attempt", attempt, "generation", gen, "group_rank", r.GroupRank, "nnodes", r.NNodes,
			"world_size", r.WorldSize, "master", net.JoinHostPort(spec.MasterAddr, strconv.Itoa(spec.MasterPort)),
			"rendezvous", started.Sub(waitStart).Round(time.Millisecond), "pids", g.PIDs())

		rctx, endRound := context.WithCancelCause(ctx)
		go func() {
			for {
				select {
				case <-r.Done():
					endRound(&errRoundEnded{reason: r.Reason()})
				case f := <-gpuRestarts:
					if f.before(started) {
						// Stopping workers can itself raise XIDs (43 for a
						// process killed in a kernel): the last attempt's.
						a.log.Warn("GPU fault from before these workers started: ignored", "fault", f.Error())
						continue
					}
					endRound(f)
				case h := <-stalls.hangs:
					if h.Hang.Gen != gen {
						continue // the last attempt's
					}
					endRound(h)
				case <-rctx.Done():
				}
				return
			}
		}()
		err = g.Wait(rctx)
		endRound(nil)
		stalls.stop()
		plan.done()
		if err == nil {
			r.Stop()
			events.report(a.log, gen, srv.Conns)
			a.log.Info("all workers succeeded", "attempt", attempt, "generation", gen, "elapsed", time.Since(started).Round(time.Millisecond))
			if err := j.rz.Succeed(ctx, r); err != nil {
				a.log.Warn("tell the rendezvous this node finished", "err", err)
			}
			left = true // succeeded nodes leave quietly: their lease ends with the agent
			return nil
		}
		var failed *supervisor.WorkerExitError
		var ended *errRoundEnded
		var gpuFault *GPUFaultError
		var hang *HangError
		switch {
		case errors.As(err, &failed):
			mon.Sample() // the failed worker is gone; this captures the survivors' state at failure time
			exp.Restart(gen, failed.Error())
			noneLeft, err := a.failAttempt(ctx, j.rz, r, g, failed.Error(), func() {
				a.dropGeneration(srv, srvCtx, events, gen)
				a.report(failed, r.Restarts, time.Since(started), g.PIDs(), mon)
			}, abort)
			if noneLeft {
				return drainOr(ctx, &JobFailedError{Attempts: attempt + 1, Cause: failed})
			}
			if err != nil {
				return err
			}
		case errors.As(context.Cause(rctx), &gpuFault) && ctx.Err() == nil:
			f := gpuFault.Findings[0]
			a.log.Error("GPU fault: restarting the job's workers", "gpu", f.GPU, "uuid", f.UUID, "ranks", f.Ranks,
				"kind", string(f.Kind), "xid", f.XID, "finding", f.Message, "count", f.Count)
			exp.Restart(gen, gpuFault.finding())
			noneLeft, err := a.failAttempt(ctx, j.rz, r, g, gpuFault.finding(), func() {
				a.dropGeneration(srv, srvCtx, events, gen)
			}, abort)
			if noneLeft {
				return drainOr(ctx, &JobFailedError{Attempts: attempt + 1, Reason: gpuFault.finding()})
			}
			if err != nil {
				return err
			}
		case errors.As(context.Cause(rctx), &hang) && ctx.Err() == nil:
			exp.Restart(gen, hang.Error())
			noneLeft, err := a.failAttempt(ctx, j.rz, r, g, hang.Error(), func() {
				a.dropGeneration(srv, srvCtx, events, gen)
			}, abort)
			if noneLeft {
				return drainOr(ctx, &JobFailedError{Attempts: attempt + 1, Reason: hang.Error()})
			}
			if err != nil {
				return err
			}
		case errors.As(context.Cause(rctx), &ended) && ctx.Err() == nil:
			a.log.Warn("stopping workers: the job is moving to a new generation", "generation", gen, "reason", ended.reason)
			abort("job moving to a new generation: " + ended.reason)
			g.Stop(syscall.SIGTERM, cfg.StopTimeout)
			a.dropGeneration(srv, srvCtx, events, gen)
		default: // ctx done: a signal or the caller
			r.Stop()
			cause := context.Cause(ctx)
			sig := stopSignal(cause)
			a.log.Info("stopping workers", "reason", cause, "signal", sig, "grace", cfg.StopTimeout)
			abort("agent stopping: " + cause.Error())
			leave("agent stopping: " + cause.Error())
			g.Stop(sig, cfg.StopTimeout)
			events.report(a.log, gen, srv.Conns)
			return cause
		}
	}
}

// drainOr returns the GPU fault that is draining this node, if one is,
// rather than err: a GPU that fell off the bus also kills its worker, and
// the node must exit as drained (code 3) even when the worker's failure
// also used up the job's restarts.
func drainOr(ctx context.Context, err error) error {
	var gf *GPUFaultError
	if errors.As(context.Cause(ctx), &gf) {
		return gf
	}
	return err
}

// failAttempt handles a fault of this node's attempt: it aborts the
// workers' communicators, tells the rendezvous first (the other nodes'
// workers are stuck on this node's until their agents restart them), stops
// the workers and runs after. noneLeft: the job has no restarts left; err:
// ctx ended meanwhile.
func (a *Agent) failAttempt(ctx context.Context, rz rendezvous, r *rdzv.Round, g *supervisor.Group, reason string, after func(), abort func(string)) (noneLeft bool, err error) {
	abort(reason)
	ferr := rz.Fail(ctx, r, reason)
	r.Stop()
	g.Stop(syscall.SIGTERM, a.cfg.StopTimeout)
	after()
	var jf *rdzv.JobFailedError
	if errors.As(ferr, &jf) {
		return true, nil
	}
	if ferr != nil {
		a.log.Error("tell the rendezvous about the failure", "err", ferr)
	}
	if ctx.Err() != nil {
		return false, context.Cause(ctx)
	}
	a.log.Warn("restarting worker group", "restarts", r.Restarts+1, "max_restarts", a.cfg.MaxRestarts)
	return false, nil
}

// dropGeneration logs the generation's collective events and deletes its
// bootstrap keys, once its workers are gone.
func (a *Agent) dropGeneration(srv *control.Server, ctx context.Context, events *eventTally, gen uint64) {
	events.report(a.log, gen, srv.Conns)
	// bounded: the store may be what just failed
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := srv.DropGeneration(ctx, gen); err != nil {
		a.log.Warn("drop control store keys", "generation", gen, "err", err)
	}
}

func nnodesAttr(cfg *launch.Config) string {
	if cfg.NNodesMin == cfg.NNodesMax {
		return strconv.Itoa(cfg.NNodesMax)
	}
	return fmt.Sprintf("%d:%d", cfg.NNodesMin, cfg.NNodesMax)
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

func newRunID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
