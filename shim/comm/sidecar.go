package comm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/agentconn"
	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/wire"
)

// sidecarDial bounds one connection attempt to a sidecar: it is an
// observer, and opening a communicator must not wait on it.
const sidecarDial = 5 * time.Second

// The redial backoff after a sidecar went away (killed, restarted) or was
// not answering: failed dials of a unix socket cost microseconds, and a
// restarted sidecar should have the job's events again within seconds.
const (
	sidecarRedialFirst = time.Second
	sidecarRedialMax   = 10 * time.Second
)

var errNoSidecar = errors.New("no sidecar connection")

// sidecarLink is a communicator's connection to the node's sidecar
// (ddp-agent sidecar), under a bootstrap through torch's store: the events
// go to it, and its Abort aborts the communicator. A lost connection
// changes nothing for training: the link redials for as long as the
// communicator lives, and the events meanwhile are counted as dropped.
type sidecarLink struct {
	c     *Comm
	hello wire.Hello

	mu    sync.Mutex
	cl    *agentconn.Client // nil while there is none
	relay string            // the first Welcome's wire.WelcomeRelay
}

// connectSidecar dials the sidecar once (so that rank 0's hook has its
// relay endpoint at once) and starts the link and the event shipper.
func (c *Comm) connectSidecar() {
	l := &sidecarLink{c: c, hello: wire.Hello{Rank: int32(*c.cfg.GlobalRank), LocalRank: int32(c.cfg.LocalRank),
		PID: int32(os.Getpid()), Generation: c.cfg.Generation, Transports: []string{c.cfg.Transport}, Job: c.cfg.SidecarJob}}
	if cl, w, err := l.dial(c.bgCtx); err != nil {
		c.log.Warn("no sidecar yet: training goes on; retrying in the background", "socket", c.cfg.Sidecar, "err", err)
	} else {
		l.cl, l.relay = cl, w.Config[wire.WelcomeRelay]
	}
	c.mu.Lock()
	c.side = l
	c.mu.Unlock()
	c.events = newEventRing()
	c.bg.Add(2)
	go func() {
		defer c.bg.Done()
		c.events.ship(c.bgCtx, l, c.reportInFlight)
	}()
	go func() {
		defer c.bg.Done()
		l.run(c.bgCtx)
	}()
}

func (l *sidecarLink) dial(ctx context.Context) (*agentconn.Client, wire.Welcome, error) {
	ctx, cancel := context.WithTimeout(ctx, sidecarDial)
	defer cancel()
	return agentconn.Dial(ctx, l.c.cfg.Sidecar, l.hello)
}

// current is the link's connection, or errNoSidecar while there is none.
func (l *sidecarLink) current() (*agentconn.Client, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cl == nil {
		return nil, errNoSidecar
	}
	return l.cl, nil
}

// SendEvents is the shipper's sink: the current connection, if any.
func (l *sidecarLink) SendEvents(ev wire.Events) error {
	cl, err := l.current()
	if err != nil {
		return err
	}
	return cl.SendEvents(ev)
}

// SendReformed tells the current sidecar, if any, of a re-formation.
func (l *sidecarLink) SendReformed(m wire.Reformed) error {
	cl, err := l.current()
	if err != nil {
		return err
	}
	return cl.SendReformed(m)
}

// run keeps the link until ctx is done: the sidecar's Abort aborts the
// communicator; a lost connection is redialed with backoff.
func (l *sidecarLink) run(ctx context.Context) {
	backoff := sidecarRedialFirst
	for {
		l.mu.Lock()
		cl := l.cl
		l.mu.Unlock()
		if cl != nil {
			select {
			case <-cl.Aborted():
			case <-ctx.Done():
				return
			}
			if cl.Told() {
				l.c.Abort(fmt.Errorf("%w: %s", failure.ErrAborted, cl.AbortReason()))
				return
			}
			l.c.log.Warn("sidecar connection lost: training goes on; redialing", "reason", cl.AbortReason())
			l.set(nil)
			cl.Close()
			backoff = sidecarRedialFirst
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		next, _, err := l.dial(ctx)
		if refused(err) {
			// The sidecar answered and will answer the same to this Hello.
			l.c.log.Warn("the sidecar refuses this worker: no more redials", "err", err)
			return
		}
		if err != nil {
			l.c.log.Debug("sidecar redial", "err", err)
			backoff = min(2*backoff, sidecarRedialMax)
			continue
		}
		l.set(next)
		l.c.log.Info("sidecar connected", "socket", l.c.cfg.Sidecar)
	}
}

// refused reports a sidecar's answer that a redial would get again: a
// malformed Hello, or a refusal (another user's sidecar, too many jobs).
// A stale generation is not one: the sidecar may have restarted.
func refused(err error) bool {
	var re *wire.RemoteError
	return errors.As(err, &re) && (re.Code == wire.CodeBadRequest || re.Code == wire.CodeDenied)
}

func (l *sidecarLink) set(cl *agentconn.Client) {
	l.mu.Lock()
	l.cl = cl
	l.mu.Unlock()
}

// close ends the link once run has returned.
func (l *sidecarLink) close() {
	l.mu.Lock()
	cl := l.cl
	l.cl = nil
	l.mu.Unlock()
	if cl != nil {
		cl.Close()
	}
}

// startShipping starts the event shipper and the watch for the agent's
// Abort under ddp-agent run, where a lost connection aborts the
// communicator: the agent that supervises the worker is gone.
func (c *Comm) startShipping(cl *agentconn.Client) {
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
			c.Abort(fmt.Errorf("%w: %s", failure.ErrAborted, cl.AbortReason()))
		case <-c.bgCtx.Done():
		}
	}()
}
