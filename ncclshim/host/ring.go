package host

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/ncclshim/failure"
	"github.com/ddp-agent/ddp-agent/ncclshim/host/shm"
	"github.com/ddp-agent/ddp-agent/ncclshim/reduce"
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

// Every collective starts with a header from each rank to its successor:
// magic "DDPC", sequence number u64, count u64, dtype u8, op u8, two zero
// bytes; little-endian. Ranks whose headers differ disagree.
const (
	hdrMagic = "DDPC"
	hdrLen   = 24
)

// Comm is one rank's end of a connected ring.
//
// AllReduce must not be called concurrently with itself; Abort, Done, Err,
// Close, Rank, Size and Transport are safe to call at any time from any
// goroutine.
type Comm struct {
	rank, size int
	timeout    time.Duration
	segBytes   int
	log        *slog.Logger
	send, recv *net.TCPConn // to rank+1 and from rank-1; nil when size is 1
	local      *shm.Comm    // carries the data instead of the ring when not nil
	hier       *hierarchy   // or this does, across hosts (hier.go)

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

func newComm(rank, size int, send, recv *net.TCPConn, local *shm.Comm, hier *hierarchy, cfg Config) *Comm {
	c := &Comm{
		rank:     rank,
		size:     size,
		timeout:  cfg.Timeout,
		segBytes: cfg.SegmentBytes,
		log:      cfg.Logger,
		send:     send,
		recv:     recv,
		local:    local,
		hier:     hier,
		reqs:     make(chan *collective, 1),
		results:  make(chan error, 1),
		received: newProgress(),
		sent:     newProgress(),
		done:     make(chan struct{}),
	}
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
func (c *Comm) Transport() string {
	switch {
	case c.local != nil:
		return "shm"
	case c.hier != nil:
		return "hierarchical"
	}
	return "tcp"
}

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
	if c.local != nil {
		c.local.Close() // waits for a running AllReduce to let go of the mapping
	}
	if c.hier != nil {
		c.hier.close()
	}
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
	// Over shared memory the ring carries no data: the collective may still
	// finish, and shm tells if it needs the closed rank.
	if received >= 0 && c.local == nil && c.hier == nil && !c.closing.Load() && c.issued.Load() > uint64(received) {
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
	if c.local != nil && !errors.Is(err, failure.ErrClosed) {
		// The peers' shared-memory waits fail at once too. Not on Close:
		// shm.Close tells only the peers that still wait for this rank.
		c.local.Abort(err)
	}
	if c.hier != nil && !errors.Is(err, failure.ErrClosed) {
		c.hier.abort(err)
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
	if !c.busy.CompareAndSwap(false, true) {
		return fmt.Errorf("all-reduce on rank %d: %w: another AllReduce is running", c.rank, failure.ErrInvalid)
	}
	defer c.busy.Store(false)
	if err := c.Err(); err != nil {
		if errors.Is(err, failure.ErrAborted) {
			return fmt.Errorf("all-reduce on rank %d: %w", c.rank, err)
		}
		return fmt.Errorf("all-reduce on rank %d: %w: failed earlier: %w", c.rank, failure.ErrAborted, err)
	}
	if ctx.Err() != nil { // nothing sent yet: the Comm stays usable
		return fmt.Errorf("all-reduce on rank %d: %w", c.rank, ctxError(ctx, nil))
	}
	c.issued.Add(1) // before the check: see neighbourClosed
	if err := c.goneErr(); err != nil {
		c.fail(err)
		return fmt.Errorf("all-reduce on rank %d: %w", c.rank, err)
	}
	c.seq++
	if c.size == 1 {
		return nil
	}
	if c.local != nil {
		if err := c.local.AllReduce(ctx, buf, dt, op); err != nil {
			c.fail(fromSHM(err))
			return c.Err()
		}
		return nil
	}
	if c.hier != nil {
		if err := c.hier.allReduce(ctx, buf, dt, op); err != nil {
			c.fail(fmt.Errorf("all-reduce on rank %d: %w", c.rank, err))
			return c.Err()
		}
		return nil
	}
	col := newCollective(c, buf, dt, op)

	deadline := time.Now().Add(c.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.recv.SetReadDeadline(deadline) // the receiver clears it when done
	c.send.SetWriteDeadline(deadline)
	if ctx.Done() != nil {
		defer context.AfterFunc(ctx, func() {
			c.fail(fmt.Errorf("all-reduce #%d on rank %d: %w", col.seq, c.rank, ctxError(ctx, nil)))
		})()
	}

	c.received.reset()
	c.sent.reset()
	// The receiver takes col once the predecessor's header is in, which
	// may be after this rank has sent its whole part.
	c.reqs <- col
	serr := c.sendAll(col)
	if serr != nil {
		c.fail(serr)
	}
	var rerr error
	select {
	case rerr = <-c.results:
	case <-c.done:
		// Wait for the receiver to let go of buf, unless it never took col.
		select {
		case <-c.reqs:
			rerr = c.Err()
		case rerr = <-c.results:
		}
	}
	if serr != nil || rerr != nil {
		return c.Err() // the first cause, whichever side saw it
	}
	return nil
}

// collective describes one AllReduce and how it is cut up: chunk i (of
// size count/n, plus one for i < count%n) is owned by one rank after the
// reduce-scatter, and every chunk is cut into nseg segments of segElems
// elements (the last ones short or empty).
type collective struct {
	seq            uint64
	buf            []byte
	dt             reduce.DType
	op             reduce.Op
	hdr            [hdrLen]byte
	es, base, rem  int
	segElems, nseg int
}

func newCollective(c *Comm, buf []byte, dt reduce.DType, op reduce.Op) *collective {
	es := dt.Size()
	count := len(buf) / es
	col := &collective{
		seq: c.seq, buf: buf, dt: dt, op: op, es: es,
		base: count / c.size, rem: count % c.size,
		segElems: max(1, c.segBytes/es),
	}
	if largest := col.base + min(col.rem, 1); largest > 0 {
		col.nseg = (largest + col.segElems - 1) / col.segElems
	}
	copy(col.hdr[:], hdrMagic)
	binary.LittleEndian.PutUint64(col.hdr[4:], col.seq)
	binary.LittleEndian.PutUint64(col.hdr[12:], uint64(count))
	col.hdr[20], col.hdr[21] = byte(dt), byte(op)
	return col
}

// segment returns segment k of chunk i, possibly empty.
func (col *collective) segment(i, k int) []byte {
	off := i*col.base + min(i, col.rem)
	n := col.base
	if i < col.rem {
		n++
	}
	lo := k * col.segElems
	if lo >= n {
		return nil
	}
	hi := min(lo+col.segElems, n)
	return col.buf[(off+lo)*col.es : (off+hi)*col.es]
}

// The ring schedule: in step t of 2(n-1), rank r sends chunk (r-t) mod n
// and receives chunk (r-t-1) mod n. Steps 0..n-2 are the reduce-scatter
// (received data is added to the buffer), steps n-1..2n-3 the all-gather
// (received data lands in the buffer directly). The chunk a rank sends in
// step t is the one it received in step t-1, so segment k of step t waits
// only for segment k of step t-1.

// sendAll sends the header and this rank's side of the schedule to the
// successor. It runs on the caller's goroutine.
func (c *Comm) sendAll(col *collective) error {
	n := c.size
	// The header and segment 0 of step 0 leave in one system call.
	first := net.Buffers{col.hdr[:], col.segment(c.rank, 0)}
	if _, err := first.WriteTo(c.send); err != nil {
		return c.ioError(col, mod(c.rank+1, n), "send header to", err)
	}
	for t := range 2 * (n - 1) {
		i := mod(c.rank-t, n)
		for k := range col.nseg {
			if t == 0 && k == 0 {
				c.sent.add()
				continue
			}
			if t > 0 {
				if err := c.await(&c.received, (t-1)*col.nseg+k+1); err != nil {
					return err
				}
			}
			if seg := col.segment(i, k); len(seg) > 0 {
				if _, err := c.send.Write(seg); err != nil {
					return c.ioError(col, mod(c.rank+1, n), fmt.Sprintf("send step %d/%d (chunk %d segment %d) to", t+1, 2*(n-1), i, k), err)
				}
			}
			c.sent.add()
		}
	}
	return nil
}

// progress counts the segments one side of a collective has finished;
// wake tells a waiting other side that it moved.
type progress struct {
	n    atomic.Int64
	wake chan struct{}
}

func newProgress() progress { return progress{wake: make(chan struct{}, 1)} }

func (p *progress) add() {
	p.n.Add(1)
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *progress) reset() {
	p.n.Store(0)
	select {
	case <-p.wake:
	default:
	}
}

// await blocks until p has counted n segments or the Comm fails.
func (c *Comm) await(p *progress, n int) error {
	for p.n.Load() < int64(n) {
		select {
		case <-p.wake:
		case <-c.done:
			return c.Err()
		}
	}
	return nil
}

// receive is the receiver goroutine. Between collectives it waits for the
// next header, so a predecessor that goes away is noticed at once; then it
// waits for the matching AllReduce and receives its side of the schedule.
func (c *Comm) receive() {
	defer c.wg.Done()
	staging := make([]byte, max(c.segBytes, 8))
	var hdr [hdrLen]byte
	var received int64 // collectives fully received
	for {
		if _, err := io.ReadFull(c.recv, hdr[:]); err != nil {
			prev := mod(c.rank-1, c.size)
			c.fail(lostPeer(prev, fmt.Errorf("rank %d: read header from rank %d: %w: %w", c.rank, prev, classify(err), err)))
			return
		}
		if string(hdr[:4]) == byeMagic {
			prev := mod(c.rank-1, c.size)
			c.neighbourClosed(failure.Peer(prev, failure.PeerClosed, fmt.Errorf("rank %d: %w: rank %d closed its communicator", c.rank, failure.ErrPeer, prev)), received)
			return
		}
		var col *collective
		select {
		case col = <-c.reqs:
		case <-c.done:
			return
		}
		err := c.receiveAll(col, &hdr, staging)
		if err == nil {
			received++
			c.recv.SetReadDeadline(time.Time{}) // idle until the next AllReduce
		} else {
			c.fail(err)
		}
		c.results <- err
		if err != nil {
			return
		}
	}
}

// receiveAll checks the predecessor's header and receives this rank's side
// of the schedule, reducing through staging in the reduce-scatter.
func (c *Comm) receiveAll(col *collective, hdr *[hdrLen]byte, staging []byte) error {
	if err := c.checkHeader(col, hdr); err != nil {
		return err
	}
	n := c.size
	for t := range 2 * (n - 1) {
		i := mod(c.rank-t-1, n)
		for k := range col.nseg {
			seg := col.segment(i, k)
			switch {
			case len(seg) == 0:
			case t < n-1: // reduce-scatter
				tmp := staging[:len(seg)]
				if err := c.read(col, tmp, t, i, k); err != nil {
					return err
				}
				reduce.Add(col.dt, seg, seg, tmp)
				if t == n-2 && col.op == reduce.Avg {
					reduce.Div(col.dt, seg, n) // this rank owns chunk i now
				}
			default: // all-gather
				// This rank sent seg in step t-n+1, and the data that
				// replaces it cannot arrive before that: the wait is short,
				// and orders the two in Go's memory model too.
				if err := c.await(&c.sent, (t-n+1)*col.nseg+k+1); err != nil {
					return err
				}
				if err := c.read(col, seg, t, i, k); err != nil {
					return err
				}
			}
			c.received.add()
		}
	}
	return nil
}

// read fills dst from the predecessor: segment k of chunk i in step t.
func (c *Comm) read(col *collective, dst []byte, t, i, k int) error {
	if _, err := io.ReadFull(c.recv, dst); err != nil {
		return c.ioError(col, mod(c.rank-1, c.size), fmt.Sprintf("receive step %d/%d (chunk %d segment %d) from", t+1, 2*(c.size-1), i, k), err)
	}
	return nil
}

// checkHeader compares the predecessor's header with this rank's.
func (c *Comm) checkHeader(col *collective, got *[hdrLen]byte) error {
	if *got == col.hdr {
		return nil
	}
	prev := mod(c.rank-1, c.size)
	if string(got[:4]) != hdrMagic {
		return fmt.Errorf("all-reduce #%d on rank %d: %w: rank %d sent %x, not a header", col.seq, c.rank, failure.ErrPeer, prev, got[:])
	}
	seq := binary.LittleEndian.Uint64(got[4:])
	count := binary.LittleEndian.Uint64(got[12:])
	return fmt.Errorf("all-reduce #%d on rank %d: %w: rank %d is at #%d with %d x %v, %v; this rank has %d x %v, %v",
		col.seq, c.rank, failure.ErrMismatch, prev, seq, count, reduce.DType(got[20]), reduce.Op(got[21]),
		len(col.buf)/col.es, col.dt, col.op)
}

// watchSuccessor reads the connection to the successor, which carries no
// data this way, so that the Comm fails as soon as the successor goes away.
func (c *Comm) watchSuccessor() {
	defer c.wg.Done()
	var b [1]byte
	_, err := c.send.Read(b[:])
	if err == nil && b[0] == byeByte {
		// It has received everything this rank sent it: nothing in flight
		// needs it any more.
		next := mod(c.rank+1, c.size)
		c.neighbourClosed(failure.Peer(next, failure.PeerClosed, fmt.Errorf("rank %d: %w: rank %d closed its communicator", c.rank, failure.ErrPeer, next)), -1)
		return
	}
	next := mod(c.rank+1, c.size)
	if err == nil {
		c.fail(fmt.Errorf("rank %d: connection to rank %d: %w: unexpected data", c.rank, next, failure.ErrPeer))
		return
	}
	c.fail(failure.Peer(next, failure.PeerLost, fmt.Errorf("rank %d: connection to rank %d: %w: %w", c.rank, next, classify(err), err)))
}

// ioError is an I/O error of a collective with peer: what is "send ... to"
// or "receive ... from", completed with the peer's rank.
func (c *Comm) ioError(col *collective, peer int, what string, err error) error {
	return lostPeer(peer, fmt.Errorf("all-reduce #%d on rank %d: %s rank %d: %w: %w", col.seq, c.rank, what, peer, classify(err), err))
}

// lostPeer makes err, an I/O error with peer, a failure.PeerError (failure.PeerLost)
// unless it is a timeout: a deadline says nothing about who failed.
func lostPeer(peer int, err error) error {
	if errors.Is(err, failure.ErrTimeout) {
		return err
	}
	return failure.Peer(peer, failure.PeerLost, err)
}

// classify maps an I/O error to failure.ErrTimeout (a deadline) or failure.ErrPeer. The
// kernel's ETIMEDOUT is failure.ErrPeer: the peer's host acknowledged nothing for
// Config.LinkTimeout, which the message says, since "connection timed out"
// alone reads like the collective's own deadline.
func classify(err error) error {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return failure.ErrTimeout
	case errors.Is(err, syscall.ETIMEDOUT): // keepalive probes went unanswered
		return fmt.Errorf("%w: its host stopped answering (link down or host frozen)", failure.ErrPeer)
	}
	return failure.ErrPeer
}

func mod(a, n int) int { return ((a % n) + n) % n }
