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

	"github.com/ddp-agent/ddp-agent/agent/backoff"
	"github.com/ddp-agent/ddp-agent/agent/fault"
	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/straggler"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/watch"
	"github.com/ddp-agent/ddp-agent/internal/envname"
)

// attempt is one run of this node's worker group, in one generation.
type attempt struct {
	n       int // 0 for the first
	gen     uint64
	r       *rdzv.Round
	g       *supervisor.Group
	dir     string // its workers' error files, logs and stacks
	started time.Time
	// carry: its workers outlive it, to carry on into the next round in
	// process (keep.go); set by recover.
	carry bool
	// joined: its workers started to join the other nodes' workers,
	// carried on into its round (Spec.Join; latejoin.go).
	joined bool
}

// loop runs attempts until the job succeeds, fails, this node drains, or
// ctx ends (a signal).
func (r *run) loop(ctx context.Context) error {
	defer r.health.set(phaseStopped)
	var ended []backoff.Attempt // how the attempts so far ended, for the restart backoff
	var kept *attempt           // the last attempt, whose workers wait to carry on (keep.go)
	var plain string            // the nodes without --spares last told of (warnPlain)
	warm := r.startWarm(ctx)    // the first attempt's workers, started before the rendezvous (warm.go)
	defer func() {
		if warm != nil { // no round came to give them ranks
			warm.Stop(syscall.SIGKILL, 0)
		}
	}()
	for n := 0; ; n++ {
		if kept == nil { // kept workers wait in their re-formation: no backoff
			if err := r.waitBackoff(ctx, ended); err != nil {
				return err
			}
		}
		if r.faults.Drain() != nil { // found during the backoff or the last attempt's end
			r.release(kept, "this node drains")
			return r.drainOr(ctx, nil)
		}
		r.health.set(phaseRendezvous)
		waitStart := time.Now()
		nctx, stop := r.faults.Bound(ctx)
		r.j.rz.OfferStore(keptStorePort(kept))
		rd, err := r.j.rz.Next(nctx)
		stop()
		if err != nil {
			r.release(kept, "no next round")
			return r.noRound(ctx, n, err)
		}
		plain = r.warnPlain(rd, plain)
		r.obs.Exp.SetRun(rd.Run) // the trace ids of this run of the job, before any worker starts
		var at *attempt
		if kept != nil {
			at, kept = r.carryOn(ctx, kept, rd, n), nil
		}
		if at == nil {
			at, err = r.start(ctx, n, rd, waitStart, warm)
			warm = nil
		}
		switch {
		case err != nil && at != nil: // a signal or a drain while the workers were spawned
			return r.interrupted(ctx, at)
		case err != nil:
			return err
		}
		r.health.set(phaseRunning)
		f, err := r.wait(ctx, at)
		ran := time.Since(at.started)
		r.stragglers.End()
		r.watch.End()
		switch {
		case err != nil && ctx.Err() != nil: // a signal or the caller
			return r.stop(ctx, at)
		case err != nil: // the supervisor failed: not the workers' fault
			at.r.Stop()
			at.g.Stop(syscall.SIGTERM, r.cfg.StopTimeout)
			return err
		case f == nil:
			return r.succeed(ctx, at)
		case r.finishedWithout(ctx, at, f):
			return nil
		}
		r.health.set(phaseRestarting)
		if done, err := r.recover(ctx, at, f); done {
			return err
		}
		if at.carry {
			kept = at
		}
		ended = r.backoff().Recent(append(ended, backoff.Attempt{Ran: ran, Fault: f.RestartsJob()}))
	}
}

// interrupted ends the run when a signal, or a drain, came while the
// workers were spawned.
func (r *run) interrupted(ctx context.Context, at *attempt) error {
	if f := r.faults.Drain(); f != nil && ctx.Err() == nil {
		_, err := r.recover(ctx, at, f)
		return err
	}
	return r.stop(ctx, at)
}

