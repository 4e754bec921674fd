package rdzv

import (
	"context"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// leaseLost ends r because this node lost its lease.
func (e *Membership) leaseLost(r *Round) {
	r.finish(RoundEnd{Kind: EndLeaseLost, Node: e.node},
		"this node lost its lease on the rendezvous store (cut off or stalled for longer than the lease TTL)")
}

// watchRound ends r when the job leaves its generation, and moves the job
// on when another member is lost. It watches from revision from; whenever
// a watch breaks (a compacted revision, a lost leader) it reads the state
// and the members afresh and watches from there, since events missed in
// between will not come back.
func (e *Membership) watchRound(ctx context.Context, r *Round, from int64, lost <-chan struct{}) {
	members := map[string]Member{}
	for _, m := range r.state.Members {
		members[m.Node] = m
	}
	// Group rank 0 checks the members once at the start: one lost just
	// before the round closed left no event after it. (Every member doing
	// so would cost a read of all nodes per node: too much at 1000 nodes.)
	check := r.GroupRank == 0
	resync := false
	// A lost lease ends the round at once, even while a look at the store
	// (which a dead store answers only at its timeout) is under way.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-lost:
			// End the round before cancelling: a cancelled look returns
			// without ending it.
			e.leaseLost(r)
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		if (check || resync) && len(members) < r.NNodes {
			// the whole list, only for this look: a member reads just its
			// own assignment otherwise
			if ms, err := e.members(ctx, r.state); err == nil {
				for _, m := range ms {
					members[m.Node] = m
				}
			}
		}
		if check || resync {
			rev, over := e.resyncRound(ctx, r, members, check || resync)
			select {
			case <-lost:
				e.leaseLost(r)
				return
			default:
			}
			if over {
				return
			}
			if rev > 0 {
				from = rev
			}
			check = false
		}
		broken := e.followRound(ctx, r, from, members, lost)
		if !broken || !sleep(ctx, 200*time.Millisecond) {
			return
		}
		resync = true
	}
}

// resyncRound reads the state and the node keys in one revision: it ends r
// when the state moved on, bumps for members that are gone, and returns
// the revision read (0 after a store error).
func (e *Membership) resyncRound(ctx context.Context, r *Round, members map[string]Member, checkMembers bool) (rev int64, over bool) {
	gctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	ops := []clientv3.Op{clientv3.OpGet(e.key(stateKey))}
	if checkMembers {
		ops = append(ops, clientv3.OpGet(e.key(nodesDir), clientv3.WithPrefix(), clientv3.WithKeysOnly()))
	}
	resp, err := e.cli.Txn(gctx).Then(ops...).Commit()
	if err != nil {
		return 0, ctx.Err() != nil
	}
	var st State
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 || decode(e.key(stateKey), kvs[0].Value, &st) != nil {
		r.finish(RoundEnd{Kind: EndStateLost}, "the rendezvous state was deleted or overwritten")
		return 0, true
	}
	if roundOver(st, r.Generation) {
		r.finish(st.End, st.Reason)
		return 0, true
	}
	if checkMembers {
		live := map[string]bool{}
		for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
			live[strings.TrimPrefix(string(kv.Key), e.key(nodesDir))] = true
		}
		if missing := absentMembers(members, live, e.node); len(missing) > 0 {
			go func() {
				// One that succeeded moves nothing: look on to the next.
				for _, m := range missing {
					if d := e.departure(ctx, r, m); d.Moves {
						e.bumpUntilMoved(ctx, r, d.move)
						return
					}
				}
			}()
		}
	}
	return resp.Header.Revision, false
}

// followRound follows the watches of r's state and nodes from revision
// from. It returns true when a watch broke and the caller must resync,
// false when r is over.
func (e *Membership) followRound(ctx context.Context, r *Round, from int64, members map[string]Member, lost <-chan struct{}) bool {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sw := e.cli.Watch(clientv3.WithRequireLeader(wctx), e.key(stateKey), clientv3.WithRev(from+1))
	nw := e.cli.Watch(clientv3.WithRequireLeader(wctx), e.key(nodesDir), clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithRev(from+1))
	for {
		select {
		case <-r.done:
			return false
		case <-ctx.Done():
			return false
		case <-lost:
			e.leaseLost(r)
			return false
		case resp, ok := <-sw:
			if !ok || resp.Canceled || resp.Err() != nil {
				return ctx.Err() == nil
			}
			for _, ev := range resp.Events {
				var st State
				if ev.Type == clientv3.EventTypeDelete || decode(string(ev.Kv.Key), ev.Kv.Value, &st) != nil {
					r.finish(RoundEnd{Kind: EndStateLost}, "the rendezvous state was deleted or overwritten")
					return false
				}
				if roundOver(st, r.Generation) {
					r.finish(st.End, st.Reason)
					return false
				}
			}
		case resp, ok := <-nw:
			if !ok || resp.Canceled || resp.Err() != nil {
				return ctx.Err() == nil
			}
			for _, ev := range resp.Events {
				if ev.Type != clientv3.EventTypeDelete {
					continue
				}
				node := strings.TrimPrefix(string(ev.Kv.Key), e.key(nodesDir))
				m, ok := members[node]
				if !ok && len(members) < r.NNodes && node != e.node {
					// not in the list this node holds: ask for its assignment
					m, ok, _ = e.assignment(ctx, r.state, node)
				}
				if !ok || m.Node == e.node {
					continue
				}
				if d := departureOf(m, lastEntry(ev)); d.Moves {
					go e.bumpUntilMoved(ctx, r, d.move)
				}
			}
		}
	}
}

// departure says how member m, whose node entry is already gone when the
// round is first checked, went (see departureOf): a node that left or
// succeeded marked its entry so before its lease was revoked, and the
// store's history since the round started still has that last value.
// Without the history (compacted, or no delete found in time) the node
// counts as lost.
func (e *Membership) departure(ctx context.Context, r *Round, m Member) departure {
	return e.departedSince(ctx, r.stateMod, m)
}

// departedSince is how member m left after revision rev (the state that
// made it a member): from the last value of its entry, which its delete
// event carries when the history since rev is still there; lost
// otherwise.
func (e *Membership) departedSince(ctx context.Context, rev int64, m Member) departure {
	wctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	key := e.key(nodesDir) + m.Node
	for resp := range e.cli.Watch(wctx, key, clientv3.WithRev(rev+1), clientv3.WithPrevKV()) {
		if resp.Err() != nil || resp.Canceled {
			break
		}
		for _, ev := range resp.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return departureOf(m, lastEntry(ev))
			}
		}
	}
	return departureOf(m, NodeInfo{})
}

// lastEntry is the node entry a delete event removed, as far as it parses;
// the zero NodeInfo when the event does not carry it.
func lastEntry(ev *clientv3.Event) NodeInfo {
	var prev NodeInfo
	if ev.PrevKv != nil {
		_ = decode(string(ev.Kv.Key), ev.PrevKv.Value, &prev)
	}
	return prev
}
