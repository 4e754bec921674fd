package comm

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/shim/agentconn"
	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/host"
	"github.com/ddp-agent/ddp-agent/shim/status"
	"github.com/ddp-agent/ddp-agent/wire"
)

// hostTransport is the CPU transport (package host: the TCP ring, shared
// memory or the hierarchy, which host.Connect chooses): an endpoint until
// connected, then the connected Comm, whose collectives the executor runs
// one at a time (comm.go).
type hostTransport struct {
	c *Comm

	// Under c.mu.
	ep *host.Endpoint // until connected
	tr allReducer     // nil until connected
}

var _ transport = (*hostTransport)(nil)

// openHost listens for c's peers.
func openHost(c *Comm) (*hostTransport, error) {
	ep, err := host.Listen(host.Options{Host: c.cfg.Host, MasterAddr: c.cfg.MasterAddr})
	if err != nil {
		return nil, status.Errorf(status.Unavailable, "listen for peers: %w", err)
	}
	return &hostTransport{c: c, ep: ep}, nil
}

func (t *hostTransport) blob() (string, error) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.tr != nil || t.ep == nil {
		return "", status.Errorf(status.Invalid, "communicator is already connected")
	}
	return blob{V: blobVersion, Rank: t.c.rank, PeerInfo: t.ep.Info()}.encode(), nil
}

// bootstrapAgent publishes this rank's blob in the agent's store, reads
// every rank's and connects.
func (t *hostTransport) bootstrapAgent(ctx context.Context, cl *agentconn.Client) error {
	c := t.c
	mine, err := t.blob()
	if err != nil {
		return err
	}
	prefix := "ddpshim/" + c.cfg.Name + "/"
	if err := cl.KVSet(ctx, prefix+strconv.Itoa(c.rank), []byte(mine)); err != nil {
		return status.Errorf(status.Unavailable, "publish address through the agent: %w", err)
	}
	lines := make([]string, c.size)
	for r := range c.size {
		v, err := cl.KVGet(ctx, prefix+strconv.Itoa(r), time.Until(deadline(ctx)))
		if err != nil {
			if cause := context.Cause(c.ctx); cause != nil {
				return status.AbortedBy(fmt.Errorf("waiting for the address of rank %d: %w", r, cause))
			}
			if errors.Is(err, wire.ErrTimeout) || ctx.Err() != nil {
				return status.Errorf(status.Timeout, "rank %d did not publish its address within %v: %w", r, c.cfg.timeout(), err)
			}
			return status.Errorf(status.Unavailable, "address of rank %d from the agent: %w", r, err)
		}
		lines[r] = string(v)
	}
	return t.connect(lines)
}

// connect builds the host Comm and starts the executor on it.
func (t *hostTransport) connect(lines []string) error {
	c := t.c
	if len(lines) != c.size {
		return status.Errorf(status.Invalid, "got %d bootstrap blobs for world size %d", len(lines), c.size)
	}
	peers := make([]host.PeerInfo, c.size)
	for i, l := range lines {
		b, err := decodeBlob(l)
		if err != nil {
			return status.Errorf(status.Invalid, "rank %d: %w", i, err)
		}
		if b.Rank != i {
			return status.Errorf(status.Invalid, "blob %d is rank %d's: blobs must be in rank order", i, b.Rank)
		}
		peers[i] = b.PeerInfo
	}
	c.mu.Lock()
	ep := t.ep
	switch {
	case c.closed:
		c.mu.Unlock()
		return failure.ErrClosed
	case t.tr != nil || ep == nil:
		c.mu.Unlock()
		return status.Errorf(status.Invalid, "communicator is already connected")
	}
	if peers[c.rank].Nonce != ep.Info().Nonce {
		c.mu.Unlock()
		return status.Errorf(status.Invalid, "blob %d is not this communicator's (nonce differs)", c.rank)
	}
	t.ep = nil // Connect consumes it
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.timeout())
	defer cancel()
	tr, err := host.Connect(ctx, ep, c.rank, peers, host.Config{
		Timeout: c.cfg.timeout(), Logger: c.log, SHM: c.cfg.SHM == nil || *c.cfg.SHM,
	})
	if err != nil {
		if ctx.Err() != nil && c.ctx.Err() == nil {
			return status.Errorf(status.Timeout, "connect to peers within %v: %w", c.cfg.timeout(), err)
		}
		return fmt.Errorf("connect to peers: %w", err)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		tr.Close()
		return failure.ErrClosed
	}
	t.tr = tr
	c.startExecutor(tr) // under mu: close either sees tr and waits for the executor, or neither
	c.mu.Unlock()
	c.log.Info("connected", "world_size", c.size, "transport", tr.Transport())
	return nil
}

// allReduce queues w for the executor.
func (t *hostTransport) allReduce(w *Work, _ unsafe.Pointer, _ int64, _ unsafe.Pointer) error {
	return t.c.enqueue(w)
}

func (t *hostTransport) abort(cause error) {
	t.c.mu.Lock()
	tr := t.tr
	t.c.mu.Unlock()
	if tr != nil {
		tr.Abort(cause)
	}
}

func (t *hostTransport) connected() bool { return t.tr != nil }

// inFlight is nil: the executor's queue says what is in flight.
func (t *hostTransport) inFlight(time.Time) []wire.CollectiveEvent { return nil }

func (t *hostTransport) settle() {}

func (t *hostTransport) close() {
	t.c.mu.Lock()
	ep, tr := t.ep, t.tr
	t.c.mu.Unlock()
	if ep != nil {
		ep.Close()
	}
	if tr != nil {
		tr.Close()
	}
}

func (t *hostTransport) describe(info map[string]any) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	info["connected"] = t.tr != nil
	if t.tr != nil {
		info["transport"] = t.tr.Transport()
		if sc, ok := t.tr.(interface{ SingleCopy() bool }); ok {
			info["single_copy"] = sc.SingleCopy()
		}
	}
}
