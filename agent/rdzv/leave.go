package rdzv

import (
	"context"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Succeed records that this node's workers of round r all finished. The
// last member to finish marks the job succeeded. When this agent hosts the
// store it then waits, as torchrun's exit barrier does, until the other
// agents are gone or done, since they still need the store.
func (e *Membership) Succeed(ctx context.Context, r *Round) error {
	e.mu.Lock()
	e.state = NodeSucceeded
	e.mu.Unlock()
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if err := e.putNode(octx, NodeSucceeded, ""); err != nil {
		return err
	}
	doneDir := e.key(doneDir + genKey(r.Generation) + "/")
	// The marker and the count in one transaction: the other nodes stop
	// their store members the moment they see every marker, and a count
	// read after the put (linearizable) then waited out opTimeout for a
	// quorum gone with them (10 s, in a CI run of a 3-node job).
	resp, err := e.cli.Txn(octx).Then(
		clientv3.OpPut(doneDir+e.node, time.Now().Format(time.RFC3339Nano)),
		clientv3.OpGet(doneDir, clientv3.WithPrefix(), clientv3.WithCountOnly())).Commit()
	if err != nil {
		return fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
	}
	done := int(resp.Responses[1].GetResponseRange().Count) >= r.NNodes
	if done {
		// From the round's own state: if the job moved on meanwhile, the
		// compare fails and nothing is marked.
		next := *r.state
		next.Phase = Succeeded
		next.Reason = fmt.Sprintf("all %d nodes' workers finished", r.NNodes)
		next.Since = time.Now()
		mctx, cancel := context.WithTimeout(ctx, markTimeout)
		if _, err := e.swapState(mctx, r.stateMod, &next); err != nil {
			e.log.Warn("mark the job succeeded", "err", err)
		}
		cancel()
	} else {
		// The nodes of a job finish within moments of each other: wait a
		// little for the last, as torchrun's exit barrier does (shorter),
		// so that this agent knows nobody needs the store any more.
		done = e.waitAllDone(ctx, doneDir, r.NNodes, exitBarrier)
	}
	e.mu.Lock()
	e.jobDone = done
	e.mu.Unlock()
	// The store's keeper that saw every other agent leave is the last one
	// out, whether or not it saw their workers finish: a node that
	// finished past exitBarrier saw every node done and stopped its store
	// member without handing it over (done), and handing this one over
	// would wait out its timeout for a quorum gone with that member (5 s
	// in a CI run). Nobody is left to hand it to.
	if e.cfg.keeps() && e.waitOthersGone(ctx, false) {
		e.mu.Lock()
		e.jobDone = true
		e.mu.Unlock()
	}
	return nil
}

// OthersDone waits up to d for every other node of round r to have
// finished its workers (Succeed), and reports whether they all have: the
// job's work is done without this node's.
func (e *Membership) OthersDone(ctx context.Context, r *Round, d time.Duration) bool {
	return e.waitAllDone(ctx, e.key(doneDir+genKey(r.Generation)+"/"), r.NNodes-1, d)
}

// markTimeout bounds the write that marks the job succeeded. The other
// nodes, seeing every node done, stop their store members at once; with
// the store hosted by the agents that can take its quorum before the write
// lands, and the write then waited out etcd's request timeout (6 s after
// the workers succeeded, in a loaded CI run of a 3-node job). The mark
// only matters to a store that outlives the agents (an external etcd),
// which keeps its quorum and answers in milliseconds.
const markTimeout = time.Second

// exitBarrier bounds how long Succeed waits for the other nodes' workers
// to finish too. Past it the agent leaves as a node leaving a running job
// does, handing its store member over.
const exitBarrier = 5 * time.Second

// waitAllDone polls the generation's done markers until n nodes have
// finished, at most d; it reports whether they all have.
func (e *Membership) waitAllDone(ctx context.Context, doneDir string, n int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		// Serializable, as waitOthersGone's: the others stop their store
		// members the moment they see every node done, and a linearizable
		// read would wait for a quorum that left with them.
		gctx, cancel := context.WithTimeout(ctx, opTimeout)
		resp, err := e.cli.Get(gctx, doneDir, clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithSerializable())
		cancel()
		if err != nil {
			return false
		}
		if int(resp.Count) >= n {
			return true
		}
		if time.Now().After(deadline) || !sleep(ctx, 100*time.Millisecond) {
			return false
		}
	}
}

// Succeeded reports whether this node's workers all finished (Succeed ran).
func (e *Membership) Succeeded() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state == NodeSucceeded
}

// JobDone reports whether Succeed saw every node's workers of the last
// generation finish, or (in the store's keeper) every other agent leave:
// the job is over, and the store is needed by no one but the agents
// leaving it, so a replicated store's member need not be handed over
// (handing over concurrently, agents that finish together find each
// other's members orphaned and wait out etcd's timeouts).
func (e *Membership) JobDone() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.jobDone
}

// StoreLost reports whether Next gave up on the store (*StoreLostError):
// nothing is left to hand a store member over to, nor to drain through.
func (e *Membership) StoreLost() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.storeLost
}

