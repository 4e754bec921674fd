// Package comm is the logic of libddpshim.so behind its C ABI (package
// main in shim, glue only): a communicator's configuration, its
// bootstrap (through the agent's control socket or through blobs the caller
// exchanges), its one transport (transport.go: the host transport, host.go,
// whose collectives the executor runs, or NCCL's enqueue with its
// watchdog, nccl.go), and the shipping of timing events to the agent.
// Tests run it in Go; the exports hand out integer handles to it.
package comm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/shim/agentconn"
	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/host/shm"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
	"github.com/ddp-agent/ddp-agent/shim/status"
	"github.com/ddp-agent/ddp-agent/wire"
)

// allReducer is a connected host transport, as the executor uses it.
type allReducer interface {
	AllReduce(ctx context.Context, buf []byte, dt reduce.DType, op reduce.Op) error
	Broadcast(ctx context.Context, bufs [][]byte, dt reduce.DType, root int) error
	Abort(err error)
	Transport() string
	Close() error
}

// Comm is one communicator: a transport, chosen at Open; for the host
// transport, a FIFO of collectives run by one executor goroutine (every
// rank runs them in the same order); and, under
// ddp-agent, the control connection that carries bootstrap, events and
// Abort. Its methods are safe for concurrent use.
type Comm struct {
	cfg  *Config
	rank int
	size int
	log  *slog.Logger

	ctx    context.Context // cancelled by abort and close
	cancel context.CancelCauseFunc
	exec   sync.WaitGroup // the executor
	// The event shipper and the agent's abort watcher outlive the executor,
	// so the last collectives' events are shipped too.
	bgCtx    context.Context
	bgCancel context.CancelFunc
	bg       sync.WaitGroup

	tp transport // chosen by Open; nil only in the Close of an Open that failed

	mu        sync.Mutex
	exe       allReducer // what the executor runs collectives on; nil until the host transport connects
	queue     []*Work
	wake      chan struct{}
	kick      *time.Timer // wakes the executor for work no waiter took
	closed    bool
	busy      bool   // the executor is running a collective
	running   *Work  // the one it runs
	collected uint64 // collectives completed
	byWaiter  uint64 // of which a waiter ran (runUpTo)

	first  *firstArrival     // while the bootstrap waits (Config.FirstStep); c.mu
	agent  *agentconn.Client // nil without ddp-agent
	events *eventRing        // nil without ddp-agent or a sidecar
	side   *sidecarLink      // under bootstrap "external" with a sidecar; nil otherwise
}

// Work is one collective in flight: an all-reduce, or a broadcast from
// root.
type Work struct {
	c      *Comm
	buf    []byte   // an all-reduce's
	bufs   [][]byte // a broadcast's
	bytes  int      // of buf, or of all bufs
	dt     reduce.DType
	op     reduce.Op
	root   int // the broadcast's root; -1 for an all-reduce
	step   uint64
	bucket int32
	arrive time.Time

	started  atomic.Int64 // unix nanoseconds when the executor took it; 0 before
	reported bool         // an in-flight event was sent (c.mu)
	done     chan struct{}
	err      error // set before done is closed
}

// Open makes the communicator cfg describes: it listens (or loads NCCL),
// and under bootstrap "agent" also connects to every peer, blocking up to
// the timeout.
func Open(cfg *Config) (*Comm, error) {
	lvl, _ := cfg.level()
	c := &Comm{
		cfg:  cfg,
		rank: *cfg.Rank,
		size: *cfg.WorldSize,
		wake: make(chan struct{}, 1),
	}
	c.kick = time.AfterFunc(time.Hour, c.wakeExecutor)
	c.kick.Stop()
	c.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})).With(
		"component", "ddpshim", "name", cfg.Name)
	// A C ABI call has no context to inherit: the comm's lifetime is its own.
	c.ctx, c.cancel = context.WithCancelCause(context.Background())
	c.bgCtx, c.bgCancel = context.WithCancel(context.Background())
	tp, err := newTransport(c)
	if err != nil {
		c.Close()
		return nil, err
	}
	c.tp = tp
	if cfg.FirstStep != nil {
		c.first = &firstArrival{step: *cfg.FirstStep, bucket: cfg.FirstBucket, arrive: time.Now()}
	}
	if cfg.Bootstrap == "agent" {
		if err := c.bootstrapAgent(); err != nil {
			c.Close()
			return nil, err
		}
	} else if cfg.Sidecar != "" {
		c.connectSidecar()
	}
	return c, nil
}

