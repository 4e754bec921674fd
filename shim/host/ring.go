package host

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// The ring carries the data when shared memory does not (carrier.go): a
// reduce-scatter then an all-gather over the Comm's own connections,
// pipelined by segment. Its receiver goroutine is also what notices a
// predecessor that goes away, whatever carries the data.

// Every collective starts with a header from each rank to its successor:
// magic "DDPC", sequence number u64, count u64, dtype u8, op u8, two zero
// bytes; little-endian. A broadcast's op byte is hdrBroadcast and its last
// two bytes the root's rank (its low 16 bits). Ranks whose headers differ
// disagree.
const (
	hdrMagic = "DDPC"
	hdrLen   = 24
)

// ringCarrier is the carrier when the ring itself carries the data. It is
// part of its Comm: the Comm's connections and receiver are the ring's, and
// the Comm's fail closes them, so abort and close have nothing of their own
// to do.
type ringCarrier struct{ c *Comm }

var _ carrier = ringCarrier{}

func newRingCarrier(c *Comm) carrier { return ringCarrier{c} }

func (ringCarrier) route() route { return route{transport: "tcp", onRing: true} }
func (ringCarrier) abort(error)  {}
func (ringCarrier) close()       {}

// allReduce runs the ring schedule on the caller's goroutine, the receiver
// goroutine receiving.
func (r ringCarrier) allReduce(ctx context.Context, buf []byte, dt reduce.DType, op reduce.Op) error {
	return r.c.runRing(ctx, newCollective(r.c, buf, dt, op))
}

// runRing runs col, an all-reduce or a broadcast, on the caller's
// goroutine (which sends), the receiver goroutine receiving. A failure
// fails the Comm, and the error is its first cause, whichever side saw it.
func (c *Comm) runRing(ctx context.Context, col *collective) error {
	deadline := time.Now().Add(c.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.recv.SetReadDeadline(deadline) // the receiver clears it when done
	c.send.SetWriteDeadline(deadline)
	if ctx.Done() != nil {
		defer context.AfterFunc(ctx, func() {
			c.fail(fmt.Errorf("%s #%d on rank %d: %w", col.what(), col.seq, c.rank, ctxError(ctx, nil)))
		})()
	}

	c.received.reset()
	c.sent.reset()
	// The receiver takes col once the predecessor's header is in, which
	// may be after this rank has sent its whole part.
	c.reqs <- col
	var serr error
	if col.root >= 0 {
		serr = c.sendBroadcast(col)
	} else {
		serr = c.sendAll(col)
	}
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
// elements (the last ones short or empty). A broadcast (root >= 0,
// ring_broadcast.go) cuts its buffers into segs instead.
type collective struct {
	seq            uint64
	buf            []byte
	dt             reduce.DType
	op             reduce.Op
	root           int      // the broadcast's root; -1 for an all-reduce
	segs           [][]byte // the broadcast's segments
	hdr            [hdrLen]byte
	es, base, rem  int
	segElems, nseg int
}

func newCollective(c *Comm, buf []byte, dt reduce.DType, op reduce.Op) *collective {
	es := dt.Size()
	count := len(buf) / es
	col := &collective{
		seq: c.seq, buf: buf, dt: dt, op: op, root: -1, es: es,
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
	if col.root >= 0 {
		return c.receiveBroadcast(col)
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
		return fmt.Errorf("%s #%d on rank %d: %w: rank %d sent %x, not a header", col.what(), col.seq, c.rank, failure.ErrPeer, prev, got[:])
	}
	seq := binary.LittleEndian.Uint64(got[4:])
	count := binary.LittleEndian.Uint64(got[12:])
	return fmt.Errorf("%s #%d on rank %d: %w: rank %d is at #%d with %d x %v, %s; this rank has %d x %v, %s",
		col.what(), col.seq, c.rank, failure.ErrMismatch, prev, seq, count, reduce.DType(got[20]), hdrKind(got),
		binary.LittleEndian.Uint64(col.hdr[12:]), col.dt, hdrKind(&col.hdr))
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
	return lostPeer(peer, fmt.Errorf("%s #%d on rank %d: %s rank %d: %w: %w", col.what(), col.seq, c.rank, what, peer, classify(err), err))
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
