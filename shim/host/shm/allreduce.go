package shm

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// Waiting: spin on the counter for up to spinFor (yielding the P now and
// then, so ranks that share a process let each other run, unless the
// caller is on a locked thread: OnLockedThread), then sleep in
// FUTEX_WAIT for up to sleepFor at a time, re-checking abort, ctx and the
// deadline between sleeps.
//
// With the single-copy path on, the peers' pids are known to name them in
// this pid namespace (Negotiate read their memory through them), so a wait
// also looks every livenessEvery whether the peer it waits on still runs:
// a peer killed between two collectives is then seen in milliseconds, not
// at the timeout.
const (
	spinFor       = 20 * time.Microsecond
	sleepFor      = 2 * time.Millisecond
	livenessEvery = 25 // sleeps: about 50 ms
)

// job is one all-reduce in progress.
type job struct {
	ctx         context.Context
	deadline    time.Time
	ctxDeadline bool   // deadline is ctx's
	locked      bool   // the caller's goroutine is locked to its thread (OnLockedThread)
	buf         []byte // an all-reduce's
	vec         vec    // a broadcast's buffers
	size        int    // bytes in all
	dt          reduce.DType
	op          reduce.Op
	hdrOp       uint32 // op as the header says it: op, or broadcastOp|root
	seq         uint32
	base        uint32 // first ring step of this collective
	es          int    // element size
	count       int    // elements
	per, extra  int    // a chunk has per elements, the first extra chunks one more
	segElems    int    // elements per segment
}

// span returns the byte range in buf of segment k of chunk ch (empty past
// the end of the chunk).
func (j *job) span(ch, k int) (lo, hi int) {
	off := ch*j.per + min(ch, j.extra)
	n := j.per
	if ch < j.extra {
		n++
	}
	a := min(k*j.segElems, n)
	b := min(a+j.segElems, n)
	return (off + a) * j.es, (off + b) * j.es
}

// chunk returns the byte range in buf of chunk ch.
func (j *job) chunk(ch int) (lo, hi int) {
	off := ch*j.per + min(ch, j.extra)
	n := j.per
	if ch < j.extra {
		n++
	}
	return off * j.es, (off + n) * j.es
}

// slotSeg returns the bytes of segment ch, ring step t, in rank q's slot.
func (c *Comm) slotSeg(q int, t uint32, ch, n int) []byte {
	off := (int(t%depth)*c.world + ch) * c.seg
	return c.slots[q][off : off+n : off+n]
}

// reached reports whether counter value v has reached want, in serial-number
// order, so the counters may wrap.
func reached(v, want uint32) bool { return int32(v-want) >= 0 }