// noRound is the end of the job when this node gets no next round.
func (r *run) noRound(ctx context.Context, n int, err error) error {
	var failed *rdzv.JobFailedError
	switch {
	case ctx.Err() != nil:
		return context.Cause(ctx)
	case r.faults.Drain() != nil: // a drain found while the rendezvous waited for its nodes
		return r.drainOr(ctx, err)
	case errors.Is(err, rdzv.ErrJobSucceeded):
		r.log.Info("the job finished without this node")
		return nil
	case errors.As(err, &failed):
		return &fault.Error{Severity: fault.Fail, Err: &JobFailedError{Attempts: n, Reason: failed.Reason}}
	}
	r.leave("gave up: " + err.Error())
	return err
}

// start starts attempt n's workers in round r and begins watching them.
// When ctx ends while the workers are spawned, it returns the attempt with
// the workers started so far, and ctx's cause, for the caller to stop.
func (r *run) start(ctx context.Context, n int, rd *rdzv.Round, waitStart time.Time, warm *supervisor.Group) (*attempt, error) {
	at := &attempt{n: n, gen: rd.Generation, r: rd, dir: r.attemptDir(n)}
	r.mu.Lock()
	r.last = at
	r.mu.Unlock()
	r.srv.SetGeneration(at.gen, rd.WorldSize, nil)
	spec := r.spec(rd, at.dir)
	r.setGroup(nil, 0) // the last attempt's workers are gone: no ranks on the GPUs until the next start
	r.faults.Clear()   // what is queued belongs to the last attempt
	at.started = time.Now()
	at.g = r.adoptWarm(warm, spec, n)
	r.setGroup(at.g, rd.RankOffset) // before the first worker runs: it may dial the control socket at once
	sctx, stop := r.faults.Bound(ctx)
	defer stop()
	if err := at.g.Start(sctx); err != nil {
		if sctx.Err() != nil {
			return at, context.Cause(sctx)
		}
		rd.Stop()
		return nil, fmt.Errorf("attempt %d: %w", n, err)
	}
	r.observe(ctx, at)
	at.joined = spec.Join
	if spec.Join {
		r.log.Info("warm spares: the other nodes' workers carry on from the last generation in process; these start to join their re-formation",
			"generation", at.gen)
	}
	r.log.Info("workers started", "attempt", n, "generation", at.gen, "group_rank", rd.GroupRank, "nnodes", rd.NNodes,
		"world_size", rd.WorldSize, "master", net.JoinHostPort(spec.MasterAddr, strconv.Itoa(spec.MasterPort)),
		"rendezvous", at.started.Sub(waitStart).Round(time.Millisecond), "pids", at.g.PIDs(), "run", rd.Run)
	return at, nil
}

// observe begins watching the workers of attempt at, started or carried
// on into its round: the stragglers, the hangs, the host's samples.
func (r *run) observe(ctx context.Context, at *attempt) {
	rd := at.r
	r.stragglers.Begin(straggler.Attempt{Gen: at.gen, Nodes: rd.NNodes, RankOffset: rd.RankOffset,
		NProc: r.cfg.NProcPerNode, Restarts: rd.Restarts, Follower: rd.NNodes > 1 && rd.GroupRank != 0})
	r.watch.Begin(ctx, watch.Attempt{Gen: at.gen, GroupRank: rd.GroupRank, NNodes: rd.NNodes, WorldSize: rd.WorldSize,
		RankOffset: rd.RankOffset, MasterAddr: rd.MasterAddr, Done: rd.Done(), Workers: r.workers(at.g, rd.RankOffset),
		StackDir: filepath.Join(at.dir, "stacks"), KV: r.j.kv, JobID: r.runID, Token: r.cfg.Rendezvous.Token})
	r.mon.SetWorkers(at.g.PIDs())
	r.mon.Sample() // a worker that dies at once still gets a line in the report
}