// Info is this rank's bootstrap blob, for ddpshim_bootstrap_info.
func (c *Comm) Info() (string, error) { return c.tp.blob() }

// bootstrapAgent exchanges blobs through the agent's store and connects.
func (c *Comm) bootstrapAgent() error {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.timeout())
	defer cancel()
	hello := wire.Hello{Rank: int32(*c.cfg.GlobalRank), LocalRank: int32(c.cfg.LocalRank), PID: int32(os.Getpid()),
		Generation: c.cfg.Generation, Transports: []string{c.cfg.Transport}}
	cl, w, err := agentconn.Dial(ctx, c.cfg.Socket, hello)
	if err != nil {
		return status.Errorf(status.Unavailable, "agent at %s: %w", c.cfg.Socket, err)
	}
	c.agent = cl
	if int(w.WorldSize) != c.size {
		return status.Errorf(status.Invalid, "agent says world size %d, config says %d", w.WorldSize, c.size)
	}
	c.startShipping(cl)
	defer c.arrivedFirst()
	return c.tp.bootstrapAgent(ctx, cl)
}

func deadline(ctx context.Context) time.Time {
	dl, _ := ctx.Deadline()
	return dl
}

// Connect builds the transport from every rank's blob, in rank order,
// blocking up to the timeout.
func (c *Comm) Connect(lines []string) error {
	defer c.arrivedFirst()
	return c.tp.connect(lines)
}

// startExecutor starts the executor on tr, the host transport just
// connected. The caller holds c.mu: Close either sees exe and waits for
// the executor, or neither.
func (c *Comm) startExecutor(tr allReducer) {
	c.exe = tr
	c.exec.Add(1)
	go func() {
		defer c.exec.Done()
		c.execute(tr)
	}()
}

// kickAfter is how long a collective may wait in the queue for a waiter
// to run it (runUpTo) before the kick timer wakes the executor. Waking the
// executor at once, on every enqueue, cost a 64 KiB all-reduce over shared
// memory more than its data movement: a thread hand-off, and then the
// executor and the waiter racing for the work. The hook's waiter thread
// waits on each work right after issuing it, so the timer rarely fires; a
// caller that never waits still sees its work start within kickAfter, and
// one that polls (Test) wakes the executor itself.
const kickAfter = 100 * time.Microsecond

// wakeExecutor makes the executor look at the queue.
func (c *Comm) wakeExecutor() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// enqueue queues a collective for the executor; it never waits for data.
func (c *Comm) enqueue(w *Work) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return failure.ErrClosed
	case c.exe == nil:
		return status.Errorf(status.Invalid, "communicator is not connected (call ddpshim_connect first)")
	}
	if err := context.Cause(c.ctx); err != nil {
		return status.AbortedBy(err)
	}
	c.queue = append(c.queue, w)
	if len(c.queue) == 1 && !c.busy {
		c.kick.Reset(kickAfter)
	}
	return nil
}

// execute runs queued collectives one at a time until the comm is closed,
// unless a waiter runs them itself (runUpTo). After the first failure the
// transport is desynchronized, so the comm aborts and every later
// collective fails with that cause.
func (c *Comm) execute(tr allReducer) {
	for {
		c.mu.Lock()
		w := c.take()
		closed := c.closed
		c.mu.Unlock()
		if w == nil {
			if closed {
				return
			}
			<-c.wake // enqueue, close and a finished collective send it; an aborted comm waits here too
			continue
		}
		c.run(tr, w, false)
	}
}

// take pops the next collective and marks it running, or returns nil when
// the queue is empty or one is running already. The caller holds c.mu.
func (c *Comm) take() *Work {
	if c.busy || len(c.queue) == 0 {
		return nil
	}
	w := c.queue[0]
	c.queue[0] = nil
	c.queue = c.queue[1:]
	c.busy, c.running = true, w
	return w
}

