package agent

import (
	"context"
	"errors"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/fault"
	"github.com/ddp-agent/ddp-agent/agent/hostmon"
	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/rootcause"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
)

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
func decide(sev fault.Severity, restartsLeft, drainPending bool) action {
	switch {
	case sev == fault.Drain || drainPending:
		return actDrain
	case sev >= fault.Fail:
		return actFail
	case sev == fault.NewGeneration:
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
func (r *run) recover(ctx context.Context, at *attempt, f *fault.Fault) (done bool, err error) {
	restartsLeft, stopped := true, false
	if f.Severity == fault.Restart {
		r.logFinding(f)
		restartsLeft = r.failAttempt(ctx, at, f)
		stopped = true
	}
	act := decide(f.Severity, restartsLeft, r.faults.Drain() != nil)
	if at != nil && (act == actNewGeneration || act == actRestart) {
		at.carry = r.decideCarry(at, act)
	}
	if f.Severity == fault.Restart && act != actDrain {
		// Traced either way, with its reason; counted as a restart only
		// when the job restarts (no restarts left: the job failed).
		r.exp.Fault(at.gen, f.Reason, act == actRestart)
	}
	switch act {
	case actNewGeneration:
		r.tell(event{kind: evFault, at: at, fault: f})
		r.abort("job moving to a new generation: " + f.Reason)
		if at.carry { // the workers wait in their re-formation for the next round (keep.go)
			// Their control connections stay open: no wait for them to
			// close before the count, which would hold this node out of
			// the next round's join for a second.
			r.events.report(r.log, at.gen, func() int { return 0 })
			r.dropKeys(at.gen)
			return false, nil
		}
		r.log.Warn("stopping workers: the job is moving to a new generation", "generation", at.gen, "reason", f.Reason)
		cutoff := time.Now()
		at.g.Stop(syscall.SIGTERM, r.cfg.StopTimeout)
		r.dropGeneration(at.gen)
		if at.r.End().Kind == rdzv.EndNodeLost {
			// Workers without the hook may have failed on their
			// connections to the lost node before its lease ran out, and
			// not been reaped yet: without a report the first of them
			// would be all a person sees of it.
			if b, ok := rootcause.LostNodeVictims(at.g.Outcomes(), cutoff, f.Reason); ok {
				r.report(b, at, r.mon)
			}
		}
		return false, nil
	case actDrain:
		return true, r.drain(at, r.faults.Drain(), stopped)
	case actFail:
		jf := &JobFailedError{Attempts: at.n + 1, Reason: f.Reason}
		if wf, ok := fault.As[*supervisor.WorkerExitError](f); ok {
			jf = &JobFailedError{Attempts: at.n + 1, Cause: wf}
		}
		return true, &fault.Error{Severity: fault.Fail, Err: jf}
	}
	if ctx.Err() != nil {
		return true, context.Cause(ctx)
	}
	r.log.Warn("restarting worker group", "restarts", at.r.Restarts+1, "max_restarts", r.cfg.MaxRestarts)
	r.tell(event{kind: evRestarting, at: at, fault: f, restarts: at.r.Restarts + 1, maxRestarts: r.cfg.MaxRestarts})
	return false, nil
}

// logFinding logs a GPU's or a plugin's finding that stops the job's
// workers; a worker's failure and a hang have their own report. Whether
// they restart is decided after (restarts left?) and logged then.
func (r *run) logFinding(f *fault.Fault) {
	const what = "stopping the job's workers"
	switch f.Source {
	case fault.FromGPU:
		gf, _ := fault.As[*fault.GPUError](f)
		fd := gf.Findings[0]
		r.log.Error("GPU fault: "+what, "gpu", fd.GPU, "uuid", fd.UUID, "ranks", fd.Ranks,
			"kind", string(fd.Kind), "xid", fd.XID, "finding", fd.Message, "count", fd.Count)
	case fault.FromStore:
		se, _ := fault.As[*supervisor.StoreExitError](f)
		r.log.Error("the workers' store exited: "+what, "pid", se.PID, "exit", se.Exit, "stderr", se.StderrTail)
	case fault.FromPlugin:
		pf, _ := fault.As[*fault.PluginError](f)
		r.log.Error("health check: "+what, "plugin", pf.Finding.Plugin, "subject", pf.Finding.Subject,
			"finding", pf.Finding.Message)
	}
}

// failAttempt handles a fault of this node's attempt: it aborts the
// workers' communicators, tells the rendezvous first (the other nodes'
// workers are stuck on this node's until their agents restart them),
// stops the workers, and reports. It reports whether the job has
// restarts left.
func (r *run) failAttempt(ctx context.Context, at *attempt, f *fault.Fault) (restartsLeft bool) {
	if f.Source == fault.FromWorker {
		r.mon.Sample() // the failed worker is gone; this captures the survivors' state at failure time
	}
	r.abort(f.Reason)
	// Sent first, answered whenever: a store without a quorum answers
	// nothing until the request's timeout, and the failure's report
	// waited for it (the worker's death logged 15.7 s late).
	failed := make(chan error, 1)
	go func() { failed <- r.j.rz.Fail(ctx, at.r, f.Reason) }()
	at.r.Stop()
	at.g.Stop(syscall.SIGTERM, r.cfg.StopTimeout)
	r.dropGeneration(at.gen)
	ev := event{kind: evFault, at: at, fault: f}
	if wf, ok := fault.As[*fault.WorkerFailedError](f); ok {
		b := rootcause.Reclassify(at.g.Outcomes(), wf.Decided, wf.Blame) // the exits and notes of them all, now
		text := r.report(b, at, r.mon)
		ev.blame, ev.report = &b, text
	}
	r.tell(ev)
	ferr := <-failed
	var jf *rdzv.JobFailedError
	if errors.As(ferr, &jf) {
		return false
	}
	if ferr != nil {
		r.log.Error("tell the rendezvous about the failure", "err", ferr)
	}
	return true
}

// drain takes this node out of the job for the drain fault f: the
// workers stopped (unless stopped already) and their communicators
// aborted, the rendezvous left with the reason, which the other nodes and
// `ddp-agent status` see. at is nil outside an attempt.
func (r *run) drain(at *attempt, f *fault.Fault, stopped bool) error {
	why := "drained: " + f.Reason
	if f.Source == fault.FromGPU { // a detector's verdict went to the notifiers when it came
		r.tell(event{kind: evFault, at: at, fault: f})
	}
	if at != nil && !stopped {
		at.r.Stop()
		r.log.Info("stopping workers", "reason", f.Reason, "signal", syscall.SIGTERM, "grace", r.cfg.StopTimeout)
		r.abort(why)
	}
	if r.j != nil {
		r.leave(why)
	}
	if at != nil && !stopped {
		at.g.Stop(syscall.SIGTERM, r.cfg.StopTimeout)
		r.events.report(r.log, at.gen, r.srv.Conns)
	}
	return &fault.Error{Severity: fault.Drain, Err: f.Err}
}

// report writes the root cause of a failed attempt, whose workers have
// stopped, to the agent's stderr (rootcause.Format) and logs it.
func (r *run) report(b rootcause.Blame, at *attempt, mon *hostmon.Monitor) string {
	r.log.Error("worker failed", b.LogAttrs(at.r.Restarts, at.started)...)
	text := rootcause.Format(b, at.r.Restarts, r.cfg.MaxRestarts, at.started, at.g.PIDs(), mon)
	r.stderr.Write([]byte(text))
	return text
}

// rootSettle bounds how long a failed attempt waits for its root cause to
// show itself (at most the stop timeout): a worker of this node that a
// victim named, or that wrote its error file before the first exit, and
// that has not exited yet (it is still tearing down), or another node's
// agent telling the rendezvous about its own worker, with its report.
const rootSettle = 5 * time.Second

// workerFailure works out the root cause of the attempt, whose first
// failed worker has just been reaped: it may be another worker, which the
// first one's shim named.
func (r *run) workerFailure(ctx context.Context, at *attempt) *fault.WorkerFailedError {
	deadline := time.Now().Add(min(rootSettle, r.cfg.StopTimeout))
	checked := false
	for {
		now := time.Now()
		b := rootcause.Decide(at.g.Outcomes(), now)
		if !b.Local {
			b.Elsewhere = at.r.Reason() // "" until another node's agent has told the rendezvous
		}
		lostPeer := b.NoNotes() && rootcause.LooksLikeLostPeer(b.Exit)
		left := time.Until(deadline)
		switch {
		case lostPeer && !checked && left > 0 && ctx.Err() == nil:
			// A lost connection, and no note of whose: another node may be
			// gone. Its agent refusing, the round ends with it lost; where
			// the probe could not tell (the node list or an agent slow to
			// answer on a loaded machine), its lease may still end the
			// round within rootSettle. Only where every agent answered is
			// no node lost.
			checked = true
			if r.j.rz.CheckPeers(ctx) != rdzv.PeersAnswered {
				waitRoundEnd(ctx, at.r, time.Until(deadline))
			}
			continue
		case lostPeer && at.r.End().Kind == rdzv.EndNodeLost:
			return &fault.WorkerFailedError{Blame: b.LostPeer(at.r.Reason()), Decided: now}
		case b.Root < 0 || b.Exit != nil || b.Elsewhere != "" || left <= 0 || ctx.Err() != nil:
		case b.Local:
			msg := "a worker failed only because another failed first: waiting for that one to exit"
			if len(b.Victims) == 0 { // no notes (no hook): its error file says it raised first
				msg = "a worker raised before the first to exit: waiting for it to exit"
			}
			r.log.Info(msg, "rank", b.Root, "victims", b.VictimRanks(), "wait", left.Round(time.Millisecond))
			if !at.g.WaitExited(ctx, b.Root, left) { // else its exit, error file and stderr go into the report
				deadline = time.Now() // once more with what the workers noted meanwhile, then decide
			}
			continue
		default: // another node's worker: give its agent the chance to say so first
			r.log.Info("a worker failed only because a rank of another node failed first: waiting for its node to report it",
				"rank", b.Root, "victims", b.VictimRanks(), "wait", left.Round(time.Millisecond))
			waitRoundEnd(ctx, at.r, left)
			deadline = time.Now() // once more with what the workers noted meanwhile, then decide
			continue
		}
		return &fault.WorkerFailedError{Blame: b, Decided: now}
	}
}

// waitRoundEnd waits at most d for round rd to end.
func waitRoundEnd(ctx context.Context, rd *rdzv.Round, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-rd.Done():
	case <-ctx.Done():
	case <-t.C:
	}
}

// dropGeneration logs the generation's collective events and deletes its
// bootstrap keys, once its workers are gone.
func (r *run) dropGeneration(gen uint64) {
	r.events.report(r.log, gen, r.srv.Conns)
	r.dropKeys(gen)
}

// dropKeys deletes generation gen's bootstrap keys.
func (r *run) dropKeys(gen uint64) {
	// In the background: the next generation's keys are under a prefix
	// of their own, and a request sent to a store member that froze (the
	// fault being recovered from) held the re-formation 5 s. Bounded: the
	// store may be what just failed.
	r.goBackground(func() {
		ctx, cancel := context.WithTimeout(r.srvCtx, 5*time.Second)
		defer cancel()
		switch err := r.srv.DropGeneration(ctx, gen); {
		case err == nil:
		case r.srvCtx.Err() != nil:
			// The run ended meanwhile (a failed job's last attempt): the
			// keys go with the job, and a warning on every failed job
			// read as a second fault.
			r.log.Debug("drop control store keys: the run ended first", "generation", gen, "err", err)
		default:
			r.log.Warn("drop control store keys", "generation", gen, "err", err)
		}
	})
}

// decideCarry decides, where spares are kept and the attempt ended
// for a change of the job's nodes, whether the workers carry on into the
// next round in process (keepsWorkers; the world file marked moving
// before the workers are aborted), logs which path it is and why, and
// reports whether they carry on. The workers' own failure may have
// ended the attempt first (their store went with a lost node): the
// round's end says it was the nodes all the same, and they restart.
func (r *run) decideCarry(at *attempt, act action) bool {
	end := at.r.End()
	keep, why := keepsWorkers(r.cfg.Spares, at.r.AgentStore, end)
	if keep && act == actNewGeneration {
		// Before the workers are aborted: their re-formation, which the
		// abort starts, must hold for the next generation's world.
		if err := writeWorld(r.worldFile(), world{Generation: at.gen, Moving: true}); err != nil {
			keep, why = false, err.Error()
		}
	}
	switch {
	case keep && act == actNewGeneration:
		r.log.Warn("warm spares: the job's nodes changed; the workers keep their processes and wait for the next generation, to carry on in it in process",
			"end", end.String(), "generation", at.gen)
		return true
	case why == "" && keep:
		why = "a worker's failure ended the attempt first"
	}
	if why != "" {
		r.log.Info("warm spares: a change of the job's nodes restarts the workers, as without spares", "why", why, "end", end.String())
	}
	return false
}
