package agent

import (
	"context"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/fault"
	"github.com/ddp-agent/ddp-agent/agent/rootcause"
)

// A node that joins in a job's last steps, under --spares, starts its
// workers to join the others' re-formation (Spec.Join); the others may
// complete the job before they re-form. Their store then goes with them,
// and the new workers, having done nothing, fail on it or wait for it (a
// client that never connected waits out its 60 s timeout): the job
// finished without this node, as when its round never came (noRound).
// Before, the agent took it for a fault, restarted its workers, and
// waited out the join timeout for nodes that had left, to exit 1.

// othersDoneWait bounds the wait for the other nodes to mark their
// workers done, after this node's failed (their store stops with their
// workers, moments before their agents tell the rendezvous), and is the
// grace this node's workers get to end on their own once the others are
// done (they had joined, and finish with them).
const othersDoneWait = 5 * time.Second

// othersDonePoll is how often a node whose workers started to join looks
// for the other nodes' workers all done: one count of keys in the store.
const othersDonePoll = time.Second

// watchOthersDone ends the round of attempt at, whose workers started to
// join the others' re-formation, once every other node of the round has
// finished its workers and this node's have not ended within
// othersDoneWait: they have nothing left to join (finishedWithout). It
// returns when ctx ends (the attempt's wait is over) or a worker's exit
// closes failing: that exit's fault ends the attempt, and says why.
func (r *run) watchOthersDone(ctx context.Context, at *attempt, failing <-chan struct{}) {
	w := idleWatch{
		poll: othersDonePoll, grace: othersDoneWait, dying: r.cfg.StopTimeout,
		othersDone: func(ctx context.Context) bool { return r.j.rz.OthersDone(ctx, at.r, 0) },
		raising: func() bool {
			if !at.g.Raising() {
				return false
			}
			r.log.Info("the other nodes' workers are done, and one of this node's raised: waiting for it to exit",
				"generation", at.gen, "wait", r.cfg.StopTimeout)
			return true
		},
	}
	if w.idle(ctx, failing) {
		r.faults.Report(fault.Round(at.gen, "the other nodes' workers finished the job before this node's joined them"))
	}
}

// idleWatch is how watchOthersDone tells that this node's workers will not
// end on their own: the other nodes are done (othersDone, asked every
// poll), and grace has passed, with dying more where a worker had raised
// by then (raising).
type idleWatch struct {
	poll, grace, dying time.Duration
	othersDone         func(context.Context) bool
	raising            func() bool
}

// idle reports whether the other nodes were done and the grace then
// passed with failing still open and ctx not done. A worker that failed
// on the others' store, gone with them, closes failing as it exits,
// before its root cause is worked out (up to rootSettle, where the other
// agents no longer answer): the watch, whose grace may end meanwhile,
// would otherwise report the job done without this node in its stead.
// A worker that has raised (its error file written) but not exited when
// the grace ends is given dying, the time a stopped worker gets to exit:
// under load, a Python interpreter's teardown takes seconds.
func (w idleWatch) idle(ctx context.Context, failing <-chan struct{}) bool {
	tick := time.NewTicker(w.poll)
	defer tick.Stop()
	var (
		graced   <-chan time.Time // set once the others are done
		extended bool
	)
	for {
		select {
		case <-ctx.Done():
			return false
		case <-failing:
			return false
		case <-graced:
			if extended || !w.raising() {
				return true
			}
			extended = true
			t := time.NewTimer(w.dying)
			defer t.Stop()
			graced = t.C
		case <-tick.C:
			if graced == nil && w.othersDone(ctx) {
				tick.Stop()
				t := time.NewTimer(w.grace)
				defer t.Stop()
				graced = t.C
			}
		}
	}
}

// finishedWithout reports whether the job finished without this node's
// workers, whose attempt ended with fault f: they were started to join
// the others' re-formation, and every other node of the round has
// finished its workers. Where a worker failed on a lost connection (the
// others' store, gone with them) it waits up to othersDoneWait for them
// to say so; any other fault (a node lost, a worker's own error) is
// handled at once as ever. Then it stops the workers, marks this node's
// part of the round done, so the job is marked succeeded, and the run
// ends as one that succeeded.
func (r *run) finishedWithout(ctx context.Context, at *attempt, f *fault.Fault) bool {
	if !at.joined {
		return false
	}
	wait := time.Duration(0)
	if wf, ok := fault.As[*fault.WorkerFailedError](f); ok && rootcause.LooksLikeLostPeer(wf.Blame.Exit) {
		wait = othersDoneWait
	}
	// Bounded: a store without its quorum (the fault may be its node's)
	// holds a read for seconds, and the fault's handling must not wait.
	octx, cancel := context.WithTimeout(ctx, wait+time.Second)
	done := r.j.rz.OthersDone(octx, at.r, wait)
	cancel()
	if !done {
		return false
	}
	at.r.Stop()
	at.g.Stop(syscall.SIGTERM, r.cfg.StopTimeout)
	r.events.report(r.log, at.gen, r.srv.Conns)
	r.log.Info("the job finished without this node: the other nodes' workers completed it before this node's joined them",
		"generation", at.gen, "fault", f.Reason)
	if err := r.j.rz.Succeed(ctx, at.r); err != nil {
		r.log.Warn("tell the rendezvous this node finished", "err", err)
	}
	r.left = true // as a node that succeeded: its lease ends with the agent
	return true
}
