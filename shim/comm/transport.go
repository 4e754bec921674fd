package comm

import (
	"context"
	"time"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/shim/agentconn"
	"github.com/ddp-agent/ddp-agent/wire"
)

// transport is what a communicator's collectives travel over, chosen once
// at Open from Config.Transport (newTransport) and never changed, as
// PyTorch's ProcessGroup holds one Backend: hostTransport (host.go: the
// CPU transports of package host, whose collectives the executor runs) or
// ncclTransport (nccl.go: enqueued on the caller's CUDA stream). A new
// transport implements it and gets a case in newTransport; Comm itself
// never asks which one it has.
//
// Comm calls the methods without holding c.mu, except connected.
type transport interface {
	// blob is this rank's bootstrap blob, for ddpshim_bootstrap_info; an
	// error once connected.
	blob() (string, error)
	// bootstrapAgent exchanges what connect needs through the agent's
	// store and connects, within ctx.
	bootstrapAgent(ctx context.Context, cl *agentconn.Client) error
	// connect builds the transport from every rank's blob, in rank order,
	// blocking up to the timeout.
	connect(lines []string) error
	// allReduce starts w (count elements at ptr; on stream, a CUDA stream,
	// where the transport uses one) and never waits for data.
	allReduce(w *Work, ptr unsafe.Pointer, count int64, stream unsafe.Pointer) error
	// abort makes a collective in flight return with cause; it returns at
	// once.
	abort(cause error)
	// connected reports whether connect succeeded; the caller holds c.mu.
	connected() bool
	// inFlight returns the events of the collectives that the transport
	// itself tracks (not the executor's) and that arrived before old.
	inFlight(old time.Time) []wire.CollectiveEvent
	// settle lets what is in flight report its events, before the
	// shipper's last flush; close then releases everything, once the
	// executor and the background goroutines have ended.
	settle()
	close()
	// describe adds the transport's part of ddpshim_comm_info's JSON.
	describe(info map[string]any)
}

// newTransport makes the transport cfg names: it listens for peers, or
// loads NCCL.
func newTransport(c *Comm) (transport, error) {
	if c.cfg.Transport == "nccl" {
		return openNCCL(c)
	}
	return openHost(c)
}
