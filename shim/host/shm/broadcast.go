package shm

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// broadcastOp marks a broadcast in the collective header's op word (with the
// root's rank in the low bits), so that ranks that disagree on whether a
// collective is an all-reduce or a broadcast, or on its root, see a
// mismatch.
const broadcastOp = 1 << 31

// opName says what a header's op word means, for errors.
func opName(op uint32) string {
	if op&broadcastOp != 0 {
		return fmt.Sprintf("broadcast from rank %d", op&^broadcastOp)
	}
	return reduce.Op(op).String()
}

// runBroadcast copies root's buffers into the others': with single copy,
// each rank reads them straight from root's memory, but for a share root
// writes into it (broadcastDirect); staged, root copies
// them through its slot, a whole ring entry (world segments) per step. The
// counters keep their meaning for the collectives around it: every rank
// ends with in, red and done at the last step, as after an all-reduce.
func (c *Comm) runBroadcast(j *job, root int) error {
	if c.direct && int64(j.size) >= c.directMin {
		return c.broadcastDirect(j, root)
	}
	entry := c.world * c.seg // one ring entry of a slot
	steps := max(1, (j.size+entry-1)/entry)
	me := c.ctl[c.rank]
	for k := range steps {
		t := j.base + uint32(k)
		lo, hi := min(k*entry, j.size), min((k+1)*entry, j.size)
		if c.rank == root {
			for p := range c.world {
				if p == root {
					continue
				}
				if err := c.await(j, k, p, c.ctl[p].done, t-depth+1, "copy out an earlier entry"); err != nil {
					return err
				}
			}
			off := int(t%depth) * entry
			j.vec.gather(c.slots[root][off:off+hi-lo], lo)
			c.publish(me.in, t+1)
			c.publish(me.done, t+1)
			continue
		}
		if err := c.await(j, k, root, c.ctl[root].in, t+1, "publish what it broadcasts"); err != nil {
			return err
		}
		if k == 0 {
			if err := c.checkHeader(j, root); err != nil {
				return err
			}
		}
		off := int(t%depth) * entry
		j.vec.scatter(lo, c.slots[root][off:off+hi-lo])
		c.publish(me.in, t+1)
		c.publish(me.red, t+1)
		c.publish(me.done, t+1)
	}
	end := j.base + uint32(steps)
	if c.rank == root {
		// The root reads nothing, so it checks the peers' headers here,
		// before its red lets them publish their next ones.
		if err := c.checkPeers(j, me, end); err != nil {
			return err
		}
	}
	c.step = end
	return nil
}

// checkPeers is the root's end of a staged broadcast: it waits for every
// peer to have taken the first step, compares their headers with its own,
// and then publishes red (end), after which a peer may publish its next
// header.
func (c *Comm) checkPeers(j *job, me rankCtl, end uint32) error {
	if _, err := c.startedPeers(j); err != nil {
		return err
	}
	c.publish(me.red, end)
	return nil
}

// startedPeers waits for every peer but this rank to have published in for
// the collective's first step, checks each one's header, and says where
// each one's buffers (a direct broadcast's table) are.
func (c *Comm) startedPeers(j *job) ([]peer, error) {
	peers := make([]peer, 0, c.world-1)
	for p := range c.world {
		if p == c.rank {
			continue
		}
		if err := c.await(j, 0, p, c.ctl[p].in, j.base+1, "start the broadcast"); err != nil {
			return nil, err
		}
		if err := c.checkHeader(j, p); err != nil {
			return nil, err
		}
		peers = append(peers, peer{rank: p, pid: int(atomic.LoadUint32(c.ctl[p].pid)),
			addr: uintptr(atomic.LoadUint64(c.ctl[p].addr))})
	}
	return peers, nil
}

// defaultPushMin is the least the root writes into each peer in a direct
// broadcast: below it a peer reads everything, as the root's extra table
// read and system call cost more than the copy they take off the peer (2
// processes on the 2-core VM: 64 KiB took 8.4 µs read whole, 9.2 µs
// split; 256 KiB 23 µs against 15).
const defaultPushMin = 64 << 10

// pushCut is where the root's part of a direct broadcast of size bytes
// begins: each peer reads the bytes before it from the root's buffers, and
// the root writes the rest into every peer's, so that two cores copy at
// once. With world-1 peers the root's part is a world-th of the size
// (page-aligned): the root then copies as many bytes in all as each peer.
// On the 2-core VM, 2 processes, 4 MiB from memory went at 3.5-3.9 GB/s
// with the peer reading all, 5.3-6.4 split (BenchmarkBroadcast's
// procs-direct-cold rows; docs/benchmarks.md).
func pushCut(size, world, pushMin int) int {
	part := size / world &^ 4095
	if part < pushMin {
		return size
	}
	return size - part
}

