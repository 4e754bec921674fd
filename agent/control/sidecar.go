package control

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ddp-agent/ddp-agent/wire"
)

// Peer is an admitted worker connection, as a Sidecar sees it.
type Peer struct {
	ID uint64 // the connection's, unique in the server's life
	// PID is the worker's pid from the socket's credentials, in the
	// server's pid namespace: 0 when the worker's is not visible from it
	// (another container without a shared pid namespace).
	PID   int
	Hello wire.Hello
}

// Sidecar admits workers the server did not launch (ddp-agent sidecar,
// ListenSidecar): by the peer's uid (checked before Admit, as always) and
// their Hello, not by parenthood. Under a Sidecar the server's generation
// and Config.KV are not used, and a connection carries events and Abort
// only: the workers bootstrap through torch's store, and a KV request is
// refused.
type Sidecar interface {
	// Admit decides on a Hello: the Welcome to send, or the refusal (a
	// *wire.RemoteError is sent as it is, another error as CodeDenied). It
	// is called from connection goroutines concurrently.
	Admit(p Peer) (wire.Welcome, error)
	// Events receives the events of an admitted peer (as
	// PIDAdmission.OnEvents).
	Events(p Peer, ev wire.Events)
	// Reformed receives an admitted peer's report that its job's ranks
	// re-formed in process.
	Reformed(p Peer, m wire.Reformed)
	// Left is called once when an admitted peer's connection ends.
	Left(p Peer)
}

// helloAdmitter is a sidecar's admitter: the Hello decides, once the uid
// was checked.
type helloAdmitter struct{ sc Sidecar }

// handshake admits by the Hello. Hello.PID may differ from the socket's
// pid when the worker is in another pid namespace; the socket's is the one
// the server acts on.
func (a *helloAdmitter) handshake(c *serverConn, pid int) error {
	if le := c.s.pending.acquire(pid, c.s.cfg); le != nil {
		c.send(0, le.reply())
		return fmt.Errorf("admit connection: %w", le)
	}
	f, hello, err := c.readHello()
	c.s.pending.release(pid)
	if err != nil {
		return err
	}
	if int(hello.PID) != pid {
		c.log.Debug("hello pid differs from the socket's (another pid namespace)", "hello_pid", hello.PID)
	}
	c.rank = int(hello.Rank)
	c.log = c.log.With("rank", c.rank, "job", hello.Job[wire.HelloJob])
	// A worker in a pid namespace the server cannot see has pid 0: it
	// counts against the limits by the pid it says it has, or every such
	// worker would share one process's.
	if pid == 0 {
		c.pid = -int(hello.PID)
	}
	if le := c.s.connsPer.acquire(c.pid, c.rank, c.s.cfg); le != nil {
		c.send(f.ID, le.reply())
		return fmt.Errorf("admit connection: %w", le)
	}
	c.counted = true
	c.nc.SetReadDeadline(time.Time{})
	c.gen = hello.Generation
	p := Peer{ID: c.s.peerIDs.Add(1), PID: pid, Hello: hello}
	w, err := a.sc.Admit(p)
	if err != nil {
		var re *wire.RemoteError
		if !errors.As(err, &re) {
			re = &wire.RemoteError{Code: wire.CodeDenied, Message: err.Error()}
		}
		c.send(f.ID, wire.Error{Code: re.Code, Message: re.Message})
		return fmt.Errorf("sidecar refused hello: %w", err)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.s.mu.Lock()
	c.peer, c.admitted = p, true
	c.s.conns[c] = struct{}{}
	c.s.mu.Unlock()
	return c.writeLocked(f.ID, w)
}

func (a *helloAdmitter) events(c *serverConn, ev wire.Events) { a.sc.Events(c.peer, ev) }

func (a *helloAdmitter) reformed(c *serverConn, m wire.Reformed) { a.sc.Reformed(c.peer, m) }

func (a *helloAdmitter) refuseKV() string {
	return "a sidecar keeps no store: bootstrap through torch's store"
}

func (a *helloAdmitter) left(c *serverConn) { a.sc.Left(c.peer) }

// AbortPeers sends Abort{reason} to every connected worker that match
// accepts (nil: all), in parallel, and returns how many received it. It
// blocks at most about twice Config.WriteTimeout.
func (s *Server) AbortPeers(match func(Peer) bool, reason string) int {
	s.mu.Lock()
	conns := slices.Collect(maps.Keys(s.conns))
	s.mu.Unlock()
	var sent atomic.Int32
	var wg sync.WaitGroup
	for _, c := range conns {
		if match != nil && !match(c.peer) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c.send(0, wire.Abort{Reason: reason}) == nil {
				sent.Add(1)
			}
		}()
	}
	wg.Wait()
	return int(sent.Load())
}