// runUpTo runs the queued collectives up to w on the calling goroutine, in
// queue order, as long as no other goroutine is running one. A caller
// about to block on w would otherwise wait for the executor to be woken
// and then be woken by it in turn: two thread hand-offs, which cost more
// than a 64 KiB all-reduce over shared memory. It returns when w is done,
// or when the executor has taken the next collective.
func (c *Comm) runUpTo(w *Work, locked bool) {
	for !w.Done() {
		c.mu.Lock()
		var next *Work
		if !c.closed && c.exe != nil {
			next = c.take()
		}
		if next != nil {
			c.exec.Add(1) // under mu and before closed is set: Close waits for it
			c.byWaiter++
		}
		tr := c.exe
		c.mu.Unlock()
		if next == nil {
			return
		}
		c.run(tr, next, locked)
		c.exec.Done()
	}
}

// causeGrace is how long a collective that a peer failed waits for this
// rank's own abort, under an agent or a sidecar, before it blames the peer.
const causeGrace = 250 * time.Millisecond

// awaitAbort waits up to causeGrace for this rank's own abort after a
// collective failed with err, a peer's failure, under an agent or a
// sidecar, and returns its cause (nil if none came). The agent or the
// sidecar aborts every rank of a job at once, and the rank that hears it
// first breaks the others' collective (its connections close, its
// shared-memory abort flag goes up) before they hear it themselves;
// without the wait they would report the peer's EOF instead of the reason.
// A peer that died on its own costs this rank the grace, once.
func (c *Comm) awaitAbort(err error) error {
	c.mu.Lock()
	supervised := c.agent != nil || c.side != nil
	c.mu.Unlock()
	if !supervised || !errors.Is(err, failure.ErrPeer) {
		return nil
	}
	t := time.NewTimer(causeGrace)
	defer t.Stop()
	select {
	case <-c.ctx.Done():
		return context.Cause(c.ctx)
	case <-t.C:
		return nil
	}
}

// run runs w on tr; locked says the calling goroutine serves a call from C
// on that C thread (shm.OnLockedThread says what changes).
func (c *Comm) run(tr allReducer, w *Work, locked bool) {
	start := time.Now()
	w.started.Store(start.UnixNano())
	err := context.Cause(c.ctx)
	if err != nil {
		err = status.AbortedBy(err)
	} else {
		parent := c.ctx
		if locked {
			parent = shm.OnLockedThread(parent)
		}
		ctx, cancel := context.WithTimeout(parent, c.cfg.timeout())
		if w.root >= 0 {
			err = tr.Broadcast(ctx, w.bufs, w.dt, w.root)
		} else {
			err = tr.AllReduce(ctx, w.buf, w.dt, w.op)
		}
		cancel()
		if err != nil {
			cause := context.Cause(c.ctx)
			if cause == nil {
				// The transport failed before this rank was aborted: the
				// peer's doing as far as this rank saw, whatever the agent
				// says next (the note is evidence of the order, for blame).
				c.notePeerFailure(err, time.Now()) // before the caller hears of it, and exits
				cause = c.awaitAbort(err)
			}
			if cause != nil {
				err = fmt.Errorf("%w (%v)", cause, err)
			}
			c.Abort(fmt.Errorf("%s of step %d bucket %d (%d bytes): %w", w.what(), w.step, w.bucket, w.bytes, err))
			err = fmt.Errorf("%s of step %d bucket %d (%d bytes, %v): %w", w.what(), w.step, w.bucket, w.bytes, w.dt, err)
		}
	}
	end := time.Now()
	if c.events != nil {
		c.events.push(wire.CollectiveEvent{
			Step: w.step, Bucket: uint32(w.bucket), Bytes: uint64(w.bytes), DType: uint8(w.dt),
			Status: uint8(status.Of(err)), TArrive: w.arrive.UnixNano(), TStart: start.UnixNano(), TEnd: end.UnixNano(),
		})
	}
	c.mu.Lock()
	c.collected++
	c.busy = false
	c.running = nil
	if len(c.queue) > 0 {
		// Queued while this one ran. The executor takes it next if it ran
		// this one; if a waiter did, the executor may be asleep, and the
		// waiter usually comes back for the next one at once (kickAfter).
		c.kick.Reset(kickAfter)
	}
	c.mu.Unlock()
	w.err = err
	close(w.done)
}