// spec is the worker group of round r.
func (r *run) spec(rd *rdzv.Round, attemptDir string) *supervisor.Spec {
	bootstrap := ""
	if r.j.nodeLocalKV {
		bootstrap = "external"
	}
	worldFile := ""
	if r.cfg.Spares > 0 {
		worldFile = r.worldFile()
	}
	return &supervisor.Spec{
		Argv:             r.cfg.Command,
		BaseEnv:          append(slices.Clip(r.baseEnv), envname.StackDir+"="+filepath.Join(attemptDir, "stacks")),
		NProc:            r.cfg.NProcPerNode,
		VirtualLocalRank: r.cfg.VirtualLocalRank,
		RankOffset:       rd.RankOffset,
		WorldSize:        rd.WorldSize,
		NodeRank:         rd.GroupRank,
		NNodes:           rd.NNodes,
		MasterAddr:       rd.MasterAddr,
		MasterPort:       rd.MasterPort,
		RunID:            r.runID,
		Role:             r.cfg.Role,
		RestartCount:     rd.Restarts,
		MaxRestarts:      r.cfg.MaxRestarts,
		Generation:       rd.Generation,
		ControlSocket:    r.srv.Path(),
		Bootstrap:        bootstrap,
		TorchVersion:     r.cfg.TorchVersion,
		SignalsToHandle:  r.cfg.SignalsToHandle,
		AttemptDir:       attemptDir,
		Place:            r.cfg.GPUs.placer(),
		Streams:          r.streams(),
		Stdout:           r.stdout,
		Stderr:           r.stderr,
		OnLogLoss:        r.losses.Add,
		Spares:           r.cfg.Spares,
		SpareArgv:        r.cfg.SpareCommand,
		SpareEnv:         r.cfg.SpareEnv,
		AgentStore:       rd.AgentStore,
		StoreArgv:        r.cfg.StoreCommand,
		WorldFile:        worldFile,
		// The other nodes' workers carry on from the last generation
		// (keep.go): new ones join their re-formation.
		Join: rd.Carry && len(r.cfg.SpareCommand) > 0,
	}
}

// wait blocks until the attempt's workers have all succeeded (nil, nil),
// a fault ended it, or ctx is done (ctx's cause). A worker's failure, the
// end of the round and every other source reach it through the fault
// queue.
func (r *run) wait(ctx context.Context, at *attempt) (*fault.Fault, error) {
	rctx, end := context.WithCancel(ctx)
	watched, joinWatched := make(chan struct{}), make(chan struct{})
	defer func() {
		end()
		<-watched // no round fault of this attempt is reported after it
		<-joinWatched
	}()
	// The group's end: nil when every worker succeeded, ctx's error, or
	// the supervisor's own; a worker's failure is reported as a fault
	// instead (failed), once its root cause is worked out.
	var (
		waited  = make(chan struct{})
		ended   error
		failed  bool
		failing = make(chan struct{}) // closed as a failure's fault is worked out
	)
	go func() {
		defer close(waited)
		for {
			err := at.g.Wait(rctx)
			if se, ok := errors.AsType[*supervisor.StoreExitError](err); ok {
				failed = true
				close(failing)
				r.faults.Report(fault.Store(at.gen, se))
				return
			}
			var we *supervisor.WorkerExitError
			if !errors.As(err, &we) {
				ended = err
				return
			}
			if r.replace(at, we) { // a warm spare took its rank: wait on
				continue
			}
			failed = true
			close(failing)
			r.faults.Report(fault.Worker(at.gen, r.workerFailure(ctx, at)))
			return
		}
	}()
	tick := time.NewTicker(healthTick) // the liveness probe's sign that this loop still turns
	defer tick.Stop()
	go func() {
		defer close(watched)
		select {
		case <-at.r.Done():
			r.faults.Report(fault.Round(at.gen, at.r.Reason()))
		case <-rctx.Done():
		}
	}()
	go func() {
		defer close(joinWatched)
		if at.joined {
			r.watchOthersDone(rctx, at, failing)
		}
	}()
	var f *fault.Fault
	for f == nil {
		select {
		case <-waited:
			if !failed {
				return r.groupEnded(ctx, at, ended)
			}
			waited = nil // its fault is queued
		case <-r.faults.Ready():
			if f = r.faults.Take(at.gen, at.started, r.dropStale); f != nil && r.replaceHung(at, f) {
				f = nil // the hung ranks were killed for spares: the Wait above sees their deaths
			}
		case <-tick.C:
			r.health.ticked()
		}
	}
	end()
	if waited != nil {
		<-waited
	}
	switch {
	case f.Source == fault.FromWorker:
		return f, nil
	case failed:
		// A worker that failed before the fault was handled is the
		// fault: it names a rank and has the report.
		if wf := r.faults.TakeWorker(at.gen); wf != nil {
			return wf, nil
		}
		return f, nil
	case ended == nil: // they all succeeded meanwhile
		return nil, nil
	case ctx.Err() == nil:
		return f, nil
	}
	return r.groupEnded(ctx, at, ended)
}

