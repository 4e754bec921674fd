package shm

import (
	"fmt"
	"sync/atomic"

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

// runBroadcast copies root's buffer into the others': with single copy,
// each rank reads it straight from root's memory; staged, root copies it
// through its slot, a whole ring entry (world segments) per step. The
// counters keep their meaning for the collectives around it: every rank
// ends with in, red and done at the last step, as after an all-reduce.
func (c *Comm) runBroadcast(j *job, root int) error {
	if c.direct && int64(len(j.buf)) >= c.directMin {
		return c.broadcastDirect(j, root)
	}
	entry := c.world * c.seg // one ring entry of a slot
	steps := max(1, (len(j.buf)+entry-1)/entry)
	me := c.ctl[c.rank]
	for k := range steps {
		t := j.base + uint32(k)
		lo, hi := min(k*entry, len(j.buf)), min((k+1)*entry, len(j.buf))
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
			copy(c.slots[root][off:off+hi-lo], j.buf[lo:hi])
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
		copy(j.buf[lo:hi], c.slots[root][off:off+hi-lo])
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

// checkPeers is the root's end of a broadcast: it waits for every peer to
// have taken the first step, compares their headers with its own, and then
// publishes red (end), after which a peer may publish its next header.
func (c *Comm) checkPeers(j *job, me rankCtl, end uint32) error {
	for p := range c.world {
		if p == c.rank {
			continue
		}
		if err := c.await(j, 0, p, c.ctl[p].in, j.base+1, "start the broadcast"); err != nil {
			return err
		}
		if err := c.checkHeader(j, p); err != nil {
			return err
		}
	}
	c.publish(me.red, end)
	return nil
}

// broadcastDirect is runBroadcast's single copy: root publishes its
// buffer's address; the others read it and say done; root returns once all
// have, so nobody reads its buffer afterwards.
func (c *Comm) broadcastDirect(j *job, root int) error {
	me := c.ctl[c.rank]
	next := j.base + 1
	if c.rank == root {
		atomic.StoreUint64(me.addr, uint64(addrOf(j.buf)))
		c.publish(me.in, next)
		if err := c.checkPeers(j, me, next); err != nil {
			return err
		}
		for p := range c.world {
			if p == root {
				continue
			}
			if err := c.await(j, 0, p, c.ctl[p].done, next, "read the broadcast"); err != nil {
				return err
			}
		}
		c.publish(me.done, next)
		c.step = next
		return nil
	}
	if err := c.await(j, 0, root, c.ctl[root].in, next, "publish what it broadcasts"); err != nil {
		return err
	}
	if err := c.checkHeader(j, root); err != nil {
		return err
	}
	src := peer{rank: root, pid: int(atomic.LoadUint32(c.ctl[root].pid)), addr: uintptr(atomic.LoadUint64(c.ctl[root].addr))}
	if err := vmRead(src.pid, j.buf, src.addr); err != nil {
		return c.peerMemError(src, err)
	}
	c.publish(me.in, next)
	c.publish(me.red, next)
	c.publish(me.done, next)
	c.step = next
	return nil
}
