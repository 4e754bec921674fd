package rdzv

import (
	"context"
	"errors"
	"net"
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
		c, err := net.DialTimeout("tcp", ln.Probe, 300*time.Millisecond)
		if err == nil {
			c.Close()
			continue
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			continue
		}
		e.log.Warn("node is gone: its agent refuses connections; revoking its lease", "node", ln.Node, "host", ln.Host, "probe", ln.Probe)
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		_, err = e.cli.Revoke(rctx, clientv3.LeaseID(ln.Lease))
		cancel()
		if err != nil {
			e.log.Debug("revoke lease of a dead node", "node", ln.Node, "err", err)
		}
	}
}
