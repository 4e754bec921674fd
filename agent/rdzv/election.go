package rdzv

import (
	"context"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// electLeader makes this node the round's leader if the round has none
// yet: the leader is whoever first creates leaders/<gen>, on its lease, so
// it goes when the leader does. One request per joiner, whatever the size
// of the round. It returns the leader's join key ("" when this node's own
// join key is gone: its lease was lost), the election key, and the
// revision read.
func (e *Membership) electLeader(ctx context.Context, gen uint64, lease clientv3.LeaseID, prefix string) (string, string, int64, error) {
	key := e.key(leadersDir + genKey(gen))
	me := prefix + e.node
	for {
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		txn, err := e.cli.Txn(octx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0), clientv3.Compare(clientv3.CreateRevision(me), ">", 0)).
			Then(clientv3.OpPut(key, me, clientv3.WithLease(lease))).
			Else(clientv3.OpGet(key), clientv3.OpGet(me, clientv3.WithKeysOnly())).Commit()
		cancel()
		if err != nil {
			return "", "", 0, fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
		}
		if txn.Succeeded {
			return me, key, txn.Header.Revision, nil
		}
		if len(txn.Responses[1].GetResponseRange().Kvs) == 0 {
			return "", key, txn.Header.Revision, nil
		}
		kvs := txn.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue // the leader left between the compare and the read
		}
		if leader := string(kvs[0].Value); strings.HasPrefix(leader, prefix) && len(leader) > len(prefix) {
			return leader, key, txn.Header.Revision, nil
		}
		// Not a join key of this round: someone else wrote it. Clear it
		// (only if unchanged) and elect again, or the round has no leader.
		e.log.Warn("removing a malformed round leader entry", "key", key)
		octx, cancel = context.WithTimeout(ctx, opTimeout)
		_, err = e.cli.Txn(octx).If(clientv3.Compare(clientv3.ModRevision(key), "=", kvs[0].ModRevision)).Then(clientv3.OpDelete(key)).Commit()
		cancel()
		if err != nil {
			return "", "", 0, fmt.Errorf("rendezvous store at %s: %w", e.cfg.Endpoint, err)
		}
	}
}

// follow waits for the state to change, or for the leader's election key
// to vanish with its lease (then another joiner leads). It reports whether the
// state changed.
func (e *Membership) follow(ctx context.Context, stateRev int64, leaderKey string, rev int64, deadline time.Time, lost <-chan struct{}, st *State) (bool, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sw := e.cli.Watch(clientv3.WithRequireLeader(wctx), e.key(stateKey), clientv3.WithRev(stateRev+1))
	lw := e.cli.Watch(clientv3.WithRequireLeader(wctx), leaderKey, clientv3.WithRev(rev+1))
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	for {
		select {
		case <-sw:
			return true, nil
		case resp, ok := <-lw:
			if !ok || resp.Canceled || resp.Err() != nil {
				return false, nil
			}
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete {
					return false, nil
				}
			}
		case <-lost:
			return true, nil
		case <-timeout.C:
			n, _ := e.countJoined(ctx, st.Generation)
			return false, &JoinTimeoutError{Joined: n, Min: e.cfg.NNodesMin, Timeout: e.cfg.JoinTimeout, Generation: st.Generation}
		case <-ctx.Done():
			return false, context.Cause(ctx)
		}
	}
}