// run runs collective seq: an all-reduce of bufs[0], or with root >= 0 a
// broadcast of root's bufs.
func (c *Comm) run(ctx context.Context, bufs [][]byte, dt reduce.DType, op reduce.Op, seq uint32, root int) error {
	if err := ctx.Err(); err != nil { // a deadline already passed is a timeout too
		return timeoutErr(err)
	}
	j := job{ctx: ctx, dt: dt, op: op, hdrOp: uint32(op), seq: seq, base: c.step, es: dt.Size(), locked: onLockedThread(ctx)}
	if root >= 0 {
		j.hdrOp = broadcastOp | uint32(root)
		j.vec = bufs
		j.size = j.vec.size()
	} else {
		j.buf = bufs[0]
		j.size = len(j.buf)
	}
	j.count = j.size / j.es
	j.per, j.extra = j.count/c.world, j.count%c.world
	j.segElems = c.seg / j.es
	j.deadline = time.Now().Add(c.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(j.deadline) {
		j.deadline, j.ctxDeadline = d, true
	}

	// Every peer must have checked the last collective's header, which it
	// does at its first step, before this one overwrites it. A collective
	// whose chunks this rank gets nothing back from (empty, or fewer
	// elements than ranks) does not wait for that, so without this a rank
	// could run ahead and a peer would see the next header and report a
	// mismatch. A peer that has reduced every step of the last collective
	// (red reached base) has checked it; usually that is already so.
	for p := range c.world {
		if p != c.rank {
			if err := c.await(&j, 0, p, c.ctl[p].red, j.base, "check the previous header"); err != nil {
				return err
			}
		}
	}

	// Publish this collective's header; the first step's in counter
	// releases it to the peers, which check it before they read anything.
	me := c.ctl[c.rank]
	atomic.StoreUint64(me.count, uint64(j.count))
	atomic.StoreUint32(me.dtype, uint32(dt))
	atomic.StoreUint32(me.op, j.hdrOp)
	atomic.StoreUint32(me.seq, seq)

	if c.world == 1 {
		return nil // the sum and the mean of one buffer are that buffer
	}
	if root >= 0 {
		return c.runBroadcast(&j, root)
	}
	if c.direct && int64(j.size) >= c.directMin {
		return c.runDirect(&j)
	}

	// At least one step, so that even empty collectives compare headers.
	longest := j.per
	if j.extra > 0 {
		longest++
	}
	steps := max(1, (longest+j.segElems-1)/j.segElems)

	// Software pipeline: iteration i publishes the inputs of step i, reduces
	// step i-1 and copies out step i-2, so a rank waits on a peer only when
	// that peer is a whole iteration behind.
	for i := 0; i < steps+2; i++ {
		// A long collective that never blocks still honours Abort, ctx,
		// the deadline and the peers' abort flag.
		if err := c.check(&j, -1); err != nil {
			return fmt.Errorf("segment %d: %w", i, err)
		}
		if i < steps {
			if err := c.stepIn(&j, i); err != nil {
				return err
			}
		}
		if i >= 1 && i <= steps {
			if err := c.stepReduce(&j, i-1); err != nil {
				return err
			}
		}
		if i >= 2 {
			if err := c.stepOut(&j, i-2); err != nil {
				return err
			}
		}
	}
	c.step = j.base + uint32(steps)
	return nil
}

// stepIn copies this rank's parts of the other chunks, segment k, into its
// slot and publishes them.
func (c *Comm) stepIn(j *job, k int) error {
	t := j.base + uint32(k)
	for ch := range c.world {
		if ch == c.rank {
			continue
		}
		lo, hi := j.span(ch, k)
		if lo == hi {
			continue
		}
		// The owner must have reduced what this ring entry held before.
		if err := c.await(j, k, ch, c.ctl[ch].red, t-depth+1, "finish with an earlier input"); err != nil {
			return err
		}
		copy(c.slotSeg(c.rank, t, ch, hi-lo), j.buf[lo:hi])
	}
	c.publish(c.ctl[c.rank].in, t+1)
	return nil
}

// stepReduce reduces this rank's own segment k from the peers' inputs, and
// publishes the result in its slot.
func (c *Comm) stepReduce(j *job, k int) error {
	t := j.base + uint32(k)
	lo, hi := j.span(c.rank, k)
	own := j.buf[lo:hi]
	for p := range c.world {
		if p == c.rank {
			continue
		}
		if err := c.await(j, k, p, c.ctl[p].in, t+1, "publish its input"); err != nil {
			return err
		}
		if k == 0 {
			if err := c.checkHeader(j, p); err != nil {
				return err
			}
		}
		if len(own) > 0 {
			reduce.Add(j.dt, own, own, c.slotSeg(p, t, c.rank, len(own)))
		}
	}
	if len(own) > 0 {
		if j.op == reduce.Avg {
			reduce.Div(j.dt, own, c.world)
		}
		// Every peer must have copied out what this ring entry held before.
		for p := range c.world {
			if p == c.rank {
				continue
			}
			if err := c.await(j, k, p, c.ctl[p].done, t-depth+1, "copy out an earlier result"); err != nil {
				return err
			}
		}
		copy(c.slotSeg(c.rank, t, c.rank, len(own)), own)
	}
	c.publish(c.ctl[c.rank].red, t+1)
	return nil
}

// stepOut copies the other owners' results of segment k into buf.
func (c *Comm) stepOut(j *job, k int) error {
	t := j.base + uint32(k)
	for ch := range c.world {
		if ch == c.rank {
			continue
		}
		lo, hi := j.span(ch, k)
		if lo == hi {
			continue
		}
		if err := c.await(j, k, ch, c.ctl[ch].red, t+1, "publish its result"); err != nil {
			return err
		}
		copy(j.buf[lo:hi], c.slotSeg(ch, t, ch, hi-lo))
	}
	c.publish(c.ctl[c.rank].done, t+1)
	return nil
}

// checkHeader compares peer p's collective header with this rank's.
func (c *Comm) checkHeader(j *job, p int) error {
	h := c.ctl[p]
	seq := atomic.LoadUint32(h.seq)
	count := atomic.LoadUint64(h.count)
	dt := reduce.DType(atomic.LoadUint32(h.dtype))
	op := atomic.LoadUint32(h.op)
	switch {
	case seq != j.seq:
		return fmt.Errorf("rank %d is at collective %d: %w", p, seq, failure.ErrMismatch)
	case count != uint64(j.count) || dt != j.dt || op != j.hdrOp:
		return fmt.Errorf("rank %d has %d %v (%s), this rank %d %v (%s): %w",
			p, count, dt, opName(op), j.count, j.dt, opName(j.hdrOp), failure.ErrMismatch)
	}
	return nil
}

// publish stores v in this rank's counter ctr and wakes the peers sleeping on
// it, if any said so.
func (c *Comm) publish(ctr *uint32, v uint32) {
	atomic.StoreUint32(ctr, v)
	if atomic.LoadUint32(c.ctl[c.rank].waiters) != 0 {
		futexWake(ctr)
	}
}

// await blocks until rank p's counter ctr reaches want, or the collective
// must stop; k (this collective's step) and what describe the wait in errors. A counter that has reached want wins over a stop condition, so a
// peer that publishes and then aborts is still heard.
func (c *Comm) await(j *job, k, p int, ctr *uint32, want uint32, what string) error {
	if reached(atomic.LoadUint32(ctr), want) {
		return nil
	}
	var start time.Time
	for i := 1; ; i++ {
		if reached(atomic.LoadUint32(ctr), want) {
			return nil
		}
		if i%64 == 0 {
			if !j.locked {
				runtime.Gosched()
			}
			if start.IsZero() {
				start = time.Now()
			} else if time.Since(start) > spinFor {
				break
			}
		}
	}
	waiters := c.ctl[p].waiters
	for sleeps := 1; ; sleeps++ {
		err := c.check(j, p)
		if err == nil && c.direct && sleeps%livenessEvery == 0 {
			err = c.liveness(p)
		}
		if err != nil {
			if reached(atomic.LoadUint32(ctr), want) {
				return nil
			}
			return fmt.Errorf("segment %d: wait for rank %d to %s: %w", k, p, what, err)
		}
		// Announce the sleep before the last look at the counter; publish
		// stores the counter before it looks at waiters, so one of the two
		// sees the other.
		atomic.AddUint32(waiters, 1)
		if v := atomic.LoadUint32(ctr); !reached(v, want) {
			futexWait(ctr, v, sleepFor)
		}
		atomic.AddUint32(waiters, ^uint32(0))
		if reached(atomic.LoadUint32(ctr), want) {
			return nil
		}
	}
}

// liveness returns a PeerLost error when rank p's process has exited. Only
// for the single-copy path, whose pids are this namespace's.
func (c *Comm) liveness(p int) error {
	pid := int(atomic.LoadUint32(c.ctl[p].pid))
	if pid == 0 || !gone(pid) {
		return nil
	}
	return &failure.PeerError{Rank: p, Kind: failure.PeerLost,
		Err: fmt.Errorf("%w: rank %d (pid %d) is gone", failure.ErrPeer, p, pid)}
}

// timeoutErr marks ctx's error as failure.ErrTimeout when its deadline
// passed, so a caller tells a timeout from a cancel however early it came.
func timeoutErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", failure.ErrTimeout, err)
	}
	return err
}

