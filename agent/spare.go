package agent

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/fault"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/watch"
)

// replaceable is whether a warm spare may take the rank of the worker
// whose exit is e, with idle spares waiting, and why not: pure. A spare
// keeps the survivors only where they can re-form in process with it
// (ddp_agent.InProcess), so it takes a worker that died (a signal: SIGKILL,
// the OOM killer, a crash), not one that exited on its own: a script that
// raised outside InProcess's step, or gave up re-forming, exits with a
// code, and running it again in a spare would meet the same. agentStore:
// the workers' store has a process of its own (the round's AgentStore);
// otherwise rank 0's worker served it, and the survivors have nothing to
// re-form through.
func replaceable(e *supervisor.WorkerExitError, idle int, agentStore bool) (bool, string) {
	switch {
	case e.Signal == 0:
		return false, fmt.Sprintf("it exited with code %d, not killed by a signal", e.Code)
	case e.Rank == 0 && !agentStore:
		return false, "rank 0's process served the job's store (MASTER_PORT), which died with it"
	case idle == 0:
		return false, "no warm spare is idle"
	}
	return true, ""
}

// replace gives the rank of the failed worker e to a warm spare, when the
// run keeps spares and replaceable says so, and reports whether it did:
// then the attempt goes on with the survivors' processes, and no fault is
// raised. It runs on the goroutine that waits for the attempt's workers.
func (r *run) replace(at *attempt, e *supervisor.WorkerExitError) bool {
	if r.cfg.Spares == 0 {
		return false
	}
	ok, why := replaceable(e, at.g.Spares(), at.r.AgentStore)
	if !ok {
		r.log.Warn("worker failed: no warm spare takes its rank, "+why, "rank", e.Rank, "pid", e.PID)
		return false
	}
	pid, err := at.g.Replace(e.Rank)
	if err != nil {
		r.log.Warn("worker failed: no warm spare takes its rank", "rank", e.Rank, "pid", e.PID, "err", err)
		return false
	}
	r.log.Warn("worker died: a warm spare takes its rank, the other workers keep their processes and re-form in process",
		"rank", e.Rank, "local_rank", e.LocalRank, "pid", e.PID, "signal", e.Signal.String(), "spare_pid", pid,
		"after", e.Time.Sub(at.started).Round(time.Millisecond), "spares_idle", at.g.Spares())
	r.mon.SetWorkers(at.g.PIDs())
	r.tell(event{kind: evReplaced, at: at, dead: e, sparePID: pid})
	r.refill(at, e.PID)
	return true
}

// spareRefillWait bounds how long the spare that replaces one given a
// rank waits for the re-formation it joined to be reported.
const spareRefillWait = 10 * time.Second

// spareSettleWait bounds how long a replacement stays pending without a
// report of the re-formation (a script whose InProcess runs without the
// hook reports none): past InProcess's default timeout (60 s), survivors
// that could not re-form with the spare have failed already.
const spareSettleWait = 90 * time.Second

// refill starts a spare in place of the one just given the rank of the
// worker of pid dead (0: none died, the spare serves the store), once a
// worker of this node has reported the re-formation (the retried step
// completed), or after spareRefillWait. Started at once, its torch import
// took a core from the re-forming workers: on the 2-core VM the state
// moved at two thirds of the speed, and the first step took 590-640 ms
// instead of 390 ms. The replacement is settled (supervisor's Settled)
// on that report, or after spareSettleWait.
func (r *run) refill(at *attempt, dead int) {
	reformed := r.reformed.next() // not a report of an earlier re-formation
	r.goBackground(func() {
		settle := time.NewTimer(spareSettleWait)
		defer settle.Stop()
		refill := time.NewTimer(spareRefillWait)
		defer refill.Stop()
		select {
		case <-reformed:
			at.g.Settled(dead)
			at.g.AddSpare()
			return
		case <-refill.C:
			at.g.AddSpare()
		case <-at.g.Closed():
			return
		}
		select {
		case <-reformed:
		case <-settle.C:
		case <-at.g.Closed():
			return
		}
		at.g.Settled(dead)
	})
}

// hungReplaceable is whether warm spares may take the ranks that never
// arrived at a hung collective, and why not: pure. Every one must be a
// worker of this node (first..first+nproc-1), none rank 0 unless the
// store has a process of its own (see replaceable), and a spare idle for
// each. The hung ranks are killed; their deaths then go the way of any
// worker's that died.
func hungReplaceable(missing []int, first, nproc, idle int, agentStore bool) (bool, string) {
	switch {
	case len(missing) == 0:
		return false, "no rank is named"
	case !allLocal(missing, first, nproc):
		return false, "a hung rank runs on another node"
	case slices.Contains(missing, 0) && !agentStore:
		return false, "rank 0's process serves the job's store (MASTER_PORT)"
	case len(missing) > idle:
		return false, fmt.Sprintf("%d ranks hung, %d warm spares idle", len(missing), idle)
	}
	return true, ""
}

