package nccl

// #include <stdlib.h>
// #include "ddpnccl.h"
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/shim/failure"
)

// errClosing is the cause of an abort by Close during a collective.
var errClosing = fmt.Errorf("%w by Close", failure.ErrAborted)

// state of a Comm; it only moves forward.
type state int

const (
	stateOpen     state = iota
	stateAborting       // ncclCommAbort is running
	stateAborted        // the NCCL communicator is gone; Close has not run
	stateClosed
)

// Comm is one rank of an NCCL communicator. AllReduce and Close take
// turns (NCCL allows one thread per communicator); Abort, AsyncError and
// Close are safe to call from any goroutine at any time, also while an
// AllReduce is blocked.
//
// Any failure (an NCCL error, a timeout, an asynchronous error) aborts the
// Comm: NCCL's ranks are then out of step, so every later call fails at once
// with failure.ErrAborted wrapping the first cause.
type Comm struct {
	lib         *Lib
	rank, size  int
	timeout     time.Duration
	nonBlocking bool
	threadSetup func() error // WithThreadSetup
	// stop is C memory watched by the C wait loops: 1 once aborting, so a
	// loop returns within a millisecond and Abort can free the communicator.
	stop *C.int32_t

	op sync.Mutex // held by AllReduce and Close around their NCCL calls

	mu        sync.Mutex
	idle      sync.Cond    // on mu: broadcast when short drops to 0
	comm      C.ncclComm_t // nil once aborted or destroyed
	state     state
	short     int   // calls into NCCL in flight that return promptly (or watch stop)
	busy      bool  // an AllReduce is in flight
	cause     error // why the Comm was aborted
	abortDone chan struct{}
}

// Open creates this rank's communicator and blocks until every rank has
// joined, NCCL fails, or timeout passes. The same timeout later bounds each
// AllReduce and Close's finalize.
//
// With non-blocking communicators (NCCL 2.14+), Open calls
// ncclCommInitRankConfig with blocking=0 and polls ncclCommGetAsyncError
// while it says ncclInProgress; at the timeout it aborts the half-made
// communicator (ncclCommAbort) and returns failure.ErrTimeout.
//
// Before 2.14 it calls the blocking ncclCommInitRank on its own goroutine.
// That call cannot be interrupted: it has not handed out the communicator
// that ncclCommAbort would need, and NCCL offers no other way in. At the
// timeout Open returns failure.ErrTimeout and leaves the call running (its thread
// stays in NCCL until NCCL's bootstrap succeeds or gives up); a communicator
// it returns late is aborted.
//
// The calling thread's CUDA device is the communicator's, as with NCCL;
// the blocking init's own thread first runs the function of
// WithThreadSetup, which should make the caller's CUDA context current
// there.
func Open(lib *Lib, uniqueID [UniqueIDBytes]byte, nranks, rank int, timeout time.Duration, opts ...Option) (*Comm, error) {
	if nranks < 1 || rank < 0 || rank >= nranks {
		return nil, fmt.Errorf("open rank %d of %d: %w: rank out of range", rank, nranks, failure.ErrInvalid)
	}
	if timeout <= 0 {
		return nil, fmt.Errorf("open rank %d of %d: %w: timeout %v", rank, nranks, failure.ErrInvalid, timeout)
	}
	c := &Comm{
		lib:         lib,
		rank:        rank,
		size:        nranks,
		timeout:     timeout,
		nonBlocking: lib.features.NonBlocking,
		stop:        (*C.int32_t)(C.calloc(1, C.sizeof_int32_t)),
		abortDone:   make(chan struct{}),
	}
	c.idle.L = &c.mu
	for _, o := range opts {
		o(c)
	}
	var err error
	if c.nonBlocking {
		c.comm, err = c.initNonBlocking(uniqueID)
	} else {
		c.comm, err = c.initBlocking(uniqueID)
	}
	if err != nil {
		C.free(unsafe.Pointer(c.stop))
		return nil, fmt.Errorf("open rank %d of %d: %w", rank, nranks, err)
	}
	return c, nil
}

// Option configures Open.
type Option func(*Comm)

// WithThreadSetup has Open run setup on the thread of a blocking init
// (NCCL before 2.14) before ncclCommInitRank, which takes the CUDA device
// from that thread.
func WithThreadSetup(setup func() error) Option {
	return func(c *Comm) { c.threadSetup = setup }
}