// succeededGrace is how long the store's keeper waits, once the job is
// over, for agents whose entries all say they succeeded to leave.
const succeededGrace = 1500 * time.Millisecond

// Drain, in the agent that hosts the store, waits a few seconds for the
// other agents to see that the job is over (failed) and leave, so none of
// them is left waiting on a store that vanished. It returns at once when
// this agent does not host the store or the job is not over.
func (e *Membership) Drain(ctx context.Context) {
	if e.cfg.keeps() && !e.StoreLost() {
		e.waitOthersGone(ctx, true)
	}
}

// waitOthersGone blocks while other agents are registered and the job is
// not over for them, polling twice a second; it returns when ctx is done.
// With onlyIfOver it returns at once unless the job is over. It reports
// whether it saw no other agent registered: this one is the last.
func (e *Membership) waitOthersGone(ctx context.Context, onlyIfOver bool) (alone bool) {
	e.mu.Lock()
	waited := e.waited
	e.mu.Unlock()
	if waited {
		return false
	}
	defer func() {
		e.mu.Lock()
		e.waited = true
		e.mu.Unlock()
	}()
	logged := false
	var overSince time.Time
	for {
		gctx, cancel := context.WithTimeout(ctx, opTimeout)
		// Serializable: once the job is over the others close their store
		// members without handing them over, and a linearizable read would
		// wait for a quorum that is gone; this member's own view will do.
		resp, err := e.cli.Txn(gctx).Then(clientv3.OpGet(e.key(nodesDir), clientv3.WithPrefix(), clientv3.WithSerializable()),
			clientv3.OpGet(e.key(stateKey), clientv3.WithSerializable())).Commit()
		cancel()
		if err != nil {
			return false
		}
		// Once the job is over, the others only need a moment to see it
		// and leave; do not wait on one that is stuck.
		var st State
		marked, known := false, false // marked: the store says the job is over
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 && decode("", kvs[0].Value, &st) == nil {
			marked, known = st.Phase == Succeeded || st.Phase == Failed, true
		}
		// Every node's workers finished (Succeed saw them), whether or not
		// the mark saying so landed: it waits at most markTimeout, and the
		// others, stopping their store members, can take its quorum first.
		// Taken as not over, the wait had no bound but the member list's
		// read timeout (10 s, in a CI run of a 3-node job).
		over := marked || e.JobDone()
		// Spares need nothing from the store once the members are done.
		// Once the store says the job is over every registered node counts,
		// spares too, as they need it to learn that; unmarked, they cannot
		// learn it, and an active spare would hold this agent for 10 s.
		isMember := map[string]bool{}
		if known && !marked {
			ms, _ := e.members(ctx, &st, clientv3.WithSerializable()) // as the read above
			for _, m := range ms {
				isMember[m.Node] = true
			}
		}
		var others []string // the other agents' nodes, named in the log
		active, spares := 0, 0
		for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
			node := strings.TrimPrefix(string(kv.Key), e.key(nodesDir))
			// An agent's entry lives on its lease; one without a lease
			// (written by hand, or garbage) is no agent and never leaves.
			if kv.Lease == 0 || node == e.node {
				continue
			}
			if known && !marked && !isMember[node] {
				spares++ // waited for by no one, but it may hold a store member
				continue
			}
			others = append(others, node)
			var n NodeInfo
			if decode(string(kv.Key), kv.Value, &n) != nil || n.State == NodeActive {
				active++
			}
		}
		if len(others) == 0 {
			return spares == 0 // a spare agent may still hold a store member
		}
		if onlyIfOver && !over {
			return false
		}
		if over {
			// Agents that all said they succeeded need the store only a
			// moment more; when two of three close their members at once
			// the store loses its quorum, the last one's lease never ends,
			// and this agent waited the whole 10 s for it.
			limit := 10 * time.Second
			if active == 0 {
				limit = succeededGrace
			}
			if overSince.IsZero() {
				overSince = time.Now()
			} else if time.Since(overSince) > limit {
				e.log.Warn("leaving although other agents are still registered", "others", len(others), "active", active,
					"nodes", others)
				return false
			}
		}
		if !logged {
			e.log.Info("waiting for the other agents to finish: this agent hosts the rendezvous store", "others", len(others))
			logged = true
		}
		if !sleep(ctx, 500*time.Millisecond) {
			return false
		}
	}
}

// Leave takes this node out of the job without closing the rendezvous for
// the others: it says why, then revokes its lease. The others re-form
// without it (a scale event, not a fault). To a store given up as lost it
// says nothing: without a quorum the write waited its whole 3 s, and the
// agent's exit with it.
func (e *Membership) Leave(reason string) {
	e.mu.Lock()
	st := e.state
	if st == NodeActive {
		e.state = NodeLeft
	}
	l := e.lease
	lost := e.storeLost
	e.mu.Unlock()
	if lost {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if st == NodeActive {
		if err := e.putNode(ctx, NodeLeft, reason); err != nil {
			e.log.Debug("mark node left", "err", err)
		}
	}
	if l != nil {
		if _, err := e.cli.Revoke(ctx, l.Lease()); err != nil {
			e.log.Debug("revoke lease", "err", err)
		} else {
			l.revoked.Store(true)
		}
	}
}
