package comm

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/ddp-agent/ddp-agent/ncclshim/agentconn"
	"github.com/ddp-agent/ddp-agent/ncclshim/status"
	"github.com/ddp-agent/ddp-agent/wire"
)

// sidecarDial bounds the connection to a sidecar: it is an observer, and
// opening a communicator must not wait on it.
const sidecarDial = 5 * time.Second

// connectSidecar connects to the node's sidecar (ddp-agent sidecar) for
// the events and Abort, under a bootstrap through torch's store. Failing
// that, the communicator works as it would without a sidecar.
func (c *Comm) connectSidecar() {
	ctx, cancel := context.WithTimeout(c.ctx, sidecarDial)
	defer cancel()
	hello := wire.Hello{Rank: int32(*c.cfg.GlobalRank), LocalRank: int32(c.cfg.LocalRank), PID: int32(os.Getpid()),
		Generation: c.cfg.Generation, Transports: []string{c.cfg.Transport}, Job: c.cfg.SidecarJob}
	cl, w, err := agentconn.Dial(ctx, c.cfg.Sidecar, hello)
	if err != nil {
		c.log.Warn("no sidecar: training goes on without its watch", "socket", c.cfg.Sidecar, "err", err)
		return
	}
	c.agent, c.sidecarRelay = cl, w.Config[wire.WelcomeRelay]
	c.startShipping(cl, true)
}

// startShipping starts the event shipper and the watch for the agent's
// Abort. A lost connection aborts the communicator under ddp-agent run
// (the agent that supervises the worker is gone), never under a sidecar.
func (c *Comm) startShipping(cl *agentconn.Client, sidecar bool) {
	c.events = newEventRing()
	c.bg.Add(2)
	go func() {
		defer c.bg.Done()
		c.events.ship(c.bgCtx, cl, c.reportInFlight)
	}()
	go func() {
		defer c.bg.Done()
		select {
		case <-cl.Aborted():
			if sidecar && !cl.Told() {
				c.log.Warn("sidecar connection lost: training goes on without its watch", "reason", cl.AbortReason())
				return
			}
			c.Abort(fmt.Errorf("%w: %s", status.ErrAborted, cl.AbortReason()))
		case <-c.bgCtx.Done():
		}
	}()
}