func (c *Comm) initNonBlocking(id [UniqueIDBytes]byte) (C.ncclComm_t, error) {
	const name = "ncclCommInitRankConfig"
	l := c.lib
	var comm C.ncclComm_t
	var why C.int
	r := C.ddpnccl_init_nonblocking(l.t, &comm, C.int(c.size), (*C.ncclUniqueId)(unsafe.Pointer(&id[0])),
		C.int(c.rank), C.int64_t(c.timeout), c.stop, &why)
	var err error
	switch {
	case why == C.DDPNCCL_DEADLINE:
		err = fmt.Errorf("%s: %w after %v (still ncclInProgress); communicator aborted", name, failure.ErrTimeout, c.timeout)
	case r != C.ncclSuccess:
		err = l.errorOf(name, r)
	}
	if err != nil && comm != nil {
		C.ddpnccl_abort(l.t, comm)
	}
	return comm, err
}

func (c *Comm) initBlocking(id [UniqueIDBytes]byte) (C.ncclComm_t, error) {
	const name = "ncclCommInitRank"
	l := c.lib
	type result struct {
		comm C.ncclComm_t
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var res result
		if c.threadSetup != nil {
			// The thread may get a CUDA context bound: it stays locked,
			// and Go ends it with the goroutine.
			runtime.LockOSThread()
			if err := c.threadSetup(); err != nil {
				res.err = fmt.Errorf("%s: set up its thread: %w", name, err)
				done <- res
				return
			}
		}
		r := C.ddpnccl_init_blocking(l.t, &res.comm, C.int(c.size), (*C.ncclUniqueId)(unsafe.Pointer(&id[0])), C.int(c.rank))
		if r != C.ncclSuccess {
			res.err = l.errorOf(name, r)
		}
		done <- res
	}()
	t := time.NewTimer(c.timeout)
	defer t.Stop()
	select {
	case res := <-done:
		if res.err != nil && res.comm != nil {
			C.ddpnccl_abort(l.t, res.comm)
		}
		return res.comm, res.err
	case <-t.C:
		go func() {
			if res := <-done; res.comm != nil {
				C.ddpnccl_abort(l.t, res.comm)
			}
		}()
		return nil, fmt.Errorf("%s: %w after %v; a blocking init cannot be interrupted, so it is left to finish "+
			"in the background and aborted then", name, failure.ErrTimeout, c.timeout)
	}
}

// Rank is this rank.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks.
func (c *Comm) Size() int { return c.size }

// NonBlocking reports whether the communicator is non-blocking (NCCL
// 2.14+): every NCCL call returns at once and AllReduce polls.
func (c *Comm) NonBlocking() bool { return c.nonBlocking }

// AllReduce all-reduces count elements at buf in place (sendbuff ==
// recvbuff) on stream (a cudaStream_t; nil is CUDA's default stream). buf
// is device memory NCCL can reach; it is never read here.
//
// It returns once NCCL has enqueued the collective on the stream, not when
// the data has arrived: wait on the stream for that. On a non-blocking
// communicator an ncclInProgress return is polled through
// ncclCommGetAsyncError until it turns into success or an error; on a
// blocking one a successful call is followed by one ncclCommGetAsyncError,
// so an asynchronous failure shows at once. Either way the wait is bounded
// by the Comm's timeout: then the Comm is aborted and the error wraps
// failure.ErrTimeout. Abort or Close from another goroutine makes it return with
// failure.ErrAborted, after NCCL has let go of the communicator.
//
// Bad arguments, an avg or bf16 the NCCL version lacks, give failure.ErrInvalid or
// ErrUnsupported without calling NCCL; an NCCL failure gives an *Error and
// aborts the Comm.
func (c *Comm) AllReduce(buf unsafe.Pointer, count int64, dtype, op int, stream unsafe.Pointer) error {
	const name = "ncclAllReduce"
	if count < 0 || (buf == nil && count > 0) {
		return fmt.Errorf("%s: %w: buf %p, count %d", name, failure.ErrInvalid, buf, count)
	}
	if err := c.lib.checkOp(dtype, op); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	c.op.Lock()
	defer c.op.Unlock()
	c.mu.Lock()
	if err := c.stateErr(name); err != nil {
		c.mu.Unlock()
		return err
	}
	comm := c.comm
	c.busy = true
	if c.nonBlocking {
		c.short++
	}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.busy = false
		c.mu.Unlock()
	}()
	if c.nonBlocking {
		return c.allReduceNonBlocking(comm, buf, count, dtype, op, stream)
	}
	return c.allReduceBlocking(comm, buf, count, dtype, op, stream)
}

