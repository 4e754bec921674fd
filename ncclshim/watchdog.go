package main

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/ncclshim/cuda"
	"github.com/ddp-agent/ddp-agent/ncclshim/nccl"
	"github.com/ddp-agent/ddp-agent/ncclshim/status"
	"github.com/ddp-agent/ddp-agent/wire"
)

// The NCCL transport's watchdog. ddpshim_allreduce returns once NCCL has
// enqueued the collective; whether it ever finishes is only visible on
// the GPU. So the caller's thread records a CUDA event before and after
// each ncclAllReduce on the stream, and a watchdog goroutine (its own OS
// thread, with the caller's CUDA context bound) polls the oldest end event
// and ncclCommGetAsyncError. A collective that completes becomes a timing
// event for the agent, with its GPU start and end on the host clock. One
// that is not done after the timeout, an asynchronous NCCL error, or a
// failed CUDA call aborts the communicator: kernels waiting for a peer
// return, and the next ddpshim_allreduce fails with the cause, so the
// worker raises in its next hook call and exits instead of hanging for
// PyTorch's ten minutes.
//
// Without a CUDA driver (CPU tests on the fake NCCL without its fake
// driver) there are no events: only the asynchronous error is watched,
// and timing events carry the host enqueue times.

const (
	pollBusy  = time.Millisecond       // while a collective is in flight
	pollIdle  = 100 * time.Millisecond // only the asynchronous error
	reanchor  = 10 * time.Second       // GPU and host clocks drift apart
	eventPool = 64                     // event pairs kept for reuse
)

type eventPair struct{ start, end cuda.Event }

// flight is a collective enqueued on the GPU and not yet seen complete.
type flight struct {
	ev       eventPair
	reported bool // an in-flight event was sent
	step     uint64
	bucket   int32
	bytes    uint64
	dt       uint8
	arrive   time.Time
	enqueued time.Time
}

type watchdog struct {
	c       *comm
	nc      *nccl.Comm
	cu      *cuda.Lib // nil: no events
	timeout time.Duration

	mu       sync.Mutex
	cuCtx    cuda.Context // the caller's, taken at the first collective
	noEvents bool         // the caller has no CUDA context: host times only
	inflight []flight
	free     []eventPair
	failed   bool

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
}

