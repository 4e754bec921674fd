package rdzv

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// liveNode is a node entry as the leader tracks it.
type liveNode struct {
	NodeInfo
	probed time.Time
}

// roundTracker is the leader's picture of its open round, kept up to date
// from the watches of the join keys and the node entries.
type roundTracker struct {
	log         *slog.Logger
	prefix      string               // the round's join keys
	nodesPrefix string               // the node entries
	joiners     map[string]joiner    // by join key
	nodes       map[string]*liveNode // by node key
}

func (t *roundTracker) addJoiner(key string, value []byte, createRev int64) {
	var j JoinInfo
	if err := decode(key, value, &j); err != nil || j.NProc < 1 || key != t.prefix+j.Node {
		t.log.Warn("ignoring a malformed join entry", "key", key, "err", err)
		return
	}
	t.joiners[key] = joiner{JoinInfo: j, rev: createRev}
}

func (t *roundTracker) addNode(key string, value []byte) {
	var n NodeInfo
	if err := decode(key, value, &n); err != nil || n.Node == "" {
		t.log.Warn("ignoring a malformed node entry", "key", key, "err", err)
		return
	}
	t.nodes[key] = &liveNode{NodeInfo: n}
}

// applyJoins applies a watch response of the join keys; false when the
// watch broke.
func (t *roundTracker) applyJoins(resp clientv3.WatchResponse, ok bool) bool {
	if !ok || resp.Canceled || resp.Err() != nil {
		return false
	}
	for _, ev := range resp.Events {
		k := string(ev.Kv.Key)
		if ev.Type == clientv3.EventTypeDelete {
			delete(t.joiners, k)
		} else {
			t.addJoiner(k, ev.Kv.Value, ev.Kv.CreateRevision)
		}
	}
	return true
}

// applyNodes applies a watch response of the node entries; false when the
// watch broke.
func (t *roundTracker) applyNodes(resp clientv3.WatchResponse, ok bool) bool {
	if !ok || resp.Canceled || resp.Err() != nil {
		return false
	}
	for _, ev := range resp.Events {
		k := string(ev.Kv.Key)
		if ev.Type == clientv3.EventTypeDelete {
			delete(t.nodes, k)
		} else {
			t.addNode(k, ev.Kv.Value)
		}
	}
	return true
}

// view is the tracker's picture as decideClose takes it; live[i] is the
// tracked entry of view.Live[i].
func (t *roundTracker) view() (v roundView, live []*liveNode) {
	for _, j := range t.joiners {
		v.Joiners = append(v.Joiners, j.JoinInfo)
	}
	for _, ln := range t.nodes {
		v.Live = append(v.Live, ln.NodeInfo)
		live = append(live, ln)
	}
	return v, live
}

func (t *roundTracker) joinerList() []joiner {
	list := make([]joiner, 0, len(t.joiners))
	for _, j := range t.joiners {
		list = append(list, j)
	}
	return list
}

// trackRound reads the round's join keys and the node entries in one
// revision, which it returns for the watches to start after.
func (e *Membership) trackRound(ctx context.Context, gen uint64) (*roundTracker, int64, error) {
	t := &roundTracker{log: e.log, prefix: RoundPrefix(e.cfg.Prefix, gen), nodesPrefix: e.key(nodesDir),
		joiners: map[string]joiner{}, nodes: map[string]*liveNode{}}
	gctx, cancel := context.WithTimeout(ctx, opTimeout)
	resp, err := e.cli.Txn(gctx).Then(clientv3.OpGet(t.prefix, clientv3.WithPrefix()), clientv3.OpGet(t.nodesPrefix, clientv3.WithPrefix())).Commit()
	cancel()
	if err != nil {
		return nil, 0, fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
	}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		t.addJoiner(string(kv.Key), kv.Value, kv.CreateRevision)
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		t.addNode(string(kv.Key), kv.Value)
	}
	return t, resp.Header.Revision, nil
}

// waitingSaid is Config.WaitingSaid's default: how often a round's
// leader says, while fewer than MIN nodes joined, how many did.
const waitingSaid = 30 * time.Second

// lead runs the round as its leader until the state moves on: it tracks
// the joiners and the live nodes through watches, probes nodes that are
// registered but do not join, and closes the round when decideClose says
// so. It returns nil when the state moved on or a watch broke, for Next to
// look again.
func (e *Membership) lead(ctx context.Context, st *State, stateRev, stateRead int64, deadline time.Time, lost <-chan struct{}) error {
	t, rev, err := e.trackRound(ctx, st.Generation)
	if err != nil {
		return err
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	sw := e.cli.Watch(clientv3.WithRequireLeader(wctx), e.key(stateKey), clientv3.WithRev(stateRead+1))
	jw := e.cli.Watch(clientv3.WithRequireLeader(wctx), t.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	nw := e.cli.Watch(clientv3.WithRequireLeader(wctx), t.nodesPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	prev, err := e.members(ctx, st)
	if err != nil {
		return err
	}
	rule := closeRule{Min: e.cfg.NNodesMin, Max: e.cfg.NNodesMax, LastCall: e.cfg.LastCall}
	var minSince time.Time
	said := time.Now()
	for {
		v, live := t.view()
		v.Reformation, v.MinSince, v.Now, v.Deadline = len(prev) > 0, minSince, time.Now(), deadline
		d := decideClose(v, rule)
		minSince = d.Since
		switch d.Action {
		case closeNow:
			return e.closeRound(ctx, st, stateRev, prev, t.joinerList(), d.Why)
		case joinTimedOut:
			return &JoinTimeoutError{Joined: d.Joined, Min: e.cfg.NNodesMin, Timeout: e.cfg.JoinTimeout, Generation: st.Generation}
		}
		if d.Joined < rule.Min && v.Now.Sub(said) >= cmp.Or(e.cfg.WaitingSaid, waitingSaid) {
			// Else a job whose other nodes never come (an endpoint mistyped,
			// so that each agent hosts a store of its own) said nothing
			// until the join timeout, 10 minutes by default.
			said = v.Now
			e.log.Info("waiting for nodes", "generation", st.Generation, "joined", d.Joined, "needed", rule.Min,
				"store", e.cfg.Endpoint, "timeout_in", deadline.Sub(v.Now).Round(time.Second))
		}
		pending := make([]*liveNode, len(d.Awaited))
		for i, k := range d.Awaited {
			pending[i] = live[k]
		}
		e.probePending(ctx, pending)

		select {
		case <-sw:
			return nil // the state moved on
		case resp, ok := <-jw:
			if !t.applyJoins(resp, ok) {
				return nil // let Next start over with fresh watches
			}
		case resp, ok := <-nw:
			if !t.applyNodes(resp, ok) {
				return nil
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
func (e *Membership) closeRound(ctx context.Context, st *State, stateRev int64, prev []Member, joiners []joiner, why string) error {
	members, master, plain := closedRound(prev, joiners, e.cfg.NNodesMax)
	gen := genKey(st.Generation)
	// Keyed by the closer too: should two leaders close the same round,
	// the loser's keys cannot overwrite the winner's.
	next := runningState(*st, members, master, plain, e.key(membersDir+gen+"/"+e.node), e.key(assignDir+gen+"/"+e.node+"/"), time.Now())
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