func (c *Comm) allReduceNonBlocking(comm C.ncclComm_t, buf unsafe.Pointer, count int64, dtype, op int, stream unsafe.Pointer) error {
	const name = "ncclAllReduce"
	l := c.lib
	var why C.int
	r := C.ddpnccl_allreduce(l.t, buf, C.size_t(count), C.int(dtype), C.int(op), comm, stream, 1,
		C.int64_t(c.timeout), c.stop, &why)
	var err error
	switch {
	case why == C.DDPNCCL_STOPPED: // Abort or Close from another goroutine
		c.exit()
		return c.waitAborted(name)
	case why == C.DDPNCCL_DEADLINE:
		err = c.timeoutErr(name, " (still ncclInProgress)")
	case r != C.ncclSuccess:
		err = l.errorOf(name, r)
	}
	c.exit()
	if err != nil {
		c.abort(err)
	}
	return err
}

func (c *Comm) allReduceBlocking(comm C.ncclComm_t, buf unsafe.Pointer, count int64, dtype, op int, stream unsafe.Pointer) error {
	const name = "ncclAllReduce"
	l := c.lib
	// A blocking call can only be interrupted by ncclCommAbort from another
	// thread: the timer (or Abort, or Close) is that thread. NCCL's abort
	// sets the communicator's abort flag, which the blocked call polls, and
	// then frees the communicator; that the blocked call leaves before the
	// free is NCCL's business (the fake waits for it), as it is for
	// PyTorch's watchdog doing the same.
	terr := c.timeoutErr(name, "")
	var fired atomic.Bool
	timer := time.AfterFunc(c.timeout, func() {
		fired.Store(true)
		c.abort(terr)
	})
	var why C.int
	r := C.ddpnccl_allreduce(l.t, buf, C.size_t(count), C.int(dtype), C.int(op), comm, stream, 0, 0, nil, &why)
	timer.Stop()
	if fired.Load() {
		c.waitAborted(name)
		return terr
	}
	c.mu.Lock()
	aborted := c.state != stateOpen
	c.mu.Unlock()
	if aborted {
		return c.waitAborted(name)
	}
	if r != C.ncclSuccess {
		err := l.errorOf(name, r)
		c.abort(err)
		return err
	}
	return nil
}

func (c *Comm) timeoutErr(name, detail string) error {
	return fmt.Errorf("%s (rank %d of %d): %w after %v%s; communicator aborted", name, c.rank, c.size, failure.ErrTimeout, c.timeout, detail)
}

// AsyncError returns the communicator's asynchronous error
// (ncclCommGetAsyncError), or nil while it has none (ncclInProgress, an
// operation under way on a non-blocking communicator, counts as none). An
// error aborts the Comm. After Abort it returns failure.ErrAborted with the cause,
// after Close failure.ErrClosed. It does not block.
func (c *Comm) AsyncError() error {
	const name = "ncclCommGetAsyncError"
	comm, err := c.enter(name)
	if err != nil {
		return err
	}
	r := C.ddpnccl_async_error(c.lib.t, comm)
	c.exit()
	if r == C.ncclSuccess || r == C.ncclInProgress {
		return nil
	}
	err = c.lib.errorOf(name, r)
	c.abort(err)
	return err
}

// Abort aborts the communicator (ncclCommAbort): a collective blocked in
// NCCL returns, every later call fails with failure.ErrAborted. It blocks until
// ncclCommAbort has returned; idempotent, and a no-op after Close.
func (c *Comm) Abort() { c.abort(failure.ErrAborted) }