// hangAction is what a node under --spares does about a hang.
type hangAction int

const (
	hangRestart hangAction = iota // the job restarts, as without spares
	hangKill                      // kill this node's hung ranks: its spares take them
	hangLeave                     // another node's agent decides: the leader's hang is not this node's alone
	hangDefer                     // the leader: the one node of the hung ranks kills them for its spares
)

// decideHang is what this node does about hang he, and why not a spare
// when it restarts: pure. The leader judges the hang (he.Node: every hung
// rank runs on that one other node) and every follower is told of it
// (he.Remote). The node whose ranks they all are decides, here or there,
// by hungReplaceable; a follower that cannot replace them restarts the
// job, as the leader would have.
func decideHang(he *watch.HangError, first, nproc, idle int, agentStore bool) (hangAction, string) {
	switch {
	case he.Remote && !allLocal(he.Hang.Missing, first, nproc):
		return hangLeave, ""
	case !he.Remote && he.Node != "":
		return hangDefer, ""
	}
	if ok, why := hungReplaceable(he.Hang.Missing, first, nproc, idle, agentStore); !ok {
		return hangRestart, why
	}
	return hangKill, ""
}

// replaceHung deals with a hang in place when the run keeps spares and
// decideHang says so: the ranks that never arrived are killed (their
// stacks are in the hang's report already), here or, by its own agent, on
// their node; the watch looks for the next hang, and the attempt goes on.
// It reports whether it did; otherwise the hang restarts the job as
// without spares.
func (r *run) replaceHung(at *attempt, f *fault.Fault) bool {
	he, ok := fault.As[*watch.HangError](f)
	if r.cfg.Spares == 0 || !ok {
		return false
	}
	missing := he.Hang.Missing
	act, why := decideHang(he, at.r.RankOffset, r.cfg.NProcPerNode, at.g.Spares(), at.r.AgentStore)
	switch act {
	case hangLeave:
		return true
	case hangRestart:
		r.log.Warn("hang: no warm spare takes the hung ranks, "+why, "ranks", missing)
		return false
	}
	// The notifiers hear of the hang as without spares, from the node
	// that judged it, and of no restart.
	tell := func() { r.tell(event{kind: evFault, at: at, fault: f}) }
	if act == hangDefer {
		r.log.Warn("hang: the ranks that never arrived run on another node, whose agent kills them for its warm spares; the others keep their processes",
			"ranks", missing, "node", he.Node, "step", he.Hang.Step, "bucket", he.Hang.Bucket)
		tell()
		r.watch.HangReplaced()
		r.awaitRemoteSpares(at, he)
		return true
	}
	r.log.Warn("hang: killing the ranks that never arrived, for warm spares to take; the others keep their processes",
		"ranks", missing, "step", he.Hang.Step, "bucket", he.Hang.Bucket)
	for _, rank := range missing {
		if err := at.g.Kill(rank); err != nil {
			r.log.Warn("hang: kill a hung rank", "rank", rank, "err", err)
			return false
		}
	}
	if !he.Remote {
		tell()
	}
	r.watch.HangReplaced()
	return true
}

// allLocal reports whether every rank of ranks runs on this node
// (first..first+nproc-1).
func allLocal(ranks []int, first, nproc int) bool {
	return !slices.ContainsFunc(ranks, func(r int) bool { return r < first || r >= first+nproc })
}

// remoteSpareWait bounds how long a leader that left a hang to another
// node's spares waits for its own workers to report the re-formation.
const remoteSpareWait = time.Minute

// awaitRemoteSpares restarts the job, as for any hang, when the node that
// was left to replace its hung ranks has not done so within
// remoteSpareWait: its agent keeps no spares (each node's --spares is its
// own), or never heard of the hang. Without this the survivors would wait
// in the abandoned collective for good.
func (r *run) awaitRemoteSpares(at *attempt, he *watch.HangError) {
	reformed := r.reformed.next()
	r.goBackground(func() {
		t := time.NewTimer(remoteSpareWait)
		defer t.Stop()
		select {
		case <-reformed:
			return
		case <-at.g.Closed():
			return
		case <-t.C:
		}
		r.log.Warn("hang: the other node did not replace its hung ranks; restarting the job", "ranks", he.Hang.Missing,
			"node", he.Node, "waited", remoteSpareWait)
		r.faults.Report(fault.Hang(&watch.HangError{Hang: he.Hang, Report: he.Report}))
	})
}

// reformSignal tells every waiter of the next report of a re-formation in
// process.
type reformSignal struct {
	mu sync.Mutex
	ch chan struct{}
}

// next returns a channel closed at the next report after this call.
func (s *reformSignal) next() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

func (s *reformSignal) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}
