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
// each rank reads them straight from root's memory; staged, root copies
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

// broadcastDirect is runBroadcast's single copy: root publishes the
// address of a table of its buffers (table); each of the others reads the
// table, then every buffer in one process_vm_readv, and says done; root
// returns once all have, so nobody reads its memory afterwards.
func (c *Comm) broadcastDirect(j *job, root int) error {
	me := c.ctl[c.rank]
	next := j.base + 1
	if c.rank == root {
		t := table(j.vec)
		atomic.StoreUint64(me.addr, uint64(uintptr(unsafe.Pointer(&t[0]))))
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
		runtime.KeepAlive(t) // the peers read it until their done
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
	remote, err := readTable(src.pid, src.addr, j.size)
	if err == nil {
		err = vmReadVec(src.pid, j.vec, remote)
	}
	if err != nil {
		return c.peerMemError(src, err)
	}
	c.publish(me.in, next)
	c.publish(me.red, next)
	c.publish(me.done, next)
	c.step = next
	return nil
}