// Close releases the communicator. When it is clean (no failure, no
// asynchronous error) it calls ncclCommFinalize (non-blocking communicators,
// polled to the end within the timeout) and ncclCommDestroy; when it has
// failed or was aborted it aborts instead. A Close during an AllReduce
// aborts it. Idempotent; the error is one from finalize or destroy (the
// Comm is gone anyway).
func (c *Comm) Close() error {
	c.mu.Lock()
	if c.state == stateClosed {
		c.mu.Unlock()
		return nil
	}
	busy := c.busy
	c.mu.Unlock()
	if busy {
		c.abort(errClosing)
	}

	c.op.Lock()
	defer c.op.Unlock()
	c.mu.Lock()
	if c.state == stateClosed {
		c.mu.Unlock()
		return nil
	}
	if c.state != stateOpen {
		c.mu.Unlock()
		c.waitAborted("")
		c.finish()
		return nil
	}
	comm := c.comm
	c.short++
	c.mu.Unlock()

	l := c.lib
	if r := C.ddpnccl_async_error(l.t, comm); r != C.ncclSuccess && r != C.ncclInProgress {
		err := l.errorOf("ncclCommGetAsyncError", r)
		c.exit()
		c.abort(err)
		c.finish()
		return nil
	}
	if c.nonBlocking && l.features.Finalize {
		var why C.int
		r := C.ddpnccl_finalize(l.t, comm, C.int64_t(c.timeout), c.stop, &why)
		var err error
		switch {
		case why == C.DDPNCCL_STOPPED:
			c.exit()
			c.waitAborted("")
			c.finish()
			return nil
		case why == C.DDPNCCL_DEADLINE:
			err = c.timeoutErr("ncclCommFinalize", " (still ncclInProgress)")
		case r != C.ncclSuccess:
			err = l.errorOf("ncclCommFinalize", r)
		}
		if err != nil {
			c.exit()
			c.abort(err)
			c.finish()
			return err
		}
	}
	c.exit()

	c.mu.Lock()
	if c.state != stateOpen { // aborted after the finalize
		c.mu.Unlock()
		c.waitAborted("")
		c.finish()
		return nil
	}
	c.state = stateClosed
	c.comm = nil
	for c.short > 0 { // an AsyncError still polling
		c.idle.Wait()
	}
	c.mu.Unlock()
	C.free(unsafe.Pointer(c.stop))
	if r := C.ddpnccl_destroy(l.t, comm); r != C.ncclSuccess {
		return l.errorOf("ncclCommDestroy", r)
	}
	return nil
}

// enter registers a prompt call into NCCL, which Abort and Close wait for
// before they free the communicator.
func (c *Comm) enter(name string) (C.ncclComm_t, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.stateErr(name); err != nil {
		return nil, err
	}
	c.short++
	return c.comm, nil
}

func (c *Comm) exit() {
	c.mu.Lock()
	c.short--
	if c.short == 0 {
		c.idle.Broadcast()
	}
	c.mu.Unlock()
}

// stateErr says why name cannot run; c.mu is held.
func (c *Comm) stateErr(name string) error {
	switch c.state {
	case stateClosed:
		return fmt.Errorf("%s (rank %d of %d): %w", name, c.rank, c.size, failure.ErrClosed)
	case stateAborting, stateAborted:
		if errors.Is(c.cause, failure.ErrAborted) { // Abort or Close
			return fmt.Errorf("%s (rank %d of %d): %w", name, c.rank, c.size, c.cause)
		}
		return fmt.Errorf("%s (rank %d of %d): %w after: %w", name, c.rank, c.size, failure.ErrAborted, c.cause)
	}
	return nil
}

// waitAborted waits until ncclCommAbort has returned and returns the error
// for name.
func (c *Comm) waitAborted(name string) error {
	c.mu.Lock()
	done := c.abortDone
	c.mu.Unlock()
	<-done
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stateErr(name)
}

// abort moves an open Comm to aborted: it sets stop, waits for the prompt
// calls to leave NCCL, and calls ncclCommAbort, which also makes a blocked
// blocking-mode call return (NCCL checks its abort flag). Later callers wait
// for the first.
func (c *Comm) abort(cause error) {
	c.mu.Lock()
	switch c.state {
	case stateClosed:
		c.mu.Unlock()
		return
	case stateAborting, stateAborted:
		done := c.abortDone
		c.mu.Unlock()
		<-done
		return
	}
	c.state = stateAborting
	c.cause = cause
	atomic.StoreInt32((*int32)(unsafe.Pointer(c.stop)), 1)
	for c.short > 0 {
		c.idle.Wait()
	}
	comm := c.comm
	c.comm = nil
	c.mu.Unlock()

	C.ddpnccl_abort(c.lib.t, comm)

	c.mu.Lock()
	c.state = stateAborted
	close(c.abortDone)
	c.mu.Unlock()
}

// finish closes an aborted Comm; Close calls it holding c.op, so no wait
// loop is reading stop.
func (c *Comm) finish() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == stateClosed {
		return
	}
	c.state = stateClosed
	C.free(unsafe.Pointer(c.stop))
}
