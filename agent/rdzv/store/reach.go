package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// ErrUnreachable is returned at once by every request of a client whose
// connection to the store has been down (no member connected) for longer
// than ClientConfig.FailFastAfter.
//
// Without it, every request to a store that is gone waits for its whole
// timeout: etcd's client retries an unavailable store until the request's
// deadline, and an agent tearing down a generation makes several requests
// in a row (seconds each), so learning that the store is gone took half a
// minute. The error is not a gRPC status, so etcd's retry gives up on it
// at once.
var ErrUnreachable = errors.New("rendezvous store unreachable")

// reach follows the client's connection state: since when no member has
// been connected.
type reach struct {
	after time.Duration // 0: never fail fast

	mu        sync.Mutex
	downSince time.Time // zero while connected (or idle)
	cluster   uint64    // the etcd cluster id of the first answer
}

// ErrForeignCluster: an endpoint answered for another etcd cluster than
// the one this client first spoke to. That happens when the agent on the
// bootstrap address restarted and, finding the address free, started a
// fresh store there while the job's replicated store lives on: its
// answers must not be mixed with the job's. The request fails (etcd's
// client does not retry it), and the caller's retry goes to another
// endpoint.
var ErrForeignCluster = errors.New("answered by another etcd cluster")

// follow tracks conn's state until ctx ends.
func (r *reach) follow(ctx context.Context, conn *grpc.ClientConn) {
	for {
		st := conn.GetState()
		r.mu.Lock()
		switch st {
		case connectivity.Ready, connectivity.Idle:
			r.downSince = time.Time{}
		default: // Connecting, TransientFailure, Shutdown
			if r.downSince.IsZero() {
				r.downSince = time.Now()
			}
		}
		r.mu.Unlock()
		if st == connectivity.Shutdown || !conn.WaitForStateChange(ctx, st) {
			return
		}
	}
}

// downFor is how long no member has been connected; 0 while one is.
func (r *reach) downFor() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.downSince.IsZero() {
		return 0
	}
	return time.Since(r.downSince)
}

// intercept fails a request at once when the store has been unreachable
// for longer than r.after.
func (r *reach) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if r.after > 0 {
		if d := r.downFor(); d >= r.after {
			return fmt.Errorf("%w: no member connected for %v", ErrUnreachable, d.Round(100*time.Millisecond))
		}
	}
	if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
		return err
	}
	return r.checkCluster(reply)
}

// checkCluster compares the cluster id in reply's header with the first
// one seen.
func (r *reach) checkCluster(reply any) error {
	h, ok := reply.(interface{ GetHeader() *pb.ResponseHeader })
	if !ok || h.GetHeader() == nil || h.GetHeader().ClusterId == 0 {
		return nil
	}
	id := h.GetHeader().ClusterId
	r.mu.Lock()
	defer r.mu.Unlock()
	switch r.cluster {
	case 0:
		r.cluster = id
	case id:
	default:
		return fmt.Errorf("%w (%x, not %x)", ErrForeignCluster, id, r.cluster)
	}
	return nil
}
