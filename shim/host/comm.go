package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/host/shm"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// Defaults of Config. 256 KiB segments measured best or as good as any
// for 64 KiB to 64 MiB buffers (BenchmarkAllReduce), and keep the staging
// buffer in L2. DefaultLinkTimeout: see Config.LinkTimeout.
const (
	DefaultTimeout      = 10 * time.Minute
	DefaultSegmentBytes = 256 << 10
	DefaultLinkTimeout  = 10 * time.Second
)

// Config tunes a Comm; the zero value takes the defaults.
type Config struct {
	// Timeout bounds Connect and each AllReduce when the context has no
	// earlier deadline (default DefaultTimeout).
	Timeout time.Duration
	// SegmentBytes is the pipelining unit: a rank forwards a segment as soon
	// as it has received and reduced it (default DefaultSegmentBytes).
	SegmentBytes int
	// LinkTimeout fails the Comm when a neighbour's host has acknowledged
	// nothing for that long (default DefaultLinkTimeout): a link that went
	// down or a host that froze, which reset nothing and would otherwise
	// hold the ring until Timeout. Only the neighbour's kernel counts, never
	// its application (watchLinks): a rank that is late to call AllReduce,
	// or a slow but working link, does not trip it. Between collectives it
	// is kept in whole seconds, and at least 2 s (keepalive's unit).
	LinkTimeout time.Duration
	// Logger receives connection and failure events (default: discarded).
	Logger *slog.Logger
	// SHM lets ranks that all run on one host (equal HostIDs) all-reduce
	// through shared memory (package shm) instead of the TCP ring, which
	// then only watches that the peers are alive.
	SHM bool
}

