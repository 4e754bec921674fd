package host

import (
	"context"
	"fmt"
	"net"

	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// carrier is what carries the data of a Comm's all-reduces, chosen once by
// Connect (chooseCarrier) and never changed: the ring itself (ringCarrier,
// ring.go), the host's shared memory (shmCarrier, local.go) or the
// hierarchy (*hierarchy, hier.go). The ring stays connected underneath in
// every case, watching that the peers are alive; Comm itself never asks
// which carrier it has.
//
// Comm calls allReduce and broadcast only from its AllReduce and
// Broadcast, one at a time, after its own checks; abort and close at any time, close once its goroutines have
// ended.
type carrier interface {
	// allReduce reduces buf in place across all ranks (Comm.AllReduce). An
	// error wraps a kind of package failure; the Comm fails with it.
	allReduce(ctx context.Context, buf []byte, dt reduce.DType, op reduce.Op) error
	// broadcast copies root's bufs into every other rank's
	// (Comm.Broadcast), with allReduce's errors.
	broadcast(ctx context.Context, bufs [][]byte, dt reduce.DType, root int) error
	// abort fails the carrier's collective in flight and every later one
	// with err, on this rank and, where the carrier shares state with
	// peers, on theirs; it returns at once.
	abort(err error)
	// close releases the carrier, waiting for a running allReduce to let go
	// of it.
	close()
	// route says how the carrier moves the data.
	route() route
}

// route is what a Comm's methods need to know of its carrier.
type route struct {
	transport  string // Comm.Transport: "tcp", "shm" or "hierarchical"
	singleCopy bool   // Comm.SingleCopy
	// onRing: the ring carries the data, so a collective issued when a
	// neighbour has closed cannot finish (Comm.neighbourClosed); otherwise
	// the ring only watches the peers.
	onRing bool
}

// chooseCarrier decides what carries the data of the Comm that Connect
// builds over send and recv: with cfg.SHM, shared memory when every rank
// is on one host and the hierarchy when the ranks span several hosts with
// more than one on some, provided every rank mapped its host's segment
// (setupLocal); otherwise the ring. It uses the freshly connected ring to
// agree, and blocks until ctx is done at the longest. An error means the
// ring failed, or a leader could not connect the leaders' ring.
func chooseCarrier(ctx context.Context, e *Endpoint, send, recv *net.TCPConn, rank int, peers []PeerInfo, cfg Config) (func(*Comm) carrier, error) {
	if !cfg.SHM || !(sameHost(peers) || hierarchical(peers)) {
		return newRingCarrier, nil
	}
	local, ok, err := setupLocal(ctx, send, recv, rank, peers, cfg)
	if err != nil {
		return nil, fmt.Errorf("set up shared memory: %w", err)
	}
	var data carrier
	switch {
	case !ok: // some rank could not map its segment
		return newRingCarrier, nil
	case !sameHost(peers):
		h, err := newHierarchy(ctx, e, rank, peers, local, cfg)
		if err != nil {
			return nil, err
		}
		data = h
	case local != nil:
		data = shmCarrier{local}
	default: // alone on its host
		return newRingCarrier, nil
	}
	return func(*Comm) carrier { return data }, nil
}
