package store

import (
	"cmp"
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcd's own keep-alive (clientv3's Lease.KeepAlive, which
// concurrency.Session uses) sends every renewal down one long-lived
// stream. When the member at its other end froze, the renewals went
// nowhere until gRPC's keepalive dropped the connection, at least 10 s,
// and a 3 s lease expired under a healthy agent. Here each renewal is a
// stream of its own, which gRPC balances onto a member afresh, and a
// renewal not answered within hedgeAfter is doubled by another while it
// waits, so a frozen member costs a renewal a fraction of a second.
const (
	hedgeAfter = 300 * time.Millisecond
	maxHedges  = 4 // renewals of one lease in flight at once
)

// KeepAlive keeps lease id, of ttl, alive: it renews it every third of
// its TTL, until ctx ends or the lease is lost (gone from the store, or
// not renewed within its TTL). The returned channel is closed then.
func KeepAlive(ctx context.Context, cli *clientv3.Client, id clientv3.LeaseID, ttl time.Duration) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		renewed := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(renewed.Add(ttl / 3))):
			}
			asked := time.Now()
			left, err := renew(ctx, cli, id, renewed.Add(ttl))
			if err != nil || left <= 0 {
				return
			}
			renewed = asked
		}
	}()
	return done
}

// renew renews lease id once, hedged: it asks again every hedgeAfter
// while no answer came (up to maxHedges at once), and takes the first
// answer. It gives up at deadline, when the lease would have expired
// anyway, or when the store says the lease is gone. It returns the TTL
// left that the store answered.
func renew(ctx context.Context, cli *clientv3.Client, id clientv3.LeaseID, deadline time.Time) (int64, error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	type result struct {
		ttl int64
		err error
	}
	results := make(chan result, maxHedges)
	inFlight := 0
	hedge := time.NewTimer(0)
	defer hedge.Stop()
	var last error
	for {
		select {
		case <-hedge.C:
			if inFlight < maxHedges {
				inFlight++
				go func() {
					resp, err := cli.KeepAliveOnce(ctx, id)
					if err != nil {
						results <- result{err: err}
						return
					}
					results <- result{ttl: resp.TTL}
				}()
			}
			hedge.Reset(hedgeAfter)
		case r := <-results:
			inFlight--
			if r.err == nil || errors.Is(r.err, rpctypes.ErrLeaseNotFound) {
				return r.ttl, r.err
			}
			last = r.err // a cut connection: the next hedge asks again
		case <-ctx.Done():
			return 0, cmp.Or(last, ctx.Err())
		}
	}
}
