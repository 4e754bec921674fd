package rdzv

import (
	"context"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// register puts this node's entry on a fresh lease and keeps it alive.
func (e *Etcd) register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	ttl := int64((e.cfg.TTL + time.Second - 1) / time.Second)
	g, err := e.cli.Grant(ctx, max(ttl, 1))
	if err != nil {
		return fmt.Errorf("rendezvous store at %s: grant lease: %w", e.cfg.Endpoint, err)
	}
	// The node key goes in first: a lease that is kept alive without its
	// node key would make a node nobody can see die.
	if err := e.putNodeOn(ctx, g.ID, NodeActive, ""); err != nil {
		revokeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, _ = e.cli.Revoke(revokeCtx, g.ID)
		cancel()
		return err
	}
	kaCtx, stopKA := context.WithCancel(context.Background())
	ka, err := e.cli.KeepAlive(kaCtx, g.ID)
	if err != nil {
		stopKA()
		return fmt.Errorf("rendezvous store at %s: keep lease alive: %w", e.cfg.Endpoint, err)
	}
	lost := make(chan struct{})
	e.mu.Lock()
	if e.stopKA != nil {
		e.stopKA()
	}
	e.lease, e.leaseLost, e.stopKA = g.ID, lost, stopKA
	e.mu.Unlock()
	go func() {
		for range ka { // the client closes ka when the lease expires or cannot be renewed in time
		}
		close(lost)
		e.mu.Lock()
		leaving := e.state != NodeActive
		e.mu.Unlock()
		if kaCtx.Err() == nil && !leaving {
			e.log.Warn("lost this node's lease on the rendezvous store", "store", e.cfg.Endpoint, "lease", fmt.Sprintf("%x", int64(g.ID)))
		}
	}()
	return nil
}

// markLeaseLost makes the current lease count as lost, for when the store
// says it no longer exists before the keep-alive loop noticed.
func (e *Etcd) markLeaseLost() {
	e.mu.Lock()
	stop := e.stopKA
	e.mu.Unlock()
	if stop != nil {
		stop() // ends the keep-alive loop, which closes leaseLost
	}
}

// leaseChan returns the channel closed when the current lease is lost.
func (e *Etcd) leaseChan() (clientv3.LeaseID, <-chan struct{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lease, e.leaseLost
}

// ensureLease registers again after the lease was lost (store restarted,
// node cut off for longer than the TTL): same node id, new lease.
func (e *Etcd) ensureLease(ctx context.Context) error {
	_, lost := e.leaseChan()
	select {
	case <-lost:
	default:
		return nil
	}
	e.log.Info("registering again with the rendezvous store", "store", e.cfg.Endpoint)
	return e.register(ctx)
}

func (e *Etcd) putNode(ctx context.Context, st NodeState, reason string) error {
	lease, _ := e.leaseChan()
	return e.putNodeOn(ctx, lease, st, reason)
}

func (e *Etcd) putNodeOn(ctx context.Context, lease clientv3.LeaseID, st NodeState, reason string) error {
	info := NodeInfo{Node: e.node, Host: e.cfg.Host, Addr: e.cfg.Addr, PID: os.Getpid(), NProc: e.cfg.NProc,
		Lease: int64(lease), Probe: e.probe.Addr().String(), State: st, Reason: reason, Started: time.Now(), GPUs: e.cfg.GPUs}
	_, err := e.cli.Put(ctx, e.key(nodesDir+e.node), encode(info), clientv3.WithLease(lease))
	if err != nil {
		return fmt.Errorf("rendezvous store at %s: register node: %w", e.cfg.Endpoint, err)
	}
	return nil
}
