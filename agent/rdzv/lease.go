package rdzv

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// nodeLease is one lease of this node: its node entry, its join keys, its
// round leadership and its stall reports live on it, so they all vanish
// when the agent dies or is cut off for longer than the TTL.
// store.KeepAlive keeps it alive (etcd's own keep-alive stream stayed on a
// frozen member: store/keepalive.go) and closes done when it is lost.
type nodeLease struct {
	id   clientv3.LeaseID
	done <-chan struct{}
	stop context.CancelFunc
	// ended: this agent stopped the keep-alives itself (Close, or the
	// store said the lease is gone), so the loss is no news to warn about.
	ended atomic.Bool
	// revoked: Leave revoked it; Close's second revoke only drew a
	// "lease not found" warning from the store's log.
	revoked atomic.Bool
}

// Lease is the lease's id.
func (l *nodeLease) Lease() clientv3.LeaseID { return l.id }

// Done is closed when the lease is lost or no longer kept alive.
func (l *nodeLease) Done() <-chan struct{} { return l.done }

// end stops keeping l alive, which closes its Done channel; the lease
// itself lives out its TTL.
func (l *nodeLease) end() {
	l.ended.Store(true)
	l.stop()
}

// register puts this node's entry on a fresh lease and keeps it alive.
//
// It grants the lease itself and keeps it alive only once the node key is
// on it (WithLease): the node key goes in first, because a lease kept
// alive without its node key would make a node nobody can see die; if the
// put fails, the lease is revoked and never kept alive.
func (e *Membership) register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	ttl := max(int64((e.cfg.TTL+time.Second-1)/time.Second), 1)
	g, err := e.cli.Grant(ctx, ttl)
	if err != nil {
		return fmt.Errorf("rendezvous store at %s: grant lease: %w", e.cfg.Endpoint, err)
	}
	if err := e.putNodeOn(ctx, g.ID, NodeActive, ""); err != nil {
		revokeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_, _ = e.cli.Revoke(revokeCtx, g.ID)
		cancel()
		return err
	}
	// The keep-alives last until Close (e.bg) or end, not just this call.
	kctx, stop := context.WithCancel(e.bg)
	l := &nodeLease{id: g.ID, stop: stop,
		done: store.KeepAlive(kctx, e.cli, g.ID, time.Duration(ttl)*time.Second)}
	e.mu.Lock()
	old := e.lease
	e.lease = l
	e.mu.Unlock()
	if old != nil {
		old.end()
	}
	go func() {
		// The client ends the keep-alives when the lease expires or cannot
		// be renewed in time.
		<-l.Done()
		e.mu.Lock()
		leaving := e.state != NodeActive
		e.mu.Unlock()
		if !l.ended.Load() && e.bg.Err() == nil && !leaving {
			e.log.Warn("lost this node's lease on the rendezvous store", "store", e.cfg.Endpoint, "lease", fmt.Sprintf("%x", int64(g.ID)))
		}
	}()
	return nil
}

// markLeaseLost makes the current lease count as lost, for when the store
// says it no longer exists before the keep-alive loop noticed.
func (e *Membership) markLeaseLost() {
	e.mu.Lock()
	l := e.lease
	e.mu.Unlock()
	if l != nil {
		l.end()
	}
}

// leaseChan returns the current lease and the channel closed when it is
// lost (0 and nil before the first register).
func (e *Membership) leaseChan() (clientv3.LeaseID, <-chan struct{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lease == nil {
		return clientv3.NoLease, nil
	}
	return e.lease.Lease(), e.lease.Done()
}

// ensureLease registers again after the lease was lost (store restarted,
// node cut off for longer than the TTL): same node id, new lease.
func (e *Membership) ensureLease(ctx context.Context) error {
	_, lost := e.leaseChan()
	select {
	case <-lost:
	default:
		return nil
	}
	e.log.Info("registering again with the rendezvous store", "store", e.cfg.Endpoint)
	return e.register(ctx)
}

// putNode rewrites this node's entry on the current lease.
func (e *Membership) putNode(ctx context.Context, st NodeState, reason string) error {
	lease, _ := e.leaseChan()
	return e.putNodeOn(ctx, lease, st, reason)
}

// putNodeOn writes this node's entry on lease.
func (e *Membership) putNodeOn(ctx context.Context, lease clientv3.LeaseID, st NodeState, reason string) error {
	info := NodeInfo{Node: e.node, Host: e.cfg.Host, Addr: e.cfg.Addr, PID: os.Getpid(), NProc: e.cfg.NProc,
		Lease: int64(lease), Probe: e.probe.Addr().String(), State: st, Reason: reason, Started: time.Now(), GPUs: e.cfg.GPUs}
	_, err := e.cli.Put(ctx, e.key(nodesDir+e.node), encode(info), clientv3.WithLease(lease))
	if err != nil {
		return fmt.Errorf("rendezvous store at %s: register node: %w", e.cfg.Endpoint, err)
	}
	return nil
}
