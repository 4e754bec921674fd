package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/hostmon"
	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/rootcause"
	"github.com/ddp-agent/ddp-agent/agent/straggler"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/watch"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

// attempt is one run of this node's worker group, in one generation.
type attempt struct {
	n       int // 0 for the first
	gen     uint64
	r       *rdzv.Round
	g       *supervisor.Group
	started time.Time
}

// loop runs attempts until the job succeeds, fails, or ctx ends.
func (a *Agent) loop(ctx context.Context, s *session) error {
	defer s.health.set(phaseStopped)
	var ended []attemptEnd // how the attempts so far ended, for the restart backoff
	for n := 0; ; n++ {
		if err := a.waitBackoff(ctx, ended); err != nil {
			return err
		}
		s.health.set(phaseRendezvous)
		waitStart := time.Now()
		r, err := s.j.rz.Next(ctx)
		if err != nil {
			return a.noRound(ctx, s, n, err)
		}
		at, err := a.start(ctx, s, n, r, waitStart)
		switch {
		case err != nil && at != nil: // a signal while the workers were spawned
			return a.stop(ctx, s, at)
		case err != nil:
			return err
		}
		s.health.set(phaseRunning)
		f, err := a.wait(ctx, s, at)
		ran := time.Since(at.started)
		s.stragglers.End()
		s.watch.End()
		switch {
		case err != nil && ctx.Err() != nil: // a signal or the caller
			return a.stop(ctx, s, at)
		case err != nil: // the supervisor failed: not the workers' fault
			at.r.Stop()
			at.g.Stop(syscall.SIGTERM, a.cfg.StopTimeout)
			return err
		case f == nil:
			return a.succeed(ctx, s, at)
		}
		s.health.set(phaseRestarting)
		if done, err := a.recover(ctx, s, at, f); done {
			return err
		}
		ended = recentAttempts(append(ended, attemptEnd{Ran: ran, Fault: f.restartsJob()}), a.backoff())
	}
}

// noRound is the end of the job when this node gets no next round.
func (a *Agent) noRound(ctx context.Context, s *session, n int, err error) error {
	var failed *rdzv.JobFailedError
	switch {
	case ctx.Err() != nil:
		return context.Cause(ctx)
	case errors.Is(err, rdzv.ErrJobSucceeded):
		a.log.Info("the job finished without this node")
		return nil
	case errors.As(err, &failed):
		return &JobFailedError{Attempts: n, Reason: failed.Reason}
	}
	s.leave("gave up: " + err.Error())
	return err
}

// start starts attempt n's workers in round r and begins watching them.
// When ctx ends while the workers are spawned, it returns the attempt with
// the workers started so far, and ctx's cause, for the caller to stop.
func (a *Agent) start(ctx context.Context, s *session, n int, r *rdzv.Round, waitStart time.Time) (*attempt, error) {
	at := &attempt{n: n, gen: r.Generation, r: r}
	s.srv.SetGeneration(at.gen, r.WorldSize, nil)
	attemptDir := filepath.Join(s.runDir, "attempt_"+strconv.Itoa(n))
	stackDir := filepath.Join(attemptDir, "stacks")
	spec := a.spec(s, r, attemptDir, stackDir)
	a.setGroup(nil, 0) // the last attempt's workers are gone: no ranks on the GPUs until the next start
	s.faults.clear()   // what is queued belongs to the last attempt
	at.started = time.Now()
	at.g = supervisor.New(spec, a.log)
	a.setGroup(at.g, r.RankOffset) // before the first worker runs: it may dial the control socket at once
	if err := at.g.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return at, context.Cause(ctx)
		}
		r.Stop()
		return nil, fmt.Errorf("attempt %d: %w", n, err)
	}
	workers := a.workers(at.g, r.RankOffset)
	s.stragglers.Begin(straggler.Attempt{Gen: at.gen, Nodes: r.NNodes, RankOffset: r.RankOffset,
		NProc: a.cfg.NProcPerNode, Restarts: r.Restarts, Follower: r.NNodes > 1 && r.GroupRank != 0})
	s.watch.Begin(ctx, watch.Attempt{Gen: at.gen, GroupRank: r.GroupRank, NNodes: r.NNodes, WorldSize: r.WorldSize,
		RankOffset: r.RankOffset, MasterAddr: r.MasterAddr, Done: r.Done(), Workers: workers, StackDir: stackDir,
		KV: s.j.kv, JobID: s.runID, Token: a.cfg.Rendezvous.Token})
	s.mon.SetWorkers(at.g.PIDs())
	s.mon.Sample() // a worker that dies at once still gets a line in the report
	a.log.Info("workers started", "attempt", n, "generation", at.gen, "group_rank", r.GroupRank, "nnodes", r.NNodes,
		"world_size", r.WorldSize, "master", net.JoinHostPort(spec.MasterAddr, strconv.Itoa(spec.MasterPort)),
		"rendezvous", at.started.Sub(waitStart).Round(time.Millisecond), "pids", at.g.PIDs())
	return at, nil
}

