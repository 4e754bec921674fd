package host

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"

	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// A broadcast over the ring is a chain from the root: the root sends its
// buffer to its successor a segment at a time, and every other rank
// receives each segment straight into its buffer and forwards it, unless
// its successor is the root. Each byte crosses each link but the one into
// the root once, and the segments pipeline along the chain. Every rank
// still sends its header, so that every receiver compares one and the
// receiver goroutine's framing stays the all-reduce's.

// hdrBroadcast is a broadcast's op byte in the header: no reduce.Op has it.
const hdrBroadcast = 0xff

// newBroadcast describes a broadcast of bufs from root: each buffer cut
// into segments of segElems elements at most, none of them empty. Ranks
// that cut the same bytes differently still agree: the stream carries
// them in order.
func newBroadcast(c *Comm, bufs [][]byte, dt reduce.DType, root int) *collective {
	col := newCollective(c, nil, dt, reduce.Sum)
	col.root = root
	seg, count := col.segElems*col.es, 0
	for _, b := range bufs {
		count += len(b) / col.es
		for off := 0; off < len(b); off += seg {
			col.segs = append(col.segs, b[off:min(off+seg, len(b))])
		}
	}
	col.nseg = len(col.segs)
	binary.LittleEndian.PutUint64(col.hdr[12:], uint64(count))
	col.hdr[21] = hdrBroadcast
	binary.LittleEndian.PutUint16(col.hdr[22:], uint16(root))
	return col
}

// broadcastSegment returns segment k of a broadcast.
func (col *collective) broadcastSegment(k int) []byte { return col.segs[k] }

// what names the collective in errors.
func (col *collective) what() string {
	if col.root >= 0 {
		return fmt.Sprintf("broadcast from rank %d", col.root)
	}
	return "all-reduce"
}

// hdrKind says what a header's op and root bytes mean, for errors.
func hdrKind(h *[hdrLen]byte) string {
	if h[21] == hdrBroadcast {
		return fmt.Sprintf("broadcast from rank %d", binary.LittleEndian.Uint16(h[22:]))
	}
	return reduce.Op(h[21]).String()
}

// broadcast runs the chain on the caller's goroutine (runRing).
func (r ringCarrier) broadcast(ctx context.Context, bufs [][]byte, dt reduce.DType, root int) error {
	return r.c.runRing(ctx, newBroadcast(r.c, bufs, dt, root))
}

// sendBroadcast sends the header and, on the root, the buffer; elsewhere
// it forwards each segment the receiver has finished, unless the successor
// is the root, which needs none.
func (c *Comm) sendBroadcast(col *collective) error {
	next := mod(c.rank+1, c.size)
	forward := c.rank != col.root && next != col.root
	if c.rank == col.root && col.nseg > 0 {
		// The header and the first segment leave in one system call.
		first := net.Buffers{col.hdr[:], col.broadcastSegment(0)}
		if _, err := first.WriteTo(c.send); err != nil {
			return c.ioError(col, next, "send header and segment 0 to", err)
		}
	} else if _, err := c.send.Write(col.hdr[:]); err != nil {
		return c.ioError(col, next, "send header to", err)
	}
	if c.rank != col.root && !forward {
		return nil
	}
	for k := range col.nseg {
		if c.rank == col.root && k == 0 {
			continue
		}
		if forward {
			if err := c.await(&c.received, k+1); err != nil {
				return err
			}
		}
		if _, err := c.send.Write(col.broadcastSegment(k)); err != nil {
			return c.ioError(col, next, fmt.Sprintf("send segment %d of %d to", k, col.nseg), err)
		}
		c.sent.add()
	}
	return nil
}

// receiveBroadcast receives the buffer from the predecessor, a segment at a
// time, straight into this rank's buffer; the root receives nothing but the
// header (receiveAll checked it).
func (c *Comm) receiveBroadcast(col *collective) error {
	if c.rank == col.root {
		return nil
	}
	prev := mod(c.rank-1, c.size)
	for k := range col.nseg {
		if _, err := io.ReadFull(c.recv, col.broadcastSegment(k)); err != nil {
			return c.ioError(col, prev, fmt.Sprintf("receive segment %d of %d from", k, col.nseg), err)
		}
		c.received.add()
	}
	return nil
}
