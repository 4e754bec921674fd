package rdzv

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// serveProbe accepts and closes connections: while the agent lives its
// probe port accepts; once the process is gone the kernel refuses, which
// tells a round's leader the node is dead long before its lease expires.
func (e *Membership) serveProbe() {
	defer e.probeWG.Done()
	for {
		c, err := e.probe.Accept()
		if err != nil {
			return
		}
		c.Close()
	}
}

// probePending dials the liveness port of registered nodes that have not
// joined the round. A refused connection means the agent process is gone
// (killed, crashed) while its lease has a few seconds left; revoking the
// lease lets the round close now instead of after the TTL. A node that
// does not answer at all (frozen, cut off) is left to its lease.
func (e *Membership) probePending(ctx context.Context, pending []*liveNode) {
	for _, ln := range pending {
		if time.Since(ln.probed) < time.Second || ln.Probe == "" || ln.Lease == 0 {
			continue
		}
		ln.probed = time.Now()
		e.revokeIfGone(ctx, ln.NodeInfo)
	}
}

// PeerCheck is what probing the other nodes' agents found (CheckPeers).
type PeerCheck int

const (
	// PeersAnswered: every other registered agent accepted, or there was
	// none to probe.
	PeersAnswered PeerCheck = iota
	// PeerGone: an agent refused: it is gone, and its lease was revoked.
	PeerGone
	// PeersUnknown: the node list could not be read, or an agent did not
	// answer at all (frozen, cut off, or this machine too loaded to tell
	// within the dial's timeout): its lease will tell.
	PeersUnknown
)

// revokeIfGone dials n's liveness port and, when its agent refuses, revokes
// its lease; it reports what it found.
func (e *Membership) revokeIfGone(ctx context.Context, n NodeInfo) PeerCheck {
	c, err := net.DialTimeout("tcp", n.Probe, 300*time.Millisecond)
	if err == nil {
		c.Close()
		return PeersAnswered
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return PeersUnknown
	}
	e.log.Warn("node is gone: its agent refuses connections; revoking its lease", "node", n.Node, "host", n.Host, "probe", n.Probe)
	rctx, cancel := context.WithTimeout(ctx, opTimeout)
	_, err = e.cli.Revoke(rctx, clientv3.LeaseID(n.Lease))
	cancel()
	if err != nil {
		e.log.Debug("revoke lease of a dead node", "node", n.Node, "err", err)
	}
	return PeerGone
}

// maxPeerProbes bounds CheckPeers' dials in flight.
const maxPeerProbes = 64

// CheckPeers probes the other registered nodes' agents, for a worker of
// this node that failed on a lost connection without saying to whom (it
// does not use the hook): when an agent refuses, it is gone, and its
// lease is revoked, which ends the round with that node lost at once
// instead of at its TTL. It reports PeerGone when one was, else whether
// every agent answered.
func (e *Membership) CheckPeers(ctx context.Context) PeerCheck {
	gctx, cancel := context.WithTimeout(ctx, time.Second)
	resp, err := e.cli.Get(gctx, e.key(nodesDir), clientv3.WithPrefix())
	cancel()
	if err != nil {
		return PeersUnknown
	}
	var gone, unknown atomic.Bool
	var wg sync.WaitGroup
	slots := make(chan struct{}, maxPeerProbes)
	for _, kv := range resp.Kvs {
		var n NodeInfo
		if decode(string(kv.Key), kv.Value, &n) != nil || n.Node == e.node || n.Probe == "" || n.Lease == 0 {
			continue
		}
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			switch e.revokeIfGone(ctx, n) {
			case PeerGone:
				gone.Store(true)
			case PeersUnknown:
				unknown.Store(true)
			}
		})
	}
	wg.Wait()
	switch {
	case gone.Load():
		return PeerGone
	case unknown.Load():
		return PeersUnknown
	}
	return PeersAnswered
}