// spec is the worker group of round r.
func (a *Agent) spec(s *session, r *rdzv.Round, attemptDir, stackDir string) *supervisor.Spec {
	bootstrap := ""
	if s.j.nodeLocalKV {
		bootstrap = "external"
	}
	return &supervisor.Spec{
		Argv:          a.cfg.Command,
		BaseEnv:       append(slices.Clip(a.baseEnv), "DDP_AGENT_STACK_DIR="+stackDir),
		NProc:         a.cfg.NProcPerNode,
		RankOffset:    r.RankOffset,
		WorldSize:     r.WorldSize,
		NodeRank:      r.GroupRank,
		NNodes:        r.NNodes,
		MasterAddr:    r.MasterAddr,
		MasterPort:    r.MasterPort,
		RunID:         s.runID,
		Role:          a.cfg.Role,
		RestartCount:  r.Restarts,
		MaxRestarts:   a.cfg.MaxRestarts,
		Generation:    r.Generation,
		ControlSocket: s.srv.Path(),
		Bootstrap:     bootstrap,
		TorchVersion:  a.cfg.TorchVersion,
		AttemptDir:    attemptDir,
		Place:         a.place(),
		Streams:       a.streams(),
		Stdout:        a.stdout,
		Stderr:        a.stderr,
		OnLogLoss:     a.losses.add,
	}
}

// wait blocks until the attempt's workers have all succeeded (nil, nil),
// a fault ended it, or ctx is done (ctx's cause). The end of the round is
// reported to the fault queue like every other source.
func (a *Agent) wait(ctx context.Context, s *session, at *attempt) (*Fault, error) {
	rctx, end := context.WithCancel(ctx)
	watched := make(chan struct{})
	defer func() {
		end()
		<-watched // no round fault of this attempt is reported after it
	}()
	exited := make(chan error, 1)
	go func() { exited <- at.g.Wait(rctx) }()
	tick := time.NewTicker(healthTick) // the liveness probe's sign that this loop still turns
	defer tick.Stop()
	go func() {
		defer close(watched)
		select {
		case <-at.r.Done():
			s.faults.report(roundFault(at.gen, at.r.Reason()))
		case <-rctx.Done():
		}
	}()
	var f *Fault
	for f == nil {
		select {
		case err := <-exited:
			return a.exitFault(ctx, at, err)
		case <-s.faults.ready:
			f = s.faults.take(at.gen, at.started, a.dropStale)
		case <-tick.C:
			s.health.ticked()
		}
	}
	end()
	switch err := <-exited; {
	case err == nil: // they all succeeded meanwhile
		return nil, nil
	case ctx.Err() == nil:
		// A worker that failed before the fault was handled is the
		// fault: it names a rank and has the report.
		if wf, _ := a.exitFault(ctx, at, err); wf != nil {
			return wf, nil
		}
		return f, nil
	default:
		return a.exitFault(ctx, at, err)
	}
}

// exitFault turns the worker group's Wait result into the attempt's
// outcome.
func (a *Agent) exitFault(ctx context.Context, at *attempt, err error) (*Fault, error) {
	var failed *supervisor.WorkerExitError
	switch {
	case err == nil:
		return nil, nil
	case errors.As(err, &failed):
		return workerFault(at.gen, a.workerFailure(ctx, at)), nil
	case ctx.Err() != nil:
		return nil, context.Cause(ctx)
	}
	return nil, fmt.Errorf("attempt %d: wait for the workers: %w", at.n, err)
}