// check returns why the collective must stop while waiting on rank p (-1:
// none), or nil.
func (c *Comm) check(j *job, p int) error {
	if err := c.stopErr(); err != nil {
		return err
	}
	if err := j.ctx.Err(); err != nil {
		return timeoutErr(err)
	}
	if p >= 0 && atomic.LoadUint32(c.ctl[p].closed) != 0 {
		return &failure.PeerError{Rank: p, Kind: failure.PeerClosed, Err: fmt.Errorf("%w: rank %d closed its communicator", failure.ErrPeer, p)}
	}
	if a := atomic.LoadUint32(c.abort); a != 0 {
		if a&abortMismatch != 0 {
			return fmt.Errorf("%w: rank %d found that %w", failure.ErrPeer, a&abortRankMask-1, failure.ErrMismatch)
		}
		r := int(a&abortRankMask) - 1
		return &failure.PeerError{Rank: r, Kind: failure.PeerAborted, Err: fmt.Errorf("%w: rank %d raised the abort flag", failure.ErrPeer, r)}
	}
	if time.Now().After(j.deadline) {
		if j.ctxDeadline {
			return fmt.Errorf("%w: %w", failure.ErrTimeout, context.DeadlineExceeded)
		}
		return fmt.Errorf("%w after %v", failure.ErrTimeout, c.timeout)
	}
	return nil
}