func (c Config) withDefaults() Config {
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.SegmentBytes <= 0 {
		c.SegmentBytes = DefaultSegmentBytes
	}
	if c.LinkTimeout <= 0 {
		c.LinkTimeout = DefaultLinkTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Comm is one rank's end of a connected ring, and the one carrier that
// Connect chose for its data (carrier.go): the ring itself, shared memory or
// the hierarchy. The ring stays connected underneath in every case, to
// notice a peer that goes away.
//
// AllReduce and Broadcast must not be called concurrently; Abort, Done, Err,
// Close, Rank, Size and Transport are safe to call at any time from any
// goroutine.
type Comm struct {
	rank, size int
	timeout    time.Duration
	segBytes   int
	log        *slog.Logger
	send, recv *net.TCPConn // to rank+1 and from rank-1; nil when size is 1
	data       carrier      // what carries the data; set once by newComm

	busy    atomic.Bool   // an AllReduce is running
	closing atomic.Bool   // Close is saying goodbye
	issued  atomic.Uint64 // AllReduce calls past their argument checks
	seq     uint64        // collectives issued; owned by the running AllReduce

	// The running AllReduce hands its collective to the receiver goroutine
	// (reqs holds at most one), sends while the receiver receives, then
	// waits for the receiver's verdict. Each side counts the segments it
	// has finished, for the other to wait on.
	reqs     chan *collective
	results  chan error
	received progress
	sent     progress

	mu   sync.Mutex
	err  error         // the first failure; set once
	gone error         // a neighbour closed cleanly: the next AllReduce fails
	done chan struct{} // closed when err is set

	wg sync.WaitGroup // the receiver, the successor watcher and the link watcher
}

// newComm starts rank's end of the ring over send and recv (nil when size is
// 1), the data carried by data's carrier, which it makes once for the Comm.
func newComm(rank, size int, send, recv *net.TCPConn, data func(*Comm) carrier, cfg Config) *Comm {
	c := &Comm{
		rank:     rank,
		size:     size,
		timeout:  cfg.Timeout,
		segBytes: cfg.SegmentBytes,
		log:      cfg.Logger,
		send:     send,
		recv:     recv,
		reqs:     make(chan *collective, 1),
		results:  make(chan error, 1),
		received: newProgress(),
		sent:     newProgress(),
		done:     make(chan struct{}),
	}
	c.data = data(c)
	if size > 1 {
		c.wg.Add(3)
		go c.receive()
		go c.watchSuccessor()
		go c.watchLinks(cfg.LinkTimeout)
	}
	return c
}

// Rank returns this rank.
func (c *Comm) Rank() int { return c.rank }

// Size returns the world size.
func (c *Comm) Size() int { return c.size }

// Transport returns "shm" when the data goes through shared memory,
// "hierarchical" when through shared memory within hosts and a ring of the
// hosts' leaders between them (hier.go), else "tcp".
func (c *Comm) Transport() string { return c.data.route().transport }

// SingleCopy reports whether large all-reduces take shared memory's
// single-copy path (cross-memory attach, package shm's direct.go).
func (c *Comm) SingleCopy() bool { return c.data.route().singleCopy }

// Done returns a channel closed when the Comm has failed, was aborted or
// was closed, including when a neighbour goes away between collectives.
func (c *Comm) Done() <-chan struct{} { return c.done }

// Err returns why Done was closed, or nil while it is open.
func (c *Comm) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Abort fails the running AllReduce, if any, and every later one with an
// error wrapping failure.ErrAborted and err (which may be nil). It closes the
// connections, so blocked reads and writes return at once; it does not
// wait for the running AllReduce to return. Safe to call concurrently and
// more than once; only the first failure is kept.
func (c *Comm) Abort(err error) {
	if err == nil {
		c.fail(fmt.Errorf("rank %d: %w", c.rank, failure.ErrAborted))
		return
	}
	c.fail(fmt.Errorf("rank %d: %w: %w", c.rank, failure.ErrAborted, err))
}

// Close ends the Comm. When no AllReduce is running it first says goodbye
// to both neighbours, so that a neighbour still finishing the last
// collective (it may need nothing more from this rank) is not failed by the
// closed connections; its next AllReduce fails with failure.ErrPeer instead. With
// an AllReduce running, Close aborts it (failure.ErrAborted and failure.ErrClosed) and the
// neighbours fail. Close closes the connections and shared memory, and
// waits for its goroutines (and, over shared memory, for a running
// AllReduce to return). Close is idempotent and always returns nil.
func (c *Comm) Close() error {
	if c.size > 1 && c.Err() == nil && c.busy.CompareAndSwap(false, true) {
		c.closing.Store(true) // busy stays set: no AllReduce starts from now on
		c.goodbye()
	}
	c.fail(fmt.Errorf("rank %d: %w: %w", c.rank, failure.ErrAborted, failure.ErrClosed))
	c.wg.Wait()
	c.data.close() // waits for a running AllReduce to let go of shared memory
	return nil
}

// Goodbye markers: a header with byeMagic to the successor, byeByte to the
// predecessor (that direction carries nothing else).
const (
	byeMagic = "DDPB"
	byeByte  = 'B'
)

// goodbye sends the goodbye markers and half-closes both connections, then
// waits briefly for the neighbours' own goodbyes: closing a socket with
// unread bytes resets the connection, and a reset can destroy data the
// neighbour has not read yet.
func (c *Comm) goodbye() {
	dl := time.Now().Add(time.Second)
	c.send.SetWriteDeadline(dl)
	c.recv.SetWriteDeadline(dl)
	var bye [hdrLen]byte
	copy(bye[:], byeMagic)
	if _, err := c.send.Write(bye[:]); err == nil {
		c.send.CloseWrite()
	}
	if _, err := c.recv.Write([]byte{byeByte}); err == nil {
		c.recv.CloseWrite()
	}
	done := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(done)
	}()
	t := time.NewTimer(200 * time.Millisecond)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// neighbourClosed records that a neighbour closed its Comm cleanly. It
// fails the Comm only when a collective that needs data from the
// predecessor has been issued (received counts those the receiver
// finished; -1 for the successor, which owes nothing); otherwise the next
// AllReduce fails. gone is set before issued is read, and AllReduce counts
// itself in issued before it reads gone, so one of the two sees the other.
func (c *Comm) neighbourClosed(err error, received int64) {
	c.mu.Lock()
	if c.gone == nil {
		c.gone = err
	}
	c.mu.Unlock()
	// When the ring carries no data, the collective may still finish, and
	// shared memory tells if it needs the closed rank.
	if received >= 0 && c.data.route().onRing && !c.closing.Load() && c.issued.Load() > uint64(received) {
		c.fail(err)
	}
	c.log.Debug("host: neighbour closed", "rank", c.rank, "err", err)
}

func (c *Comm) goneErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gone
}

// fail records the first failure, closes done and the connections.
func (c *Comm) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	close(c.done)
	c.mu.Unlock()
	switch {
	case errors.Is(err, failure.ErrClosed):
	case c.busy.Load():
		c.log.Warn("host: comm failed", "rank", c.rank, "size", c.size, "err", err)
	default: // between collectives: most likely a neighbour that closed first
		c.log.Info("host: comm failed while idle", "rank", c.rank, "size", c.size, "err", err)
	}
	if !errors.Is(err, failure.ErrClosed) {
		// The peers' shared-memory waits fail at once too. Not on Close:
		// shm.Close tells only the peers that still wait for this rank.
		c.data.abort(err)
	}
	if c.send != nil {
		c.send.Close()
		c.recv.Close()
	}
}

