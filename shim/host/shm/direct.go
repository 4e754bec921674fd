package shm

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// The single-copy path. The staged path copies every byte through the
// segment twice: into the slot, then the owner's result out of it, about
// three reads and three writes of the buffer per rank, where an all-reduce
// needs one of each (memceiling.c says why). With cross-memory attach
// (process_vm_readv and process_vm_writev, the kernel copying straight
// between two processes' memory) the owner of chunk r reads chunk r of every
// peer's own buffer into a bounce buffer that stays in cache, adds it into
// its own buffer, and writes the result, still in cache, into every peer's
// buffer: each rank's buffer is read once and written once, and a result
// never goes back to memory to be read again. (Pulling the results instead,
// every rank reading the owners' chunks, reads them from memory a second
// time: on a 2-core VM, 2 processes at 64 MiB, 3.5-4.4 GB/s busbw against
// pushing's 4.3-6.4.) It needs ptrace access to the peers (same user, and
// Yama's ptrace_scope 0, or a container that allows it), so Negotiate probes
// it once and every rank takes it only if all can.
//
// Writing into another process's memory is safe only while that process is
// in the collective: one that gave up (abort, timeout) may reuse its buffer
// at once. So each rank holds a gate open for the collective it is in, and
// a writer says whom it is writing to before it looks at the gate; a rank
// that leaves closes its gate, then waits for the writes already past it
// (one piece each: 256 KiB in an all-reduce, 4 MiB in a broadcast) before
// it returns (gate.go).
//
// The order of the additions is the staged path's (the owner's data, then
// the peers' in rank order), so both paths give bit-identical results.

// directBounce is the bounce buffer: a peer's segment is read into it and
// added into the owner's buffer while both are in cache.
const directBounce = 256 << 10

// probeWord is what rank's probe word holds: a peer that reads it through
// process_vm_readv knows it reached the right process.
func probeWord(rank int) uint64 { return 0x4444_5053_0000_0000 | uint64(rank) }

// cma verdicts, in a rank's control block.
const (
	cmaUnknown = 0
	cmaYes     = 1
	cmaNo      = 2
)

// Negotiate decides, on every rank together, whether collectives of at least
// Config.DirectMin bytes take the single-copy path: each rank reads every
// peer's probe word with process_vm_readv and publishes whether it could,
// then waits for every peer's verdict. Every rank must call it once, after
// all have mapped the segment and before the first AllReduce; it returns
// whether the path is on, and an error only when a peer's verdict did not
// come by ctx's end (nothing changed then: the staged path carries all).
func (c *Comm) Negotiate(ctx context.Context) (bool, error) {
	c.life.RLock()
	defer c.life.RUnlock()
	if c.mem == nil {
		return false, fmt.Errorf("shm negotiate on rank %d: %w", c.rank, failure.ErrClosed)
	}
	j := job{ctx: ctx, deadline: time.Now().Add(c.timeout)}
	if d, ok := ctx.Deadline(); ok && d.Before(j.deadline) {
		j.deadline, j.ctxDeadline = d, true
	}
	verdict, why := uint32(cmaYes), error(nil)
	if c.directMin < 0 {
		verdict, why = cmaNo, errors.New("disabled by configuration")
	}
	for p := range c.world {
		if p == c.rank || verdict == cmaNo {
			continue
		}
		// Open publishes the pid (never 0, and below 2^31: "reached" 1).
		if err := c.await(&j, 0, p, c.ctl[p].pid, 1, "map the segment"); err != nil {
			return false, fmt.Errorf("shm negotiate on rank %d: %w", c.rank, err)
		}
		if err := c.probePeer(p); err != nil {
			verdict, why = cmaNo, err
		}
	}
	c.publish(c.ctl[c.rank].cma, verdict)
	all := verdict == cmaYes
	for p := range c.world {
		if p == c.rank {
			continue
		}
		if err := c.await(&j, 0, p, c.ctl[p].cma, cmaYes, "say whether it reaches its peers' memory"); err != nil {
			return false, fmt.Errorf("shm negotiate on rank %d: %w", c.rank, err)
		}
		all = all && atomic.LoadUint32(c.ctl[p].cma) == cmaYes
	}
	c.direct = all
	c.whyStaged = why
	if all {
		c.bounce = make([]byte, directBounce)
	}
	return all, nil
}

// WhyStaged says why this rank could not take the single-copy path (nil when
// it could, or when a peer could not).
func (c *Comm) WhyStaged() error { return c.whyStaged }

// Direct reports whether Negotiate turned the single-copy path on.
func (c *Comm) Direct() bool { return c.direct }

// probePeer reads peer p's probe word from its memory and writes it back.
func (c *Comm) probePeer(p int) error {
	pid := int(atomic.LoadUint32(c.ctl[p].pid))
	addr := uintptr(atomic.LoadUint64(c.ctl[p].probe))
	var got uint64
	dst := unsafe.Slice((*byte)(unsafe.Pointer(&got)), 8)
	if err := vmRead(pid, dst, addr); err != nil {
		return fmt.Errorf("read rank %d's memory (pid %d): %w", p, pid, err)
	}
	if got != probeWord(p) {
		return fmt.Errorf("rank %d's probe word at pid %d reads %#x, not %#x: another process (pid namespaces differ?)",
			p, pid, got, probeWord(p))
	}
	// The path writes the results into the peers' buffers too: write the
	// word back as it was (a filter may allow one call and not the other).
	if err := vmWrite(pid, dst, addr); err != nil {
		return fmt.Errorf("write rank %d's memory (pid %d): %w", p, pid, err)
	}
	return nil
}