// Abort fails pending and later collectives with cause; the first cause
// wins. It returns at once.
func (c *Comm) Abort(cause error) {
	if !errors.Is(cause, failure.ErrAborted) {
		cause = fmt.Errorf("%w: %w", failure.ErrAborted, cause)
	}
	c.cancel(cause)
	if c.tp != nil {
		c.tp.abort(cause)
	}
}

// Close aborts pending work, stops the goroutines and releases the
// transport and the agent connection. Works still queued fail with
// failure.ErrClosed.
func (c *Comm) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.kick.Stop()
	c.wakeExecutor()
	if c.tp != nil && c.tp.connected() {
		c.noteClosed(time.Now()) // before the peers can see it go
	}
	// Abort only with work outstanding: the shared-memory transport tells
	// the peers about an abort, and they may still be finishing the last
	// collective that this rank has completed.
	pending := len(c.queue) > 0 || c.busy
	c.mu.Unlock()
	if pending {
		c.Abort(failure.ErrClosed)
	}
	c.cancel(failure.ErrClosed)
	c.exec.Wait() // the executor finishes the collective in flight (aborted) and drains
	c.mu.Lock()
	queue := c.queue
	c.queue = nil
	c.mu.Unlock()
	for _, w := range queue {
		w.err = failure.ErrClosed
		close(w.done)
	}
	if c.tp != nil {
		c.tp.settle()
	}
	c.bgCancel() // the shipper's last flush includes the executor's and the transport's last events
	c.bg.Wait()
	if c.tp != nil {
		c.tp.close()
	}
	if c.agent != nil {
		c.agent.Close()
	}
	c.mu.Lock()
	side := c.side
	c.mu.Unlock()
	if side != nil {
		side.close()
	}
}

// Describe is ddpshim_comm_info's JSON.
func (c *Comm) Describe() string {
	c.mu.Lock()
	info := map[string]any{
		"rank": c.rank, "world_size": c.size, "name": c.cfg.Name,
		"transport": "", "collectives": c.collected, "run_by_waiter": c.byWaiter, "agent": c.agent != nil,
		"events_sent": 0, "events_dropped": 0, "connected": false,
	}
	c.mu.Unlock()
	c.tp.describe(info)
	if c.events != nil {
		info["events_sent"], info["events_dropped"] = c.events.stats()
	}
	c.mu.Lock()
	side := c.side
	c.mu.Unlock()
	if side != nil {
		side.mu.Lock()
		info["sidecar"], info["sidecar_relay"] = side.cl != nil, side.relay
		side.mu.Unlock()
	}
	out, _ := json.Marshal(info)
	return string(out)
}

// newWork checks the arguments of a collective and wraps the caller's
// memory without copying it.
func (c *Comm) newWork(ptr unsafe.Pointer, count int64, dt reduce.DType, op reduce.Op, step uint64, bucket int32) (*Work, error) {
	if !op.Valid() {
		return nil, status.Errorf(status.Invalid, "unknown op %d (want 0 sum, 4 avg)", uint8(op))
	}
	buf, err := wrapBytes(ptr, count, dt)
	if err != nil {
		return nil, err
	}
	return &Work{c: c, buf: buf, bytes: len(buf), dt: dt, op: op, root: -1, step: step, bucket: bucket, arrive: time.Now(), done: make(chan struct{})}, nil
}

// wrapBytes checks count elements of dt at ptr and wraps them, without
// copying.
func wrapBytes(ptr unsafe.Pointer, count int64, dt reduce.DType) ([]byte, error) {
	switch {
	case count < 0:
		return nil, status.Errorf(status.Invalid, "count %d is negative", count)
	case !dt.Valid():
		return nil, status.Errorf(status.Invalid, "unknown dtype %d (want 2 int32, 4 int64, 6 float16, 7 float32, 8 float64, 9 bfloat16)", uint8(dt))
	case ptr == nil && count > 0:
		return nil, status.Errorf(status.Invalid, "buf is NULL with count %d", count)
	case count > (1<<62)/int64(dt.Size()):
		return nil, status.Errorf(status.Invalid, "count %d is too large", count)
	case count == 0:
		return nil, nil
	}
	return unsafe.Slice((*byte)(ptr), count*int64(dt.Size())), nil
}

// what names w's collective in errors.
func (w *Work) what() string {
	if w.root >= 0 {
		return fmt.Sprintf("broadcast from rank %d", w.root)
	}
	return "all-reduce"
}

