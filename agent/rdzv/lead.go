package rdzv

import (
	"context"
	"fmt"
	"sort"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// liveNode is a node entry as the leader tracks it.
type liveNode struct {
	NodeInfo
	probed time.Time
}

// lead runs the round as its leader until the state moves on: it tracks
// the joiners and the live nodes through watches, probes nodes that are
// registered but do not join, and closes the round when
//   - NNodesMax nodes joined; or
//   - at least NNodesMin joined and the last-call window passed since then; or
//   - at least NNodesMin joined, the job ran before, and every live node
//     joined: a re-formation after a fault waits for no one else.
func (e *Etcd) lead(ctx context.Context, st *State, stateRev, stateRead int64, deadline time.Time, lost <-chan struct{}) error {
	prefix := RoundPrefix(e.cfg.Prefix, st.Generation)
	nodesPrefix := e.key(nodesDir)
	gctx, cancel := context.WithTimeout(ctx, opTimeout)
	resp, err := e.cli.Txn(gctx).Then(clientv3.OpGet(prefix, clientv3.WithPrefix()), clientv3.OpGet(nodesPrefix, clientv3.WithPrefix())).Commit()
	cancel()
	if err != nil {
		return fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
	}
	rev := resp.Header.Revision
	joiners := map[string]joiner{}
	nodes := map[string]*liveNode{}
	addJoiner := func(key string, value []byte, createRev int64) {
		var j JoinInfo
		if err := decode(key, value, &j); err != nil || j.NProc < 1 || key != prefix+j.Node {
			e.log.Warn("ignoring a malformed join entry", "key", key, "err", err)
			return
		}
		joiners[key] = joiner{JoinInfo: j, rev: createRev}
	}
	addNode := func(key string, value []byte) {
		var n NodeInfo
		if err := decode(key, value, &n); err != nil || n.Node == "" {
			e.log.Warn("ignoring a malformed node entry", "key", key, "err", err)
			return
		}
		nodes[key] = &liveNode{NodeInfo: n}
	}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		addJoiner(string(kv.Key), kv.Value, kv.CreateRevision)
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		addNode(string(kv.Key), kv.Value)
	}

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	sw := e.cli.Watch(clientv3.WithRequireLeader(wctx), e.key(stateKey), clientv3.WithRev(stateRead+1))
	jw := e.cli.Watch(clientv3.WithRequireLeader(wctx), prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	nw := e.cli.Watch(clientv3.WithRequireLeader(wctx), nodesPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var minSince time.Time
	prev, err := e.members(ctx, st)
	if err != nil {
		return err
	}
	reformation := len(prev) > 0
	for {
		n := len(joiners)
		if n >= e.cfg.NNodesMin && minSince.IsZero() {
			minSince = time.Now()
		}
		if n < e.cfg.NNodesMin {
			minSince = time.Time{}
		}
		allLive := true
		joined := map[string]bool{}
		for _, j := range joiners {
			joined[j.Node] = true
		}
		var pending []*liveNode
		for _, ln := range nodes {
			if ln.State == NodeActive && !joined[ln.Node] {
				allLive = false
				pending = append(pending, ln)
			}
		}
		closeNow := ""
		switch {
		case n >= e.cfg.NNodesMax:
			closeNow = "all nodes joined"
		case n >= e.cfg.NNodesMin && reformation && allLive:
			closeNow = "every live node joined"
		case n >= e.cfg.NNodesMin && time.Since(minSince) >= e.cfg.LastCall:
			closeNow = "last call ended"
		}
		if closeNow != "" {
			return e.closeRound(ctx, st, stateRev, prev, joiners, closeNow)
		}
		if time.Now().After(deadline) {
			return &JoinTimeoutError{Joined: n, Min: e.cfg.NNodesMin, Timeout: e.cfg.JoinTimeout, Generation: st.Generation}
		}
		e.probePending(ctx, pending)

		select {
		case <-sw:
			return nil // the state moved on
		case resp, ok := <-jw:
			if !ok || resp.Canceled || resp.Err() != nil {
				return nil // let Next start over with fresh watches
			}
			for _, ev := range resp.Events {
				k := string(ev.Kv.Key)
				if ev.Type == clientv3.EventTypeDelete {
					delete(joiners, k)
				} else {
					addJoiner(k, ev.Kv.Value, ev.Kv.CreateRevision)
				}
			}
		case resp, ok := <-nw:
			if !ok || resp.Canceled || resp.Err() != nil {
				return nil
			}
			for _, ev := range resp.Events {
				k := string(ev.Kv.Key)
				if ev.Type == clientv3.EventTypeDelete {
					delete(nodes, k)
				} else {
					addNode(k, ev.Kv.Value)
				}
			}
		case <-tick.C:
		case <-lost:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// closeRound writes the members of the round, if the state is still the
// one the round opened with.
func (e *Etcd) closeRound(ctx context.Context, st *State, stateRev int64, prev []Member, joiners map[string]joiner, why string) error {
	list := make([]joiner, 0, len(joiners))
	for _, j := range joiners {
		list = append(list, j)
	}
	sort.Slice(list, func(a, b int) bool { return list[a].rev < list[b].rev })
	members := assign(prev, list, e.cfg.NNodesMax)
	port := 0
	for _, j := range list {
		if j.Node == members[0].Node {
			port = j.MasterPort
		}
	}
	gen := genKey(st.Generation)
	next := *st
	next.Phase = Running
	next.Since = time.Now()
	next.Members = nil
	next.NNodes = len(members)
	// Keyed by the closer too: should two leaders close the same round,
	// the loser's keys cannot overwrite the winner's.
	next.MembersKey = e.key(membersDir + gen + "/" + e.node)
	next.AssignPrefix = e.key(assignDir + gen + "/" + e.node + "/")
	next.WorldSize = members[len(members)-1].RankOffset + members[len(members)-1].NProc
	next.MasterAddr = members[0].Addr
	next.MasterPort = port
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	// The member keys go first, in batches that fit etcd's default limit
	// of 128 operations per transaction; the state that points at them
	// comes last, so whoever sees the round closed finds them.
	ops := []clientv3.Op{clientv3.OpPut(next.MembersKey, encode(members))}
	for _, m := range members {
		ops = append(ops, clientv3.OpPut(next.AssignPrefix+m.Node, encode(m)))
	}
	for len(ops) > 0 {
		n := min(len(ops), 100)
		if _, err := e.cli.Txn(ctx).Then(ops[:n]...).Commit(); err != nil {
			return fmt.Errorf("rendezvous store at %s: close round %d: %w", e.cfg.Endpoint, st.Generation, err)
		}
		ops = ops[n:]
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(e.key(stateKey)), "=", stateRev)}
	// Every member must still be registered as the round closes: a member
	// lost just before would otherwise be written in and never missed.
	// etcd bounds the compares of one transaction (128 by default), so
	// large rounds rely on watchRound's first look at the members instead.
	if len(members) <= 100 {
		for _, m := range members {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(e.key(nodesDir+m.Node)), ">", 0))
		}
	}
	txn, err := e.cli.Txn(ctx).
		If(cmps...).
		Then(clientv3.OpPut(e.key(stateKey), encode(next)),
			// earlier rounds' join and done keys are no use to anyone now
			clientv3.OpDelete(e.key(roundsDir), clientv3.WithRange(RoundPrefix(e.cfg.Prefix, st.Generation))),
			clientv3.OpDelete(e.key(doneDir), clientv3.WithRange(e.key(doneDir+gen+"/"))),
			clientv3.OpDelete(e.key(leadersDir), clientv3.WithRange(e.key(leadersDir+gen))),
			// and so are the member keys of rounds before the last
			clientv3.OpDelete(e.key(membersDir), clientv3.WithRange(e.key(membersDir+gen))),
			clientv3.OpDelete(e.key(assignDir), clientv3.WithRange(e.key(assignDir+gen)))).
		Commit()
	if err != nil {
		return fmt.Errorf("rendezvous store at %s: close round %d: %w", e.cfg.Endpoint, st.Generation, err)
	}
	if txn.Succeeded {
		e.log.Info("rendezvous round closed", "generation", st.Generation, "nodes", len(members), "world_size", next.WorldSize,
			"why", why, "took", time.Since(st.Since).Round(time.Millisecond))
	}
	return nil
}
