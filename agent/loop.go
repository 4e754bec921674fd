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
)

// attempt is one run of this node's worker group, in one generation.
type attempt struct {
	n       int // 0 for the first
	gen     uint64
	r       *rdzv.Round
	g       *supervisor.Group
	started time.Time
}

// loop runs attempts until the job succeeds, fails, this node drains, or
// ctx ends (a signal).
func (a *Agent) loop(ctx context.Context, s *session) error {
	defer s.health.set(phaseStopped)
	var ended []attemptEnd // how the attempts so far ended, for the restart backoff
	for n := 0; ; n++ {
		if err := a.waitBackoff(ctx, s.faults.urgent, ended); err != nil {
			return err
		}
		if s.faults.drain() != nil { // found during the backoff
			return a.drainOr(ctx, s, nil)
		}
		s.health.set(phaseRendezvous)
		waitStart := time.Now()
		nctx, stop := s.faults.bound(ctx)
		r, err := s.j.rz.Next(nctx)
		stop()
		if err != nil {
			return a.noRound(ctx, s, n, err)
		}
		at, err := a.start(ctx, s, n, r, waitStart)
		switch {
		case err != nil && at != nil: // a signal or a drain while the workers were spawned
			return a.interrupted(ctx, s, at)
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

// interrupted ends the run when a signal, or a drain, came while the
// workers were spawned.
func (a *Agent) interrupted(ctx context.Context, s *session, at *attempt) error {
	if f := s.faults.drain(); f != nil && ctx.Err() == nil {
		_, err := a.recover(ctx, s, at, f)
		return err
	}
	return a.stop(ctx, s, at)
}

// noRound is the end of the job when this node gets no next round.
func (a *Agent) noRound(ctx context.Context, s *session, n int, err error) error {
	var failed *rdzv.JobFailedError
	switch {
	case ctx.Err() != nil:
		return context.Cause(ctx)
	case s.faults.drain() != nil: // a drain found while the rendezvous waited for its nodes
		return a.drainOr(ctx, s, err)
	case errors.Is(err, rdzv.ErrJobSucceeded):
		a.log.Info("the job finished without this node")
		return nil
	case errors.As(err, &failed):
		return &FaultError{Severity: Fail, Err: &JobFailedError{Attempts: n, Reason: failed.Reason}}
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
	sctx, stop := s.faults.bound(ctx)
	defer stop()
	if err := at.g.Start(sctx); err != nil {
		if sctx.Err() != nil {
			return at, context.Cause(sctx)
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
// a fault ended it, or ctx is done (ctx's cause). A worker's failure, the
// end of the round and every other source reach it through the fault
// queue.
func (a *Agent) wait(ctx context.Context, s *session, at *attempt) (*Fault, error) {
	rctx, end := context.WithCancel(ctx)
	watched := make(chan struct{})
	defer func() {
		end()
		<-watched // no round fault of this attempt is reported after it
	}()
	// The group's end: nil when every worker succeeded, ctx's error, or
	// the supervisor's own; a worker's failure is reported as a fault
	// instead (failed), once its root cause is worked out.
	var (
		waited = make(chan struct{})
		ended  error
		failed bool
	)
	go func() {
		defer close(waited)
		err := at.g.Wait(rctx)
		var we *supervisor.WorkerExitError
		if failed = errors.As(err, &we); failed {
			s.faults.report(workerFault(at.gen, a.workerFailure(ctx, at)))
			return
		}
		ended = err
	}()
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
		case <-waited:
			if !failed {
				return a.groupEnded(ctx, at, ended)
			}
			waited = nil // its fault is queued
		case <-s.faults.ready:
			f = s.faults.take(at.gen, at.started, a.dropStale)
		case <-tick.C:
			s.health.ticked()
		}
	}
	end()
	if waited != nil {
		<-waited
	}
	switch {
	case f.Source == FromWorker:
		return f, nil
	case failed:
		// A worker that failed before the fault was handled is the
		// fault: it names a rank and has the report.
		if wf := s.faults.takeWorker(at.gen); wf != nil {
			return wf, nil
		}
		return f, nil
	case ended == nil: // they all succeeded meanwhile
		return nil, nil
	case ctx.Err() == nil:
		return f, nil
	}
	return a.groupEnded(ctx, at, ended)
}

// groupEnded is the attempt's outcome when the worker group's Wait ended
// without a worker's failure.
func (a *Agent) groupEnded(ctx context.Context, at *attempt, err error) (*Fault, error) {
	switch {
	case err == nil:
		return nil, nil
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

// action is what recover does about a fault.
type action int

const (
	actNewGeneration action = iota // stop the workers; the next round begins, not charged
	actRestart                     // restart the job's workers, charged to --max-restarts
	actDrain                       // stop the workers; this node leaves the job (exit 3)
	actFail                        // the job failed
)

func (a action) String() string {
	return [...]string{"new-generation", "restart", "drain", "fail"}[a]
}

// decide is recover's decision, pure: what a fault of severity sev calls
// for, where restartsLeft says the rendezvous, told of this node's fault,
// did not answer that the job failed, and drainPending that a drain of
// this node is queued behind the fault. A drain wins over everything: a
// GPU that fell off the bus also kills its worker, and the node must exit
// as drained even when that worker's failure used up the restarts.
func decide(sev Severity, restartsLeft, drainPending bool) action {
	switch {
	case sev == Drain || drainPending:
		return actDrain
	case sev >= Fail:
		return actFail
	case sev == NewGeneration:
		return actNewGeneration
	case !restartsLeft:
		return actFail
	}
	return actRestart
}

// recover handles a fault: the one place where faults become a restart of
// the job, a move to the next generation, a drain of this node, or the end
// of the job. at is nil for a drain found outside an attempt. done: Run
// returns err.
func (a *Agent) recover(ctx context.Context, s *session, at *attempt, f *Fault) (done bool, err error) {
	restartsLeft, stopped := true, false
	if f.Severity == Restart {
		a.logRestart(f)
		s.exp.Restart(at.gen, f.Reason)
		restartsLeft = a.failAttempt(ctx, s, at, f)
		stopped = true
	}
	switch act := decide(f.Severity, restartsLeft, s.faults.drain() != nil); act {
	case actNewGeneration:
		a.log.Warn("stopping workers: the job is moving to a new generation", "generation", at.gen, "reason", f.Reason)
		s.tell(event{kind: evFault, at: at, fault: f})
		s.abort("job moving to a new generation: " + f.Reason)
		at.g.Stop(syscall.SIGTERM, a.cfg.StopTimeout)
		a.dropGeneration(s, at.gen)
		return false, nil
	case actDrain:
		return true, a.drain(s, at, s.faults.drain(), stopped)
	case actFail:
		jf := &JobFailedError{Attempts: at.n + 1, Reason: f.Reason}
		if wf, ok := errorsAs[*supervisor.WorkerExitError](f); ok {
			jf = &JobFailedError{Attempts: at.n + 1, Cause: wf}
		}
		return true, &FaultError{Severity: Fail, Err: jf}
	}
	if ctx.Err() != nil {
		return true, context.Cause(ctx)
	}
	a.log.Warn("restarting worker group", "restarts", at.r.Restarts+1, "max_restarts", a.cfg.MaxRestarts)
	s.tell(event{kind: evRestarting, at: at, fault: f, restarts: at.r.Restarts + 1, maxRestarts: a.cfg.MaxRestarts})
	return false, nil
}

// logRestart logs a finding that restarts the job's workers; a worker's
// failure and a hang have their own report.
func (a *Agent) logRestart(f *Fault) {
	switch f.Source {
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
}

// failAttempt handles a fault of this node's attempt: it aborts the
// workers' communicators, tells the rendezvous first (the other nodes'
// workers are stuck on this node's until their agents restart them),
// stops the workers, and reports. It reports whether the job has
// restarts left.
func (a *Agent) failAttempt(ctx context.Context, s *session, at *attempt, f *Fault) (restartsLeft bool) {
	if f.Source == FromWorker {
		s.mon.Sample() // the failed worker is gone; this captures the survivors' state at failure time
	}
	s.abort(f.Reason)
	ferr := s.j.rz.Fail(ctx, at.r, f.Reason)
	at.r.Stop()
	at.g.Stop(syscall.SIGTERM, a.cfg.StopTimeout)
	a.dropGeneration(s, at.gen)
	ev := event{kind: evFault, at: at, fault: f}
	if wf, ok := errorsAs[*WorkerFailedError](f); ok {
		b, text := a.report(wf, at, s.mon)
		ev.blame, ev.report = &b, text
	}
	s.tell(ev)
	var jf *rdzv.JobFailedError
	if errors.As(ferr, &jf) {
		return false
	}
	if ferr != nil {
		a.log.Error("tell the rendezvous about the failure", "err", ferr)
	}
	return true
}

// drain takes this node out of the job for the drain fault f: the
// workers stopped (unless stopped already) and their communicators
// aborted, the rendezvous left with the reason, which the other nodes and
// `ddp-agent status` see. at is nil outside an attempt.
func (a *Agent) drain(s *session, at *attempt, f *Fault, stopped bool) error {
	why := "drained: " + f.Reason
	if f.Source == FromGPU { // a detector's verdict went to the notifiers when it came
		s.tell(event{kind: evFault, at: at, fault: f})
	}
	if at != nil && !stopped {
		at.r.Stop()
		a.log.Info("stopping workers", "reason", f.Reason, "signal", syscall.SIGTERM, "grace", a.cfg.StopTimeout)
		s.abort(why)
	}
	if s.j != nil {
		s.leave(why)
	}
	if at != nil && !stopped {
		at.g.Stop(syscall.SIGTERM, a.cfg.StopTimeout)
		s.events.report(a.log, at.gen, s.srv.Conns)
	}
	return &FaultError{Severity: Drain, Err: f.Err}
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
	why := "agent stopping: " // the other nodes and `ddp-agent status` see why this one left
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