// rootSettle bounds how long a failed attempt waits for its root cause to
// show itself (at most the stop timeout): a worker of this node that a
// victim named and that has not exited yet (it closed its communicator at
// interpreter exit and is still tearing down), or another node's agent
// telling the rendezvous about its own worker, with its report.
const rootSettle = 5 * time.Second

// workerFailure works out the root cause of the attempt, whose first
// failed worker has just been reaped: it may be another worker, which the
// first one's shim named.
func (a *Agent) workerFailure(ctx context.Context, at *attempt) *WorkerFailedError {
	deadline := time.Now().Add(min(rootSettle, a.cfg.StopTimeout))
	for {
		now := time.Now()
		b := rootcause.Decide(at.g.Outcomes(), now)
		if !b.Local {
			b.Elsewhere = at.r.Reason() // "" until another node's agent has told the rendezvous
		}
		left := time.Until(deadline)
		switch {
		case b.Root < 0 || b.Exit != nil || b.Elsewhere != "" || left <= 0 || ctx.Err() != nil:
		case b.Local:
			a.log.Info("a worker failed only because another failed first: waiting for that one to exit",
				"rank", b.Root, "victims", b.VictimRanks(), "wait", left.Round(time.Millisecond))
			if !at.g.WaitExited(ctx, b.Root, left) { // else its exit, error file and stderr go into the report
				deadline = time.Now() // once more with what the workers noted meanwhile, then decide
			}
			continue
		default: // another node's worker: give its agent the chance to say so first
			a.log.Info("a worker failed only because a rank of another node failed first: waiting for its node to report it",
				"rank", b.Root, "victims", b.VictimRanks(), "wait", left.Round(time.Millisecond))
			t := time.NewTimer(left)
			select {
			case <-at.r.Done():
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			deadline = time.Now() // once more with what the workers noted meanwhile, then decide
			continue
		}
		return &WorkerFailedError{Blame: b, Decided: now}
	}
}

// dropStale logs a fault from an earlier attempt that is ignored.
func (a *Agent) dropStale(f *Fault) {
	if f.Source == FromGPU {
		// Stopping workers can itself raise XIDs (43 for a process
		// killed in a kernel): the last attempt's.
		a.log.Warn("GPU fault from before these workers started: ignored", "fault", f.Err.Error())
	}
}

// recover handles a fault of the attempt: the one place where faults
// become a restart of the job, a move to the next generation, or the end
// of the job. done: Run returns err.
func (a *Agent) recover(ctx context.Context, s *session, at *attempt, f *Fault) (done bool, err error) {
	if !f.restartsJob() {
		a.log.Warn("stopping workers: the job is moving to a new generation", "generation", at.gen, "reason", f.Reason)
		s.notify(roundEventKind(at.r.End()), at, -1, f.Reason, nil)
		s.abort("job moving to a new generation: " + f.Reason)
		at.g.Stop(syscall.SIGTERM, a.cfg.StopTimeout)
		a.dropGeneration(s, at.gen)
		return false, nil
	}
	switch f.Source {
	case FromWorker:
		s.mon.Sample() // the failed worker is gone; this captures the survivors' state at failure time
	case FromGPU:
		gf, _ := errorsAs[*GPUFaultError](f)
		fd := gf.Findings[0]
		a.log.Error("GPU fault: restarting the job's workers", "gpu", fd.GPU, "uuid", fd.UUID, "ranks", fd.Ranks,
			"kind", string(fd.Kind), "xid", fd.XID, "finding", fd.Message, "count", fd.Count)
	case FromPlugin:
		pf, _ := errorsAs[*PluginFaultError](f)
		a.log.Error("health check: restarting the job's workers", "plugin", pf.Finding.Plugin, "subject", pf.Finding.Subject,
			"finding", pf.Finding.Message)
	}
	s.exp.Restart(at.gen, f.Reason)
	noneLeft, err := a.failAttempt(ctx, s, at, f)
	if noneLeft {
		jf := &JobFailedError{Attempts: at.n + 1, Reason: f.Reason}
		if wf, ok := errorsAs[*supervisor.WorkerExitError](f); ok {
			jf = &JobFailedError{Attempts: at.n + 1, Cause: wf}
		}
		return true, drainOr(ctx, jf)
	}
	return err != nil, err
}

// failAttempt handles a fault of this node's attempt: it aborts the
// workers' communicators, tells the rendezvous first (the other nodes'
// workers are stuck on this node's until their agents restart them),
// stops the workers, and reports. noneLeft: the job has no restarts left;
// err: ctx ended meanwhile.
func (a *Agent) failAttempt(ctx context.Context, s *session, at *attempt, f *Fault) (noneLeft bool, err error) {
	s.abort(f.Reason)
	ferr := s.j.rz.Fail(ctx, at.r, f.Reason)
	at.r.Stop()
	at.g.Stop(syscall.SIGTERM, a.cfg.StopTimeout)
	a.dropGeneration(s, at.gen)
	if wf, ok := errorsAs[*WorkerFailedError](f); ok {
		b, text := a.report(wf, at, s.mon)
		s.notify(notifier.WorkerFailed, at, b.Root, wf.Error(), map[string]string{"report": text, "victims": joinInts(b.VictimRanks())})
	} else {
		s.notifyFault(at, f)
	}
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
	a.log.Warn("restarting worker group", "restarts", at.r.Restarts+1, "max_restarts", a.cfg.MaxRestarts)
	s.notify(notifier.Restarted, at, -1, "restarting the job's workers: "+f.Reason,
		map[string]string{"restarts": strconv.Itoa(at.r.Restarts + 1), "max_restarts": strconv.Itoa(a.cfg.MaxRestarts)})
	return false, nil
}

// report writes the root cause of a failed attempt, whose workers have
// stopped, to the agent's stderr (rootcause.Format) and logs it.
func (a *Agent) report(wf *WorkerFailedError, at *attempt, mon *hostmon.Monitor) (rootcause.Blame, string) {
	b := rootcause.Reclassify(at.g.Outcomes(), wf.Decided, wf.Blame) // the exits and notes of them all, now
	a.log.Error("worker failed", b.LogAttrs(at.r.Restarts, at.started)...)
	text := rootcause.Format(b, at.r.Restarts, a.cfg.MaxRestarts, at.started, at.g.PIDs(), mon)
	a.stderr.Write([]byte(text))
	return b, text
}

// succeed ends the job for this node: every worker exited 0.
func (a *Agent) succeed(ctx context.Context, s *session, at *attempt) error {
	at.r.Stop()
	s.events.report(a.log, at.gen, s.srv.Conns)
	a.log.Info("all workers succeeded", "attempt", at.n, "generation", at.gen, "elapsed", time.Since(at.started).Round(time.Millisecond))
	if err := s.j.rz.Succeed(ctx, at.r); err != nil {
		a.log.Warn("tell the rendezvous this node finished", "err", err)
	}
	s.left = true // succeeded nodes leave quietly: their lease ends with the agent
	return nil
}

// stop stops the workers when ctx is done (a signal, or the caller) and
// returns its cause.
func (a *Agent) stop(ctx context.Context, s *session, at *attempt) error {
	at.r.Stop()
	cause := context.Cause(ctx)
	sig := stopSignal(cause)
	a.log.Info("stopping workers", "reason", cause, "signal", sig, "grace", a.cfg.StopTimeout)
	why := "agent stopping: "
	if drainCause(ctx) != nil { // the other nodes and `ddp-agent status` see why this one left
		why = "drained: "
	}
	s.abort(why + cause.Error())
	s.leave(why + cause.Error())
	at.g.Stop(sig, a.cfg.StopTimeout)
	s.events.report(a.log, at.gen, s.srv.Conns)
	return cause
}

// dropGeneration logs the generation's collective events and deletes its
// bootstrap keys, once its workers are gone.
func (a *Agent) dropGeneration(s *session, gen uint64) {
	s.events.report(a.log, gen, s.srv.Conns)
	// bounded: the store may be what just failed
	ctx, cancel := context.WithTimeout(s.srvCtx, 5*time.Second)
	defer cancel()
	if err := s.srv.DropGeneration(ctx, gen); err != nil {
		a.log.Warn("drop control store keys", "generation", gen, "err", err)
	}
}