// groupEnded is the attempt's outcome when the worker group's Wait ended
// without a worker's failure.
func (r *run) groupEnded(ctx context.Context, at *attempt, err error) (*fault.Fault, error) {
	switch {
	case err == nil:
		return nil, nil
	case ctx.Err() != nil:
		return nil, context.Cause(ctx)
	}
	return nil, fmt.Errorf("attempt %d: wait for the workers: %w", at.n, err)
}

// dropStale logs a fault from an earlier attempt that is ignored.
func (r *run) dropStale(f *fault.Fault) {
	if f.Source == fault.FromGPU {
		// Stopping workers can itself raise XIDs (43 for a process
		// killed in a kernel): the last attempt'r.
		r.log.Warn("GPU fault from before these workers started: ignored", "fault", f.Err.Error())
	}
}

// succeed ends the job for this node: every worker exited 0.
func (r *run) succeed(ctx context.Context, at *attempt) error {
	at.r.Stop()
	r.events.report(r.log, at.gen, r.srv.Conns)
	r.log.Info("all workers succeeded", "attempt", at.n, "generation", at.gen, "elapsed", time.Since(at.started).Round(time.Millisecond))
	if err := r.j.rz.Succeed(ctx, at.r); err != nil {
		r.log.Warn("tell the rendezvous this node finished", "err", err)
	}
	r.left = true // succeeded nodes leave quietly: their lease ends with the agent
	return nil
}

// stop stops the workers when ctx is done (a signal, or the caller) and
// returns its cause.
func (r *run) stop(ctx context.Context, at *attempt) error {
	at.r.Stop()
	cause := context.Cause(ctx)
	sig := stopSignal(cause)
	r.log.Info("stopping workers", "reason", cause, "signal", sig, "grace", r.cfg.StopTimeout)
	why := "agent stopping: " // the other nodes and `ddp-agent status` see why this one left
	r.abort(why + cause.Error())
	r.leave(why + cause.Error())
	at.g.Stop(sig, r.cfg.StopTimeout)
	r.events.report(r.log, at.gen, r.srv.Conns)
	return cause
}

// backoff is the run's restart backoff (package backoff), its cap under a
// store half the join timeout.
func (a *Agent) backoff() backoff.Policy {
	var joinTimeout time.Duration
	if rz := a.cfg.Rendezvous; rz.Backend.UsesStore() {
		joinTimeout = rz.JoinTimeout
	}
	return backoff.For(joinTimeout)
}

// waitBackoff waits before the next attempt as the backoff decides from
// the attempts so far, unless ctx ends first (a signal: its cause is
// returned) or a drain is queued (nil, for the loop to handle it).
func (r *run) waitBackoff(ctx context.Context, hist []backoff.Attempt) error {
	p := r.backoff()
	d, quick := p.Delay(hist)
	if d <= 0 {
		return nil
	}
	r.log.Warn(fmt.Sprintf("restarting in %v (backoff after %d quick failures)", d, quick),
		"delay", d, "quick_failures", quick, "healthy_after", p.Healthy, "max_delay", p.Max)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-r.faults.Urgent():
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// streams is the supervisor's Spec.Streams: the configured one, or the
// console, and with a log dir every stream's file too (as --log-dir alone
// does).
func (a *Agent) streams() func(int) supervisor.Streams {
	if a.cfg.Streams != nil {
		return a.cfg.Streams
	}
	files := a.cfg.LogDir != ""
	return func(int) supervisor.Streams {
		return supervisor.Streams{ConsoleOut: true, ConsoleErr: true, FileOut: files, FileErr: files}
	}
}