// Rank is this communicator's rank.
func (c *Comm) Rank() int { return c.rank }

// Size is the world size.
func (c *Comm) Size() int { return c.size }

// Transport is the configured transport: "host" or "nccl".
func (c *Comm) Transport() string { return c.cfg.Transport }

// AllReduce starts an all-reduce of count elements at buf, in place. With
// the nccl transport it is enqueued on stream (a CUDA stream; nil is the
// default one) before AllReduce returns; with the host transport it is
// queued for the executor. It never waits for data: the Work tells when
// the collective is done. buf stays the caller's, and must stay valid
// until then.
func (c *Comm) AllReduce(buf unsafe.Pointer, count int64, dt reduce.DType, op reduce.Op, stream unsafe.Pointer,
	step uint64, bucket int32) (*Work, error) {
	w, err := c.newWork(buf, count, dt, op, step, bucket)
	if err != nil {
		return nil, err
	}
	if err := c.tp.allReduce(w, buf, count, stream); err != nil {
		return nil, err
	}
	return w, nil
}

// Broadcast starts a broadcast from root of the buffers at bufs, counts[i]
// elements at bufs[i], in place, as one collective: every rank ends with
// root's bytes, and every rank passes buffers of the same counts. Only the
// host transport has one, queued for the executor like an all-reduce and
// in the same order; on GPU memory torch.distributed's broadcast is NCCL's
// own already. The Work tells when it is done; the buffers must stay
// valid until then.
func (c *Comm) Broadcast(bufs []unsafe.Pointer, counts []int64, dt reduce.DType, root int, step uint64, bucket int32) (*Work, error) {
	if c.cfg.Transport == "nccl" {
		return nil, status.Errorf(status.Invalid, "the nccl transport has no broadcast: torch.distributed.broadcast is NCCL's")
	}
	switch {
	case root < 0 || root >= c.size:
		return nil, status.Errorf(status.Invalid, "root %d is not a rank of world size %d", root, c.size)
	case len(bufs) != len(counts):
		return nil, status.Errorf(status.Invalid, "%d buffers and %d counts", len(bufs), len(counts))
	}
	w, err := c.newWork(nil, 0, dt, reduce.Sum, step, bucket)
	if err != nil {
		return nil, err
	}
	w.root = root
	for i, p := range bufs {
		b, err := wrapBytes(p, counts[i], dt)
		if err != nil {
			return nil, fmt.Errorf("buffer %d: %w", i, err)
		}
		w.bufs = append(w.bufs, b)
		w.bytes += len(b)
	}
	if err := c.enqueue(w); err != nil {
		return nil, err
	}
	return w, nil
}

// Wait blocks until w is done and returns its error. When no collective is
// running, the caller runs the queued ones up to w itself (runUpTo) instead
// of waking the executor. The transports fail a collective within the
// timeout of its start; past that and a margin, a Wait that only waits
// aborts the communicator itself, so that a transport bug never hangs a
// rank.
func (w *Work) Wait() error { return w.wait(false) }

// WaitFromC is Wait for ddpshim_work_wait, whose goroutine is locked to
// the C caller's thread.
func (w *Work) WaitFromC() error { return w.wait(true) }

func (w *Work) wait(locked bool) error {
	w.c.runUpTo(w, locked)
	if w.Done() {
		return w.err
	}
	limit := w.c.cfg.timeout() + 30*time.Second
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-w.done:
			return w.err
		case <-tick.C:
		}
		if s := w.started.Load(); s != 0 && time.Since(time.Unix(0, s)) > limit {
			err := status.Errorf(status.Timeout, "ddpshim_work_wait: step %d bucket %d still running %v after it started; communicator aborted",
				w.step, w.bucket, limit)
			w.c.Abort(err)
			return err
		}
	}
}

// Test reports whether w has completed, without blocking. A caller that
// polls will not run the queue itself (Wait does), so the executor is
// woken now rather than when the kick timer fires.
func (w *Work) Test() bool {
	if w.Done() {
		return true
	}
	if w.started.Load() == 0 {
		w.c.wakeExecutor()
	}
	return false
}

// Done reports whether w has completed, without blocking.
func (w *Work) Done() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}
