package rdzv

import (
	"cmp"
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// joinRound puts this node's join key for the open round and waits until
// the round closes. The first node to join leads the round: it decides
// when to close it and writes the members. It returns (nil, nil) when the
// state moved on without making this node a member, for Next to look again.
func (e *Membership) joinRound(ctx context.Context, st *State, rev, read int64, deadline time.Time) (*Round, error) {
	lease, lost := e.leaseChan()
	e.mu.Lock()
	port := cmp.Or(e.offered, e.cfg.MasterPort)
	e.mu.Unlock()
	if port == 0 {
		var err error
		if port, err = freePort(e.cfg.Addr); err != nil {
			return nil, err
		}
	}
	prefix := RoundPrefix(e.cfg.Prefix, st.Generation)
	me := JoinInfo{Node: e.node, Host: e.cfg.Host, Addr: e.cfg.Addr, NProc: e.cfg.NProc, MasterPort: port, AgentStore: e.cfg.AgentStore, Joined: time.Now()}
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	// A plain put: it keeps the join order (the create revision) of a key
	// already there, and moves it to the current lease.
	_, err := e.cli.Put(octx, prefix+e.node, encode(me), clientv3.WithLease(lease))
	cancel()
	if err != nil {
		return nil, fmt.Errorf("rendezvous store at %s: join generation %d: %w", e.cfg.Endpoint, st.Generation, err)
	}
	e.log.Debug("joined round", "generation", st.Generation, "reason", st.Reason)

	for {
		leader, electKey, readRev, err := e.electLeader(ctx, st.Generation, lease, prefix)
		if err != nil {
			return nil, err
		}
		if leader == "" { // our own key is gone: lease lost
			return nil, nil
		}
		if leader == prefix+e.node {
			if err := e.lead(ctx, st, rev, read, deadline, lost); err != nil {
				return nil, err
			}
			return nil, nil
		}
		changed, err := e.follow(ctx, read, electKey, readRev, deadline, lost, st)
		if err != nil {
			return nil, err
		}
		if changed {
			return nil, nil
		}
	}
}

func (e *Membership) countJoined(ctx context.Context, gen uint64) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	resp, err := e.cli.Get(ctx, RoundPrefix(e.cfg.Prefix, gen), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return int(resp.Count), nil
}

// OfferStore makes the next joins offer port for the workers' store (see
// join.Rendezvous); 0 goes back to Config.MasterPort.
func (e *Membership) OfferStore(port int) {
	e.mu.Lock()
	e.offered = port
	e.mu.Unlock()
}