func newWatchdog(c *comm, nc *nccl.Comm, cu *cuda.Lib) *watchdog {
	wd := &watchdog{c: c, nc: nc, cu: cu, timeout: c.cfg.timeout(), noEvents: cu == nil,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go wd.run()
	return wd
}

// events returns a pair of events for a collective on stream, made in the
// calling thread's context; ok is false when this comm runs without
// events.
func (wd *watchdog) events(stream unsafe.Pointer) (ev eventPair, ok bool, err error) {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	if wd.noEvents {
		return eventPair{}, false, nil
	}
	// Events are made and recorded in the calling thread's context. The
	// CUDA runtime has made one current on every thread PyTorch runs CUDA
	// work on; a thread without one gets the communicator's.
	ctx, err := wd.cu.Current(stream)
	if err != nil {
		return eventPair{}, false, status.Errorf(status.Unavailable, "CUDA context of the calling thread: %w", err)
	}
	switch {
	case !ctx.Valid() && !wd.cuCtx.Valid():
		wd.noEvents = true
		wd.c.log.Warn("no CUDA context on the calling thread: no GPU-side timing or hang detection")
		return eventPair{}, false, nil
	case !ctx.Valid():
		if err := wd.cu.Bind(wd.cuCtx); err != nil {
			return eventPair{}, false, status.Errorf(status.Unavailable, "CUDA context for the calling thread: %w", err)
		}
	case !wd.cuCtx.Valid():
		wd.cuCtx = ctx
	}
	if n := len(wd.free); n > 0 {
		ev = wd.free[n-1]
		wd.free = wd.free[:n-1]
		return ev, true, nil
	}
	if ev.start, err = wd.cu.NewEvent(); err == nil {
		if ev.end, err = wd.cu.NewEvent(); err != nil {
			wd.cu.DestroyEvent(ev.start)
		}
	}
	if err != nil {
		return eventPair{}, false, status.Errorf(status.Unavailable, "CUDA events for the collective: %w", err)
	}
	return ev, true, nil
}

// release returns ev unused (the enqueue failed).
func (wd *watchdog) release(ev eventPair) {
	wd.mu.Lock()
	wd.free = append(wd.free, ev)
	wd.mu.Unlock()
}

// add hands a recorded collective to the watchdog.
func (wd *watchdog) add(f flight) {
	wd.mu.Lock()
	wd.inflight = append(wd.inflight, f)
	wd.mu.Unlock()
	select {
	case wd.kick <- struct{}{}:
	default:
	}
}

// unfinished returns, once each, the collectives enqueued before old that
// have not finished.
func (wd *watchdog) unfinished(old time.Time) []flight {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	var out []flight
	for i := range wd.inflight {
		if f := &wd.inflight[i]; !f.reported && f.arrive.Before(old) {
			f.reported = true
			out = append(out, *f)
		}
	}
	return out
}

// close stops the watchdog after a last look at what has completed, and
// releases the events; the communicator is closed or aborted by then.
func (wd *watchdog) close() {
	close(wd.stop)
	<-wd.done
}

// settle waits until the collectives in flight have finished on the GPU
// (their events then reach the agent, which would otherwise wait for them
// and see a hang) or were given up: failed, aborted, or past the timeout,
// which the watchdog enforces meanwhile. NCCL's destroy would wait for
// them anyway, and with no watchdog left, for ever.
func (wd *watchdog) settle() {
	for {
		wd.mu.Lock()
		n, failed := len(wd.inflight), wd.failed
		wd.mu.Unlock()
		if n == 0 || failed {
			return
		}
		select {
		case <-wd.done:
			return
		case <-time.After(pollBusy):
		}
	}
}

func (wd *watchdog) run() {
	defer close(wd.done)
	// The thread gets a CUDA context bound: it stays locked, and Go ends
	// it with the goroutine rather than reuse it.
	runtime.LockOSThread()
	var clk *clock
	t := time.NewTimer(pollIdle)
	defer t.Stop()
	for {
		select {
		case <-wd.stop:
			if clk != nil {
				wd.poll(clk, false)
			}
			wd.destroy(clk)
			return
		case <-wd.kick:
		case <-t.C:
		}
		if clk == nil && !wd.hasFailed() {
			var err error
			if clk, err = wd.bind(); err != nil {
				wd.fail(err, nil)
			}
		}
		if !wd.poll(clk, true) {
			t.Reset(pollIdle)
		} else {
			t.Reset(pollBusy)
		}
	}
}

// bind binds the caller's context to this thread once the first
// collective has told which, and anchors the GPU clock.
func (wd *watchdog) bind() (*clock, error) {
	wd.mu.Lock()
	ctx := wd.cuCtx
	wd.mu.Unlock()
	if !ctx.Valid() {
		return nil, nil
	}
	if err := wd.cu.Bind(ctx); err != nil {
		return nil, status.Errorf(status.Unavailable, "watchdog: %w", err)
	}
	clk := &clock{cu: wd.cu}
	if err := clk.anchor(); err != nil {
		return nil, status.Errorf(status.Unavailable, "watchdog: anchor the GPU clock: %w", err)
	}
	return clk, nil
}

func (wd *watchdog) hasFailed() bool {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	return wd.failed
}

// poll checks the asynchronous error and the collectives in flight, oldest
// first; it reports whether some are still in flight.
func (wd *watchdog) poll(clk *clock, enforce bool) bool {
	if wd.hasFailed() {
		return false
	}
	// At close the communicator may be gone: only collect what completed.
	if err := wd.nc.AsyncError(); enforce && err != nil {
		if errors.Is(err, nccl.ErrAborted) || errors.Is(err, nccl.ErrClosed) {
			// Aborted by someone else (the agent, ddpshim_abort): what is
			// in flight will not finish.
			cause := context.Cause(wd.c.ctx)
			if cause == nil {
				cause = err
			}
			wd.drop(status.AbortedBy(cause), nil)
		} else {
			wd.fail(status.Errorf(nccl.Status(err), "NCCL reported an asynchronous error: %w", err), nil)
		}
		return false
	}
	for {
		wd.mu.Lock()
		if len(wd.inflight) == 0 {
			wd.mu.Unlock()
			if clk != nil && time.Since(clk.host) > reanchor {
				if err := clk.anchor(); err != nil {
					wd.fail(status.Errorf(status.Unavailable, "watchdog: re-anchor the GPU clock: %w", err), nil)
				}
			}
			return false
		}
		f := wd.inflight[0]
		wd.mu.Unlock()
		if clk == nil { // not bound yet: the next tick binds
			return true
		}
		done, err := wd.cu.Done(f.ev.end)
		if err != nil {
			wd.fail(status.Errorf(status.Unavailable, "all-reduce of step %d bucket %d: %w", f.step, f.bucket, err), &f)
			return false
		}
		if !done {
			if waited := time.Since(f.enqueued); enforce && waited > wd.timeout {
				wd.fail(status.Errorf(status.Timeout, "all-reduce of step %d bucket %d (%d bytes) has not completed on the GPU %v after it was enqueued (timeout %v): a peer is stuck or gone",
					f.step, f.bucket, f.bytes, waited.Round(time.Millisecond), wd.timeout), &f)
			}
			return true
		}
		start, end, err := clk.times(f.ev)
		if err != nil {
			wd.fail(status.Errorf(status.Unavailable, "time the all-reduce of step %d bucket %d: %w", f.step, f.bucket, err), &f)
			return false
		}
		wd.c.pushEvent(f, start, end, nil)
		wd.mu.Lock()
		wd.inflight = wd.inflight[1:]
		wd.free = append(wd.free, f.ev)
		wd.mu.Unlock()
	}
}

// fail aborts the communicator with cause and reports the collective that
// failed (f, if any) and the rest in flight.
func (wd *watchdog) fail(cause error, f *flight) {
	if wd.hasFailed() {
		return
	}
	wd.c.log.Error("aborting the NCCL communicator", "err", cause)
	wd.c.abort(cause)
	wd.drop(cause, f)
}

// drop gives up the collectives in flight and reports them: f with cause,
// the others as aborted by it. The watchdog watches nothing after.
func (wd *watchdog) drop(cause error, f *flight) {
	wd.mu.Lock()
	if wd.failed {
		wd.mu.Unlock()
		return
	}
	wd.failed = true
	rest := wd.inflight
	wd.inflight = nil
	for _, g := range rest {
		wd.free = append(wd.free, g.ev)
	}
	wd.mu.Unlock()
	now := time.Now()
	for _, g := range rest {
		err := error(status.AbortedBy(cause))
		if f != nil && g.step == f.step && g.bucket == f.bucket {
			err = cause
		}
		wd.c.pushEvent(g, g.enqueued, now, err)
	}
}

// destroy releases the events and the clock's stream.
func (wd *watchdog) destroy(clk *clock) {
	wd.mu.Lock()
	evs := wd.free
	for _, f := range wd.inflight {
		evs = append(evs, f.ev)
	}
	wd.free, wd.inflight = nil, nil
	ctx := wd.cuCtx
	wd.mu.Unlock()
	if wd.cu == nil || !ctx.Valid() {
		return
	}
	if clk == nil { // events were made, but the watchdog never bound
		if err := wd.cu.Bind(ctx); err != nil {
			wd.c.log.Warn("release CUDA events", "err", err)
			return
		}
	}
	for _, ev := range evs {
		wd.cu.DestroyEvent(ev.start)
		wd.cu.DestroyEvent(ev.end)
	}
	if clk != nil {
		clk.close()
	}
}

// clock maps GPU event times to the host clock: an anchor event recorded
// on an idle stream of our own completes at once, so its GPU time is the
// host time around its synchronization.
type clock struct {
	cu     *cuda.Lib
	stream cuda.Stream
	ev     cuda.Event
	host   time.Time
	ok     bool
}

func (k *clock) anchor() error {
	if !k.ok {
		s, err := k.cu.NewStream()
		if err != nil {
			return err
		}
		ev, err := k.cu.NewEvent()
		if err != nil {
			k.cu.DestroyStream(s)
			return err
		}
		k.stream, k.ev, k.ok = s, ev, true
	}
	t0 := time.Now()
	if err := k.cu.Record(k.ev, k.stream.Ptr()); err != nil {
		return err
	}
	if err := k.cu.Sync(k.ev); err != nil {
		return err
	}
	t1 := time.Now()
	k.host = t0.Add(t1.Sub(t0) / 2)
	return nil
}

// times are when ev's collective started and ended on the GPU, host clock.
func (k *clock) times(ev eventPair) (start, end time.Time, err error) {
	fromAnchor, err := k.cu.Elapsed(k.ev, ev.start)
	if err != nil {
		return
	}
	d, err := k.cu.Elapsed(ev.start, ev.end)
	if err != nil {
		return
	}
	start = k.host.Add(fromAnchor)
	return start, start.Add(d), nil
}

func (k *clock) close() {
	if k.ok {
		k.cu.DestroyEvent(k.ev)
		k.cu.DestroyStream(k.stream)
	}
}

// pushEvent reports a collective's times to the agent, if there is one.
func (c *comm) pushEvent(f flight, start, end time.Time, err error) {
	if c.events == nil {
		return
	}
	c.events.push(wire.CollectiveEvent{
		Step: f.step, Bucket: uint32(f.bucket), Bytes: f.bytes, DType: f.dt, Status: uint8(status.Of(err)),
		TArrive: f.arrive.UnixNano(), TStart: start.UnixNano(), TEnd: end.UnixNano(),
	})
}
