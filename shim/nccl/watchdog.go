package nccl

import (
	"errors"
	"log/slog"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/shim/cuda"
	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/status"
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

// EventPair is the CUDA events recorded before and after a collective on
// its stream.
type EventPair struct{ Start, End cuda.Event }

// Flight is a collective enqueued on the GPU and not yet seen complete.
type Flight struct {
	Events   EventPair
	reported bool // Unfinished has returned it
	Step     uint64
	Bucket   int32
	Bytes    uint64
	DType    uint8
	Arrive   time.Time // the caller asked for the collective
	Enqueued time.Time // it was on the stream
}

// Owner is the communicator a Watchdog watches for: what it reports
// collectives to and aborts. Its methods are called from the watchdog's
// goroutine.
type Owner interface {
	// Abort fails the communicator with cause; it returns at once.
	Abort(cause error)
	// Cause is why the communicator was aborted; nil while it was not.
	Cause() error
	// Report gets a collective the watchdog is done with: finished (err
	// nil), with its start and end on the GPU on the host clock, or given
	// up, with why.
	Report(f Flight, start, end time.Time, err error)
}

// Watchdog watches the collectives of one Comm on the GPU. Its methods are
// safe for concurrent use.
type Watchdog struct {
	owner   Owner
	log     *slog.Logger
	nc      *Comm
	cu      *cuda.Lib // nil: no events
	timeout time.Duration

	mu       sync.Mutex
	cuCtx    cuda.Context // the caller's, taken at the first collective
	noEvents bool         // the caller has no CUDA context: host times only
	inflight []Flight
	free     []EventPair
	failed   bool

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
}

// NewWatchdog starts watching nc's collectives, timed with cu's events
// (nil: none, only the asynchronous error is watched), for owner: a
// collective not done after timeout aborts it. Close stops it.
func NewWatchdog(owner Owner, nc *Comm, cu *cuda.Lib, timeout time.Duration, log *slog.Logger) *Watchdog {
	wd := &Watchdog{owner: owner, log: log, nc: nc, cu: cu, timeout: timeout, noEvents: cu == nil,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go wd.run()
	return wd
}

// Events returns a pair of events for a collective on stream, made in the
// calling thread's context; ok is false when this comm runs without
// events.
func (wd *Watchdog) Events(stream unsafe.Pointer) (ev EventPair, ok bool, err error) {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	if wd.noEvents {
		return EventPair{}, false, nil
	}
	// Events are made and recorded in the calling thread's context. The
	// CUDA runtime has made one current on every thread PyTorch runs CUDA
	// work on; a thread without one gets the communicator's.
	ctx, err := wd.cu.Current(stream)
	if err != nil {
		return EventPair{}, false, status.Errorf(status.Unavailable, "CUDA context of the calling thread: %w", err)
	}
	switch {
	case !ctx.Valid() && !wd.cuCtx.Valid():
		wd.noEvents = true
		wd.log.Warn("no CUDA context on the calling thread: no GPU-side timing or hang detection")
		return EventPair{}, false, nil
	case !ctx.Valid():
		if err := wd.cu.Bind(wd.cuCtx); err != nil {
			return EventPair{}, false, status.Errorf(status.Unavailable, "CUDA context for the calling thread: %w", err)
		}
	case !wd.cuCtx.Valid():
		wd.cuCtx = ctx
	}
	if n := len(wd.free); n > 0 {
		ev = wd.free[n-1]
		wd.free = wd.free[:n-1]
		return ev, true, nil
	}
	if ev.Start, err = wd.cu.NewEvent(); err == nil {
		if ev.End, err = wd.cu.NewEvent(); err != nil {
			wd.cu.DestroyEvent(ev.Start)
		}
	}
	if err != nil {
		return EventPair{}, false, status.Errorf(status.Unavailable, "CUDA events for the collective: %w", err)
	}
	return ev, true, nil
}

// Release returns ev unused (the enqueue failed).
func (wd *Watchdog) Release(ev EventPair) {
	wd.mu.Lock()
	wd.free = append(wd.free, ev)
	wd.mu.Unlock()
}

// Add hands a recorded collective to the watchdog.
func (wd *Watchdog) Add(f Flight) {
	wd.mu.Lock()
	wd.inflight = append(wd.inflight, f)
	wd.mu.Unlock()
	select {
	case wd.kick <- struct{}{}:
	default:
	}
}

// Unfinished returns, once each, the collectives enqueued before old that
// have not finished.
func (wd *Watchdog) Unfinished(old time.Time) []Flight {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	var out []Flight
	for i := range wd.inflight {
		if f := &wd.inflight[i]; !f.reported && f.Arrive.Before(old) {
			f.reported = true
			out = append(out, *f)
		}
	}
	return out
}

// Close stops the watchdog after a last look at what has completed, and
// releases the events; the communicator is closed or aborted by then.
func (wd *Watchdog) Close() {
	close(wd.stop)
	<-wd.done
}

// Settle waits until the collectives in flight have finished on the GPU
// (their events then reach the agent, which would otherwise wait for them
// and see a hang) or were given up: failed, aborted, or past the timeout,
// which the watchdog enforces meanwhile. NCCL's destroy would wait for
// them anyway, and with no watchdog left, for ever.
func (wd *Watchdog) Settle() {
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

func (wd *Watchdog) run() {
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
func (wd *Watchdog) bind() (*clock, error) {
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

func (wd *Watchdog) hasFailed() bool {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	return wd.failed
}

// poll checks the asynchronous error and the collectives in flight, oldest
// first; it reports whether some are still in flight.
func (wd *Watchdog) poll(clk *clock, enforce bool) bool {
	if wd.hasFailed() {
		return false
	}
	// At close the communicator may be gone: only collect what completed.
	if err := wd.nc.AsyncError(); enforce && err != nil {
		if errors.Is(err, failure.ErrAborted) || errors.Is(err, failure.ErrClosed) {
			// Aborted by someone else (the agent, ddpshim_abort): what is
			// in flight will not finish.
			cause := wd.owner.Cause()
			if cause == nil {
				cause = err
			}
			wd.drop(status.AbortedBy(cause), nil)
		} else {
			wd.fail(status.Errorf(Status(err), "NCCL reported an asynchronous error: %w", err), nil)
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
		done, err := wd.cu.Done(f.Events.End)
		if err != nil {
			wd.fail(status.Errorf(status.Unavailable, "all-reduce of step %d bucket %d: %w", f.Step, f.Bucket, err), &f)
			return false
		}
		if !done {
			if waited := time.Since(f.Enqueued); enforce && waited > wd.timeout {
				wd.fail(status.Errorf(status.Timeout, "all-reduce of step %d bucket %d (%d bytes) has not completed on the GPU %v after it was enqueued (timeout %v): a peer is stuck or gone",
					f.Step, f.Bucket, f.Bytes, waited.Round(time.Millisecond), wd.timeout), &f)
			}
			return true
		}
		start, end, err := clk.times(f.Events)
		if err != nil {
			wd.fail(status.Errorf(status.Unavailable, "time the all-reduce of step %d bucket %d: %w", f.Step, f.Bucket, err), &f)
			return false
		}
		wd.owner.Report(f, start, end, nil)
		wd.mu.Lock()
		wd.inflight = wd.inflight[1:]
		wd.free = append(wd.free, f.Events)
		wd.mu.Unlock()
	}
}

// fail aborts the communicator with cause and reports the collective that
// failed (f, if any) and the rest in flight.
func (wd *Watchdog) fail(cause error, f *Flight) {
	if wd.hasFailed() {
		return
	}
	wd.log.Error("aborting the NCCL communicator", "err", cause)
	wd.owner.Abort(cause)
	wd.drop(cause, f)
}

// drop gives up the collectives in flight and reports them: f with cause,
// the others as aborted by it. The watchdog watches nothing after.
func (wd *Watchdog) drop(cause error, f *Flight) {
	wd.mu.Lock()
	if wd.failed {
		wd.mu.Unlock()
		return
	}
	wd.failed = true
	rest := wd.inflight
	wd.inflight = nil
	for _, g := range rest {
		wd.free = append(wd.free, g.Events)
	}
	wd.mu.Unlock()
	now := time.Now()
	for _, g := range rest {
		err := error(status.AbortedBy(cause))
		if f != nil && g.Step == f.Step && g.Bucket == f.Bucket {
			err = cause
		}
		wd.owner.Report(g, g.Enqueued, now, err)
	}
}

// destroy releases the events and the clock's stream.
func (wd *Watchdog) destroy(clk *clock) {
	wd.mu.Lock()
	evs := wd.free
	for _, f := range wd.inflight {
		evs = append(evs, f.Events)
	}
	wd.free, wd.inflight = nil, nil
	ctx := wd.cuCtx
	wd.mu.Unlock()
	if wd.cu == nil || !ctx.Valid() {
		return
	}
	if clk == nil { // events were made, but the watchdog never bound
		if err := wd.cu.Bind(ctx); err != nil {
			wd.log.Warn("release CUDA events", "err", err)
			return
		}
	}
	for _, ev := range evs {
		wd.cu.DestroyEvent(ev.Start)
		wd.cu.DestroyEvent(ev.End)
	}
	if clk != nil {
		clk.close()
	}
}
