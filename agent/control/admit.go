package control

import (
	"fmt"
	"strconv"
	"time"

	"github.com/ddp-agent/ddp-agent/wire"
)

// admitter is how a Server admits a connection and serves an admitted
// one: by pid for the workers the agent spawned (pidAdmitter, Listen), by
// uid and Hello for a sidecar's (helloAdmitter, ListenSidecar). The
// constructor chooses it once; its methods are called from connection
// goroutines concurrently.
type admitter interface {
	// handshake admits c, whose peer has pid and the server's uid, within
	// its read deadline: it checks the connection limits and the Hello,
	// registers c and replies Welcome, or answers the refusal and returns
	// why (wrapping a *limitError for a connection limit).
	handshake(c *serverConn, pid int) error
	// events takes an admitted connection's events.
	events(c *serverConn, ev wire.Events)
	// reformed takes an admitted connection's report of an in-process
	// re-formation.
	reformed(c *serverConn, m wire.Reformed)
	// refuseKV is the refusal of every KV request, "" when the server's KV
	// serves them.
	refuseKV() string
	// left is called once when an admitted connection ends.
	left(c *serverConn)
}

var (
	_ admitter = (*pidAdmitter)(nil)
	_ admitter = (*helloAdmitter)(nil)
)

// PIDAdmission is how Listen admits the workers this agent spawned: by the
// pid on the socket, which must be a worker's or a descendant's, and a
// Hello that agrees with it.
type PIDAdmission struct {
	// Authorize maps a peer pid to the worker rank it belongs to (the pid
	// is a spawned worker or a descendant); an error denies the
	// connection. It must not be nil and is called from connection
	// goroutines concurrently.
	Authorize func(pid int) (rank int, err error)
	// OnEvents, if not nil, receives the Events of a worker (ev may be
	// retained). It is called from the connection goroutine and must not
	// block long: the worker's other requests wait meanwhile.
	OnEvents func(rank int, ev wire.Events)
	// OnReformed, if not nil, receives a worker's report that the job's
	// ranks re-formed in process, with the generation of its Hello. It is
	// called as OnEvents is.
	OnReformed func(rank int, gen uint64, m wire.Reformed)
}

// pidAdmitter is run mode's admitter.
type pidAdmitter struct{ PIDAdmission }

func (a *pidAdmitter) handshake(c *serverConn, pid int) error {
	rank, err := a.Authorize(pid)
	if err != nil {
		c.send(0, wire.Error{Code: wire.CodeDenied, Message: "pid " + strconv.Itoa(pid) + " is not a worker of this agent"})
		return fmt.Errorf("authorize pid %d: %w", pid, err)
	}
	c.log = c.log.With("rank", rank)
	c.pid, c.rank = pid, rank
	if le := c.s.connsPer.acquire(pid, rank, c.s.cfg); le != nil {
		c.send(0, le.reply())
		return fmt.Errorf("admit connection: %w", le)
	}
	c.counted = true

	f, hello, err := c.readHello()
	if err != nil {
		return err
	}
	if int(hello.PID) != pid || int(hello.Rank) != rank {
		msg := fmt.Sprintf("hello pid %d rank %d, but peer is pid %d rank %d", hello.PID, hello.Rank, pid, rank)
		c.send(f.ID, wire.Error{Code: wire.CodeDenied, Message: msg})
		return fmt.Errorf("check hello: %w: %s", wire.ErrDenied, msg)
	}
	c.nc.SetReadDeadline(time.Time{})
	c.gen = hello.Generation

	// Hold the write lock until Welcome is out so no Abort overtakes it.
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.s.mu.Lock()
	if hello.Generation != c.s.gen {
		msg := fmt.Sprintf("hello generation %d, current generation %d", hello.Generation, c.s.gen)
		c.s.mu.Unlock()
		c.writeLocked(f.ID, wire.Error{Code: wire.CodeStaleGeneration, Message: msg})
		return fmt.Errorf("check hello: %w: %s", wire.ErrStaleGeneration, msg)
	}
	c.s.conns[c] = struct{}{}
	c.admitted = true
	w := wire.Welcome{JobID: c.s.cfg.JobID, Generation: c.s.gen, WorldSize: c.s.world, Rank: int32(rank), Config: c.s.config}
	c.s.mu.Unlock()
	return c.writeLocked(f.ID, w)
}

func (a *pidAdmitter) events(c *serverConn, ev wire.Events) {
	if a.OnEvents != nil {
		a.OnEvents(c.rank, ev)
	}
}

func (a *pidAdmitter) reformed(c *serverConn, m wire.Reformed) {
	if a.OnReformed != nil {
		a.OnReformed(c.rank, c.gen, m)
	}
}

func (a *pidAdmitter) refuseKV() string { return "" }

func (a *pidAdmitter) left(*serverConn) {}
