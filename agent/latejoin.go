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
// and the new workers fail on it, having done nothing: the job finished
// without this node, as when its round never came (noRound). Before, the
// agent took it for a fault, restarted its workers, and waited out the
// join timeout for nodes that had left, to exit 1.

// othersDoneWait bounds the wait for the other nodes to mark their
// workers done: their store stops with their workers, moments before
// their agents tell the rendezvous (Succeed).
const othersDoneWait = 5 * time.Second

// finishedWithout reports whether the job finished without this node's
// workers, whose failure is f: they were started to join the others'
// re-formation, failed on a lost connection (the store), and every other
// node of the round has finished its workers. Then it stops the workers,
// marks this node's part of the round done, so the job is marked
// succeeded, and the run ends as one that succeeded.
func (r *run) finishedWithout(ctx context.Context, at *attempt, f *fault.Fault) bool {
	wf, ok := fault.As[*fault.WorkerFailedError](f)
	if !at.joined || !ok || !rootcause.LooksLikeLostPeer(wf.Blame.Exit) || !r.j.rz.OthersDone(ctx, at.r, othersDoneWait) {
		return false
	}
	at.r.Stop()
	at.g.Stop(syscall.SIGTERM, r.cfg.StopTimeout)
	r.events.report(r.log, at.gen, r.srv.Conns)
	r.log.Info("the job finished without this node: the other nodes' workers completed it before this node's joined them",
		"generation", at.gen, "error", wf.Blame.Exit.Error())
	if err := r.j.rz.Succeed(ctx, at.r); err != nil {
		r.log.Warn("tell the rendezvous this node finished", "err", err)
	}
	r.left = true // as a node that succeeded: its lease ends with the agent
	return true
}
