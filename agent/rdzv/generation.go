package rdzv

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Fail reports that round r failed here (a worker failed): the job moves
// to a new generation, which counts against --max-restarts. It returns
// *JobFailedError when no restarts were left. When the job already moved
// on (another node's fault came first), nothing more is counted.
//
// Each try is bounded as Next's requests are (silence.bound), and a try
// the store leaves unanswered is made again, to whichever member the
// client picks next, until the store has been silent for the store
// timeout: one try of 10 s could wait all that time on a frozen member
// while the others would have answered.
func (e *Membership) Fail(ctx context.Context, r *Round, reason string) error {
	silent := e.newSilence()
	for {
		asked := time.Now()
		qctx, cancel := silent.bound(ctx)
		st, err := e.bump(qctx, r.Generation, faultMove(e.node, e.cfg.Host, r.GroupRank, reason))
		cancel()
		e.noteAnswer(asked, err)
		switch {
		case err == nil && st.Phase == Failed:
			return &JobFailedError{Reason: st.Reason}
		case err == nil:
			return nil
		case ctx.Err() != nil || !unanswered(err):
			return err
		}
		if lost := silent.tooLong(err); lost != nil {
			e.markStoreLost()
			return lost
		}
		if !sleep(ctx, 100*time.Millisecond) { // a member that refuses at once is not asked in a spin
			return context.Cause(ctx)
		}
	}
}

// bump makes move mv of the job from running generation gen to the next
// one, unless someone already did. A fault counts against the job's
// restarts; when none are left the job fails instead.
func (e *Membership) bump(ctx context.Context, gen uint64, mv move) (*State, error) {
	for {
		st, rev, _, err := e.readState(ctx)
		if err != nil {
			return nil, err
		}
		if st.Generation != gen || st.Phase != Running {
			return st, nil
		}
		next, ok, err := e.bumpFrom(ctx, st, rev, mv)
		if err != nil {
			return nil, err
		}
		if ok {
			return next, nil
		}
	}
}

// bumpFrom moves the job on from st, whose mod revision is rev, in one
// compare-and-swap without reading anything: when a lost member is seen
// by every other member at once, none of them reads the state first, and
// all but one fail the compare. It reports whether this call moved the job.
func (e *Membership) bumpFrom(ctx context.Context, st *State, rev int64, mv move) (*State, bool, error) {
	next := *st
	next.Generation++
	next.Phase = Joining
	next.Reason, next.End = mv.Reason, mv.End
	next.Since = time.Now()
	next.LastStore = ""
	if st.Phase == Running && st.AgentStore && st.MasterNode != "" {
		next.LastStore = storeID(st.MasterNode, st.MasterPort)
	}
	next.WorldSize, next.MasterAddr, next.MasterPort, next.Carry = 0, "", 0, false
	next.Owed = mv.Fault && mv.End.Kind == EndNodeLost && next.LastStore != ""
	if mv.Fault && !next.Owed {
		next.Failures++
		if next.Failures > st.MaxRestarts {
			next.Phase = Failed
			next.Reason = fmt.Sprintf("%s; no restarts left (--max-restarts %d)", mv.Reason, st.MaxRestarts)
		}
	}
	ok, err := e.swapState(ctx, rev, &next)
	if err != nil {
		return nil, false, fmt.Errorf("rendezvous store at %s: new generation: %w", e.cfg.Endpoint, err)
	}
	if ok {
		e.log.Info("new generation", "generation", next.Generation, "phase", next.Phase, "reason", next.Reason,
			"end", next.End, "failures", next.Failures, "max_restarts", next.MaxRestarts)
	}
	return &next, ok, nil
}

// bumpUntilMoved retries bump through store errors (a leader election in
// an etcd cluster) until the job left generation gen or ctx ends: a lost
// member noticed only by this node must not be forgotten.
func (e *Membership) bumpUntilMoved(ctx context.Context, r *Round, mv move) {
	for delay := 200 * time.Millisecond; ; delay = min(2*delay, 2*time.Second) {
		_, _, err := e.bumpFrom(ctx, r.state, r.stateMod, mv)
		if err == nil {
			return // moved by this call, or by someone else first
		}
		if full := e.storeFull(err); full != nil {
			// The workers' next store write fails the same way, and the
			// recovery that follows ends the agent with the reason.
			e.log.Error("cannot move the job to a new generation", "reason", mv.Reason, "err", full)
			return
		}
		e.log.Warn("move the job to a new generation; retrying", "reason", mv.Reason, "err", err)
		select {
		case <-r.done:
			return
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// restartEndedJob starts a new run of a job that succeeded or failed,
// when no other agent of it is left: the id is being reused. It reports
// whether it did.
func (e *Membership) restartEndedJob(ctx context.Context, st *State, rev int64) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	resp, err := e.cli.Get(ctx, e.key(nodesDir), clientv3.WithPrefix())
	if err != nil {
		return false, fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
	}
	for _, kv := range resp.Kvs {
		var n NodeInfo
		if string(kv.Key) != e.key(nodesDir+e.node) && decode(string(kv.Key), kv.Value, &n) == nil && n.State == NodeActive {
			return false, nil // an agent of the ended run is still leaving
		}
	}
	next := State{Generation: uint64(resp.Header.Revision) + 1, Phase: Joining, Run: newRunID(), Since: time.Now(), MaxRestarts: e.cfg.MaxRestarts,
		Reason: fmt.Sprintf("new run of job %s (the last one %s: %s)", e.cfg.JobID, st.Phase, st.Reason)}
	ok, err := e.swapState(ctx, rev, &next)
	if err != nil {
		return false, fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
	}
	if ok {
		e.log.Info("starting a new run of an ended job", "job", e.cfg.JobID, "run", next.Run, "last", st.Phase)
	}
	return true, nil
}