// broadcastDirect is runBroadcast's single copy. Every rank publishes the
// address of a table of its buffers (table) and opens its gate; each peer
// reads the root's table, then the bytes before pushCut straight from the
// root's buffers with process_vm_readv, while the root writes the rest
// into every peer's buffers with process_vm_writev, both a piece
// (copyPiece) at a time. The root publishes red once it has written, each
// peer done once it has read and, when the root writes a part, seen that
// red; the root returns once every peer is done, so nobody reads its
// memory afterwards, and a peer once nobody writes into its own.
func (c *Comm) broadcastDirect(j *job, root int) (err error) {
	me := c.ctl[c.rank]
	next := j.base + 1
	cut := pushCut(j.size, c.world, c.pushMin)
	t := table(j.vec)
	defer runtime.KeepAlive(t) // the others read it until their done (root), until root's red (a peer)
	atomic.StoreUint64(me.addr, uint64(uintptr(unsafe.Pointer(&t[0]))))
	if c.rank == root {
		c.publish(me.in, next)
		peers, err := c.startedPeers(j)
		if err != nil {
			return err
		}
		if cut < j.size {
			for _, p := range peers {
				if err := c.pushPart(j, p, next, cut); err != nil {
					return err
				}
			}
		}
		c.publish(me.red, next)
		for _, p := range peers {
			if err := c.await(j, 0, p.rank, c.ctl[p.rank].done, next, "read the broadcast"); err != nil {
				return err
			}
		}
		c.publish(me.done, next)
		c.step = next
		return nil
	}
	c.openGate(next)
	defer func() {
		if gerr := c.closeGate(j); gerr != nil && err == nil {
			err = gerr
		}
	}()
	c.publish(me.in, next)
	if err := c.await(j, 0, root, c.ctl[root].in, next, "publish what it broadcasts"); err != nil {
		return err
	}
	if err := c.checkHeader(j, root); err != nil {
		return err
	}
	src := peer{rank: root, pid: int(atomic.LoadUint32(c.ctl[root].pid)), addr: uintptr(atomic.LoadUint64(c.ctl[root].addr))}
	remote, err := readTable(src.pid, src.addr, j.size)
	if err != nil {
		return c.peerMemError(src, err)
	}
	from := remotePieces(sliceRemote(remote, 0, cut), copyPiece)
	for i, into := range j.vec.slice(0, cut).pieces(copyPiece) {
		if err := c.check(j, -1); err != nil {
			return fmt.Errorf("single copy: %w", err)
		}
		if err := vmReadVec(src.pid, into, from[i]); err != nil {
			return c.peerMemError(src, err)
		}
	}
	// A root that failed while this rank read may have returned, and its
	// caller changed the bytes read: it raised the abort flag first.
	if err := c.check(j, -1); err != nil {
		return fmt.Errorf("single copy: %w", err)
	}
	c.publish(me.red, next)
	if cut < j.size {
		if err := c.await(j, 0, root, c.ctl[root].red, next, "write its part of the broadcast into this rank's buffers"); err != nil {
			return err
		}
	}
	c.publish(me.done, next)
	c.step = next
	return nil
}

// copyPiece bounds one copy between two ranks' buffers in a direct
// broadcast, as directBounce bounds the all-reduce's: between pieces a rank
// looks at Abort, its context and the deadline, and a peer that leaves
// waits for one write into it at most (closeGate).
const copyPiece = 4 << 20

// pushPart writes the root's bytes from cut on into peer p's buffers,
// through p's gate for step, a piece at a time.
func (c *Comm) pushPart(j *job, p peer, step uint32, cut int) error {
	remote, err := readTable(p.pid, p.addr, j.size)
	if err != nil {
		// A peer that has left may have dropped its table: its gate says
		// so, and the abort flag who failed first.
		if atomic.LoadUint32(c.ctl[p.rank].gate) != step {
			return c.firstFailure(j, leftCollective(p))
		}
		return c.peerMemError(p, err)
	}
	into := remotePieces(sliceRemote(remote, cut, j.size), copyPiece)
	for i, from := range j.vec.slice(cut, j.size).pieces(copyPiece) {
		if err := c.check(j, -1); err != nil {
			return fmt.Errorf("single copy: %w", err)
		}
		if err := c.writePeer(p, step, func() error { return vmWriteVec(p.pid, from, into[i]) }); err != nil {
			return c.firstFailure(j, err)
		}
	}
	return nil
}

// firstFailure is the error of a rank that could not write into a peer (err):
// the abort flag's or the deadline's, when one is there, since a peer that
// left the collective may have left for another rank's failure, which the
// flag names.
func (c *Comm) firstFailure(j *job, err error) error {
	if cerr := c.check(j, -1); cerr != nil {
		return fmt.Errorf("single copy: %w", cerr)
	}
	return err
}