// runDirect is the single-copy all-reduce of j: the header is published,
// the peers' memory reachable. Ring step j.base+1 is the whole collective:
// in says this rank's gate is open and its buffer address published, red
// that it has read the peers' parts of its chunk, done that it has written
// its chunk's result into every peer's buffer. Before it returns, a rank
// waits for every peer's done: then its buffer holds every result, and no
// peer reads or writes it any more.
func (c *Comm) runDirect(j *job) (err error) {
	me := c.ctl[c.rank]
	next := j.base + 1
	c.openGate(next)
	defer func() {
		if gerr := c.closeGate(j); gerr != nil && err == nil {
			err = gerr
		}
	}()
	atomic.StoreUint64(me.addr, uint64(addrOf(j.buf)))
	c.publish(me.in, next)
	peers := make([]peer, 0, c.world-1)
	for p := range c.world {
		if p == c.rank {
			continue
		}
		if err := c.await(j, 0, p, c.ctl[p].in, next, "publish its buffer"); err != nil {
			return err
		}
		if err := c.checkHeader(j, p); err != nil {
			return err
		}
		peers = append(peers, peer{rank: p, pid: int(atomic.LoadUint32(c.ctl[p].pid)),
			addr: uintptr(atomic.LoadUint64(c.ctl[p].addr))})
	}
	if err := c.reduceOwn(j, peers, next); err != nil {
		return err
	}
	c.publish(me.red, next)
	c.publish(me.done, next)
	for _, p := range peers {
		if err := c.await(j, 0, p.rank, c.ctl[p.rank].done, next, "write its result into this rank's buffer"); err != nil {
			return err
		}
	}
	c.step = next
	return nil
}

// addrOf is where b's bytes are, for a peer's process_vm_readv/_writev (Go
// does not move heap objects, and the caller keeps b alive).
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// peer is where a peer's buffer is, for this collective.
type peer struct {
	rank int
	pid  int
	addr uintptr
}

// reduceOwn reduces this rank's chunk a piece (a bounce buffer's worth) at
// a time: the peers' parts of the piece are read into the bounce buffer and
// added into this rank's buffer, and the result, still in cache, is written
// into every peer's buffer.
func (c *Comm) reduceOwn(j *job, peers []peer, step uint32) error {
	lo, hi := j.chunk(c.rank)
	piece := len(c.bounce) / j.es * j.es
	for off := lo; off < hi; off += piece {
		if err := c.check(j, -1); err != nil {
			return fmt.Errorf("single copy: %w", err)
		}
		end := min(off+piece, hi)
		own := j.buf[off:end]
		for _, p := range peers {
			in := c.bounce[:end-off]
			if err := vmRead(p.pid, in, p.addr+uintptr(off)); err != nil {
				return c.peerMemError(p, err)
			}
			reduce.Add(j.dt, own, own, in)
		}
		if j.op == reduce.Avg {
			reduce.Div(j.dt, own, c.world)
		}
		for _, p := range peers {
			if err := c.writePeer(p, step, func() error { return vmWrite(p.pid, own, p.addr+uintptr(off)) }); err != nil {
				return c.firstFailure(j, err)
			}
		}
	}
	return nil
}

// peerMemError explains a failed read or write of a peer's memory: a peer
// that is gone is that peer's failure, anything else a broken protocol.
func (c *Comm) peerMemError(p peer, err error) error {
	if errors.Is(err, unix.ESRCH) {
		return &failure.PeerError{Rank: p.rank, Kind: failure.PeerLost, Err: fmt.Errorf("%w: rank %d (pid %d) is gone: %w", failure.ErrPeer, p.rank, p.pid, err)}
	}
	return fmt.Errorf("%w: single copy: reach rank %d's buffer (pid %d): %w", failure.ErrPeer, p.rank, p.pid, err)
}

// vmRead copies len(dst) bytes at addr in process pid into dst.
func vmRead(pid int, dst []byte, addr uintptr) error {
	return vmCopy(unix.ProcessVMReadv, "process_vm_readv", pid, dst, addr)
}

// vmWrite copies src to addr in process pid.
func vmWrite(pid int, src []byte, addr uintptr) error {
	return vmCopy(unix.ProcessVMWritev, "process_vm_writev", pid, src, addr)
}

// vmCopy runs process_vm_readv or _writev until all of local is copied.
func vmCopy(call func(int, []unix.Iovec, []unix.RemoteIovec, uint) (int, error), name string, pid int, local []byte, addr uintptr) error {
	for len(local) > 0 {
		iov := []unix.Iovec{{Base: &local[0]}}
		iov[0].SetLen(len(local))
		remote := []unix.RemoteIovec{{Base: addr, Len: len(local)}}
		n, err := call(pid, iov, remote, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if n == 0 {
			return fmt.Errorf("%s: no progress", name)
		}
		local, addr = local[n:], addr+uintptr(n)
	}
	return nil
}