// AllReduce reduces buf in place across all ranks: every rank ends with the
// element-wise sum (op Sum) or the sum divided by the world size (op Avg)
// of all ranks' buffers, bit-identical on every rank. len(buf) must be a
// multiple of dt.Size() and may be 0; every rank must issue the same
// collectives in the same order with the same length, dtype and op.
//
// AllReduce blocks until the collective is complete on this rank, ctx is
// done, the deadline passes (ctx's or Config.Timeout from now, whichever
// is earlier), or the Comm fails. Bad arguments return failure.ErrInvalid, and a
// ctx already done on entry its own error; both leave the Comm intact
// (nothing was sent). Any other error aborts the Comm, since the streams are
// out of step: failure.ErrTimeout, failure.ErrPeer, failure.ErrMismatch, or failure.ErrAborted (Abort,
// Close, ctx cancelled, or an earlier failure, which it also wraps).
// AllReduce is not safe for concurrent use; a concurrent call gets
// failure.ErrInvalid.
func (c *Comm) AllReduce(ctx context.Context, buf []byte, dt reduce.DType, op reduce.Op) error {
	if !dt.Valid() || !op.Valid() || len(buf)%dt.Size() != 0 {
		return fmt.Errorf("all-reduce on rank %d: %w: %d bytes of %v, op %v", c.rank, failure.ErrInvalid, len(buf), dt, op)
	}
	return c.collective(ctx, "all-reduce", func() error { return c.data.allReduce(ctx, buf, dt, op) })
}

// Broadcast copies root's buffers into every other rank's: a collective
// with AllReduce's ordering, arguments (every rank names the same root and
// passes buffers of the same lengths), blocking, errors and breakage,
// whose result is root's bytes on every rank. bufs are one run of bytes,
// in order, moved as one collective; dt only sizes the elements, and each
// buffer holds whole ones.
func (c *Comm) Broadcast(ctx context.Context, bufs [][]byte, dt reduce.DType, root int) error {
	bad := !dt.Valid() || root < 0 || root >= c.size
	size := 0
	for _, b := range bufs {
		bad = bad || len(b)%dt.Size() != 0
		size += len(b)
	}
	if bad {
		return fmt.Errorf("broadcast on rank %d: %w: %d buffers, %d bytes of %v from rank %d of %d", c.rank, failure.ErrInvalid, len(bufs), size, dt, root, c.size)
	}
	return c.collective(ctx, fmt.Sprintf("broadcast from rank %d", root), func() error { return c.data.broadcast(ctx, bufs, dt, root) })
}

// collective runs one collective, what, through run, after the checks
// that AllReduce and Broadcast share.
func (c *Comm) collective(ctx context.Context, what string, run func() error) error {
	if !c.busy.CompareAndSwap(false, true) {
		return fmt.Errorf("%s on rank %d: %w: another collective is running", what, c.rank, failure.ErrInvalid)
	}
	defer c.busy.Store(false)
	if err := c.Err(); err != nil {
		if errors.Is(err, failure.ErrAborted) {
			return fmt.Errorf("%s on rank %d: %w", what, c.rank, err)
		}
		return fmt.Errorf("%s on rank %d: %w: failed earlier: %w", what, c.rank, failure.ErrAborted, err)
	}
	if ctx.Err() != nil { // nothing sent yet: the Comm stays usable
		return fmt.Errorf("%s on rank %d: %w", what, c.rank, ctxError(ctx, nil))
	}
	c.issued.Add(1) // before the check: see neighbourClosed
	if err := c.goneErr(); err != nil {
		c.fail(err)
		return fmt.Errorf("%s on rank %d: %w", what, c.rank, err)
	}
	c.seq++
	if c.size == 1 {
		return nil
	}
	if err := run(); err != nil {
		c.fail(err)
		if shm.RaisedFirst(err) {
			// The cause, whatever the Comm recorded first: in shared
			// memory this rank told the others of its failure before
			// it returned, and the first of them to fail can close its
			// connection to this rank before this rank gets here (the
			// Comm then holds that EOF). A mismatch found, a peer found
			// dead.
			return err
		}
		return c.Err()
	}
	return nil
}
