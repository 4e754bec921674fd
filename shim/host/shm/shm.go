// Package shm all-reduces buffers between the ranks (processes) of one host
// through a shared-memory segment: the fast path of the shim's CPU "host"
// transport when every rank runs on one machine. Linux only (it waits with
// futex(2) on words in the shared mapping).
//
// Rank 0 creates the segment file (Create), the other ranks map it (Open),
// and rank 0 unlinks the name once every rank has mapped it (Unlink), so a
// killed job leaves nothing behind. The segment holds a page of control
// blocks (640 bytes per rank, counters on lines of their own) and a staging
// slot of Config.SlotBytes per rank: world*SlotBytes plus a page or so of
// shared memory in all (4 MiB plus 4 KiB for 2 ranks by default), mapped by
// every rank.
//
// An all-reduce splits the buffer into one chunk per rank; rank r owns chunk
// r and is the only rank that reduces it, so every rank ends with
// bit-identical results (the owner adds its own data first, then the others
// in rank order; Avg divides once, on the owner). The chunks are processed
// in steps of one segment per chunk, pipelined across a ring of slot
// entries: in step t a rank copies its parts of the other chunks into its
// slot, reduces its own segment from the peers' slots into its buffer and
// publishes the result in its slot, and copies the other owners' results
// back into its buffer. Monotonic per-rank step counters (in, red, done)
// order the phases and keep a rank from overwriting slot data a peer has not
// read. A waiting rank spins briefly, then sleeps in FUTEX_WAIT for a few
// milliseconds at a time so that Abort, ctx, the deadline and the peers'
// abort flag are re-checked; the writer calls FUTEX_WAKE only when a waiter
// has said it sleeps.
//
// Collectives of Config.DirectMin bytes and more (64 KiB by default) take a
// single-copy path instead when every rank can reach every other's memory
// with process_vm_readv and process_vm_writev (Negotiate decides, once): the
// owner of a chunk reads it from the peers' own buffers a piece at a time,
// adds it into its own, and writes each reduced piece, still in cache, into
// the peers' buffers, so each rank's buffer is read once and written once
// (direct.go); a per-rank gate keeps writes out of a buffer whose rank has
// left the collective (gate.go).
//
// Every wait, and every step of a collective that does not wait, checks
// Abort, ctx, the deadline and the peers' abort flag. On the staged path a
// dead peer is seen only through the timeout (the caller's TCP connections
// detect it sooner and call Abort); on the single-copy path, whose peers'
// pids are known to be this namespace's, a wait also looks whether the
// peer still runs.
package shm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// Config tunes a communicator. The zero value is usable.
type Config struct {
	// Timeout bounds each AllReduce when ctx has no earlier deadline
	// (default 10m).
	Timeout time.Duration
	// SlotBytes is the staging memory of each rank in the segment (default
	// 2 MiB; rounded down to a multiple of 4*world*64). Create sets it for
	// the segment; Open takes the segment's, and a non-zero value that
	// disagrees with it is an error.
	SlotBytes int
	// DirectMin is the smallest collective, in bytes, that takes the
	// single-copy path (direct.go) once Negotiate has found it works on
	// every rank (default DefaultDirectMin; negative: never). Create
	// stores it in the segment and Open takes the segment's, so all ranks
	// agree.
	DirectMin int64
}

// Defaults.
const (
	DefaultTimeout   = 10 * time.Minute
	DefaultSlotBytes = 2 << 20
	// DefaultDirectMin: on a 16-core Xeon, 2 processes, the single-copy
	// path beat the staged one from 64 KiB (11.7 against 14.5 µs) up, cache
	// hot or cold (docs/benchmarks.md); below that its system calls cost
	// more than the copy they save.
	DefaultDirectMin = 64 << 10
)

// Comm is one rank's handle on a segment. AllReduce calls are issued one at
// a time, in the same order on every rank; Abort and Close may be called at
// any time from any goroutine.
type Comm struct {
	rank, world int
	timeout     time.Duration
	seg         int // segment bytes

	// life guards the mapping: AllReduce and Abort hold it shared while they
	// touch mem, Close exclusively while it unmaps.
	life  sync.RWMutex
	mem   []byte // nil once closed
	ctl   []rankCtl
	slots [][]byte
	abort *uint32 // the segment's abort word

	// The single-copy path (direct.go): the smallest collective that takes
	// it, and whether Negotiate found that every rank can read and write
	// every other's memory. probe is the word the peers read to check.
	directMin int64
	direct    bool
	probe     *uint64
	bounce    []byte // where a peer's segment lands before it is reduced
	whyStaged error  // why this rank cannot take it
	// pushMin is the least a direct broadcast's root writes into each peer
	// (defaultPushMin). Every rank must have the same, as pushCut must be
	// the same, and the segment does not carry it: only tests change it,
	// on every rank (BenchmarkBroadcast measures the peers reading all).
	pushMin int

	// stop holds the error that Abort or Close set; in-flight and later
	// AllReduce calls return it.
	stop atomic.Pointer[error]
	busy atomic.Bool // an AllReduce is running

	// Owned by the AllReduce caller.
	seq    uint32 // collectives issued
	step   uint32 // ring steps done: the same on every rank
	broken error  // the failure that broke the communicator
}

// Create makes and sizes the segment file at path (for example
// /dev/shm/ddpshim-<nonce>) for world ranks and returns rank 0's Comm. Only
// rank 0 calls it, before the other ranks Open; the file is created with
// O_EXCL and mode 0600. Create does not block.
func Create(path string, world int, cfg Config) (*Comm, error) {
	if cfg.SlotBytes == 0 {
		cfg.SlotBytes = DefaultSlotBytes
	}
	geo, err := geometryFor(world, cfg.SlotBytes)
	if err != nil {
		return nil, fmt.Errorf("shm create %s: %w", path, err)
	}
	if err := checkTimeout(cfg); err != nil {
		return nil, fmt.Errorf("shm create %s: %w", path, err)
	}
	if cfg.DirectMin == 0 {
		cfg.DirectMin = DefaultDirectMin
	}
	mem, err := create(path, geo, cfg.DirectMin)
	if err != nil {
		return nil, fmt.Errorf("shm create: %w", err)
	}
	return newComm(mem, geo, 0, cfg), nil
}

// Open maps the segment file at path, made by Create for world ranks, and
// returns rank's Comm. It fails on a missing, foreign, truncated or
// differently sized file. Open does not block.
func Open(path string, rank, world int, cfg Config) (*Comm, error) {
	if rank < 0 || rank >= world {
		return nil, fmt.Errorf("shm open %s: rank %d out of range for world %d", path, rank, world)
	}
	if err := checkTimeout(cfg); err != nil {
		return nil, fmt.Errorf("shm open %s: %w", path, err)
	}
	mem, geo, err := open(path, world)
	if err != nil {
		return nil, fmt.Errorf("shm open rank %d: %w", rank, err)
	}
	if cfg.SlotBytes != 0 {
		if want, err := geometryFor(world, cfg.SlotBytes); err != nil || want.slot != geo.slot {
			syscall.Munmap(mem)
			return nil, fmt.Errorf("shm open %s: slot is %d bytes, config asks for %d", path, geo.slot, cfg.SlotBytes)
		}
	}
	return newComm(mem, geo, rank, cfg), nil
}

func checkTimeout(cfg Config) error {
	if cfg.Timeout < 0 {
		return fmt.Errorf("negative timeout %v", cfg.Timeout)
	}
	return nil
}

func newComm(mem []byte, geo geometry, rank int, cfg Config) *Comm {
	c := &Comm{
		rank:    rank,
		world:   geo.world,
		timeout: cfg.Timeout,
		seg:     geo.segBytes,
		mem:     mem,
		ctl:     make([]rankCtl, geo.world),
		slots:   make([][]byte, geo.world),
		abort:   u32(mem, offAbort),

		directMin: int64(atomic.LoadUint64(u64(mem, offDirect))),
		probe:     new(uint64),
		pushMin:   defaultPushMin,
	}
	if c.timeout == 0 {
		c.timeout = DefaultTimeout
	}
	// What a peer reads to check that it reaches this process's memory
	// (and not another process's that has the same pid in its namespace).
	*c.probe = probeWord(rank)
	for r := range c.ctl {
		b := ctlOff + r*ctlStride
		c.ctl[r] = rankCtl{
			seq:     u32(mem, b+offSeq),
			dtype:   u32(mem, b+offDType),
			op:      u32(mem, b+offOp),
			closed:  u32(mem, b+offClosed),
			count:   u64(mem, b+offCount),
			addr:    u64(mem, b+offAddr),
			pid:     u32(mem, b+offPid),
			cma:     u32(mem, b+offCMA),
			probe:   u64(mem, b+offProbe),
			gate:    u32(mem, b+offGate),
			writing: u32(mem, b+offWriting),
			in:      u32(mem, b+offIn),
			red:     u32(mem, b+offRed),
			done:    u32(mem, b+offDone),
			waiters: u32(mem, b+offWaiters),
		}
		o := geo.dataOff + r*geo.slot
		c.slots[r] = mem[o : o+geo.slot : o+geo.slot]
	}
	me := c.ctl[rank]
	atomic.StoreUint32(me.pid, uint32(os.Getpid()))
	atomic.StoreUint64(me.probe, uint64(uintptr(unsafe.Pointer(c.probe))))
	return c
}

// Unlink removes the segment's file name. Rank 0 calls it once every rank
// has mapped the segment; the mappings stay valid.
func Unlink(path string) error {
	if err := syscall.Unlink(path); err != nil {
		return fmt.Errorf("shm unlink %s: %w", path, err)
	}
	return nil
}

// Abort makes the in-flight AllReduce, if any, and every later one return an
// error wrapping failure.ErrAborted (and err, when not nil) within milliseconds, and
// raises the segment's abort flag so the peers' collectives fail promptly
// with failure.ErrPeer instead of timing out. It is idempotent (the first cause
// wins), does not wait for the in-flight AllReduce, and is safe to call
// concurrently with any method.
func (c *Comm) Abort(err error) {
	e := fmt.Errorf("rank %d: %w", c.rank, failure.ErrAborted)
	if err != nil {
		e = fmt.Errorf("rank %d: %w: %w", c.rank, failure.ErrAborted, err)
	}
	c.stop.CompareAndSwap(nil, &e)
	c.life.RLock()
	defer c.life.RUnlock()
	if c.mem != nil {
		c.raise(nil)
		c.wakeAll()
	}
}

// Close unmaps the segment. An in-flight AllReduce returns an error wrapping
// failure.ErrClosed (Close waits for it to return), later ones fail with failure.ErrClosed,
// and peers waiting on this rank fail with failure.ErrPeer. Close is idempotent and
// safe to call concurrently with any method.
func (c *Comm) Close() error {
	e := fmt.Errorf("rank %d: %w", c.rank, failure.ErrClosed)
	c.stop.CompareAndSwap(nil, &e)
	c.life.RLock()
	if c.mem != nil {
		atomic.StoreUint32(c.ctl[c.rank].closed, 1)
		c.wakeAll()
	}
	c.life.RUnlock()

	c.life.Lock()
	defer c.life.Unlock()
	if c.mem == nil {
		return nil
	}
	err := syscall.Munmap(c.mem)
	c.mem, c.ctl, c.slots, c.abort = nil, nil, nil, nil
	if err != nil {
		return fmt.Errorf("shm close rank %d: munmap: %w", c.rank, err)
	}
	return nil
}

// The abort word holds 1+rank of the first rank that failed or aborted, and
// abortMismatch when that rank failed because the ranks disagree, so the
// others report failure.ErrMismatch too, even those that have not seen the odd
// header themselves.
const (
	abortRankMask = 1<<16 - 1
	abortMismatch = 1 << 16
)

// raise sets the segment's abort flag for err (nil: an abort), unless a rank
// already has, and reports whether this call set it. The caller holds life
// and the mapping is live.
func (c *Comm) raise(err error) bool {
	v := uint32(c.rank) + 1
	if errors.Is(err, failure.ErrMismatch) {
		v |= abortMismatch
	}
	return atomic.CompareAndSwapUint32(c.abort, 0, v)
}

// firstError marks the failure of a collective that was the first its
// segment heard of: this rank raised the abort flag for it.
type firstError struct{ error }

func (e firstError) Unwrap() error { return e.error }

// RaisedFirst reports whether err is a collective's failure that was the
// first of its segment: this rank told its peers of it before returning,
// so their failures, and whatever they do next (close a connection to
// this rank), follow from it. A caller that also records failures seen
// elsewhere keeps this one as the cause.
func RaisedFirst(err error) bool {
	var f firstError
	return errors.As(err, &f)
}

// wakeAll wakes every sleeper on every rank's counters, so that they notice
// an abort or close at once. The caller holds life and the mapping is live.
func (c *Comm) wakeAll() {
	for i := range c.ctl {
		futexWake(c.ctl[i].in)
		futexWake(c.ctl[i].red)
		futexWake(c.ctl[i].done)
	}
}

// stopErr returns the error set by Abort or Close, or nil.
func (c *Comm) stopErr() error {
	if p := c.stop.Load(); p != nil {
		return *p
	}
	return nil
}

// AllReduce reduces buf in place across all ranks: on return every rank's buf
// holds the element-wise sum (op Sum) or mean (op Avg) of all ranks' bufs,
// bit-identical on every rank. len(buf) must be a multiple of dt.Size() (0 is
// allowed) and equal on every rank, as must dt and op; a disagreement gives
// failure.ErrMismatch on every rank.
//
// AllReduce blocks until the collective completes, ctx is done, the deadline
// passes (ctx's or Config.Timeout from now, whichever is earlier: failure.ErrTimeout),
// Abort or Close is called (failure.ErrAborted, failure.ErrClosed), or a peer aborts
// (failure.ErrPeer). Any error, invalid arguments included, breaks the
// communicator: it raises the segment's abort flag so the peers fail
// promptly too, and later calls fail at once. Calls must not overlap; an
// overlapping call returns an error without touching the collective.
func (c *Comm) AllReduce(ctx context.Context, buf []byte, dt reduce.DType, op reduce.Op) error {
	return c.collective(ctx, "all-reduce", [][]byte{buf}, dt, op, -1)
}

// Broadcast copies root's buffers into every other rank's: a collective
// like AllReduce (the same ordering, arguments, errors and breakage), and
// as AllReduce's results, bit-identical. bufs are taken as one run of
// bytes, in order: every rank passes buffers of the same lengths (the
// ranks check that the totals agree). dt only sizes the elements (the
// ranks check that they agree on it; each buffer holds whole elements).
// The ranks of a host use it to hand the result that their leader brought
// back from the other hosts to the rest (package host's hierarchy), and
// package host's Broadcast goes through it.
func (c *Comm) Broadcast(ctx context.Context, bufs [][]byte, dt reduce.DType, root int) error {
	if root < 0 || root >= c.world {
		return fmt.Errorf("shm broadcast on rank %d: root %d out of range for world %d", c.rank, root, c.world)
	}
	return c.collective(ctx, "broadcast", bufs, dt, reduce.Sum, root)
}

// collective runs an all-reduce of bufs[0] (root < 0) or a broadcast of
// bufs from root.
func (c *Comm) collective(ctx context.Context, what string, bufs [][]byte, dt reduce.DType, op reduce.Op, root int) error {
	if !c.busy.CompareAndSwap(false, true) {
		return fmt.Errorf("shm %s on rank %d: another collective is running on this communicator", what, c.rank)
	}
	defer c.busy.Store(false)
	c.life.RLock()
	defer c.life.RUnlock()
	if c.mem == nil {
		return fmt.Errorf("shm %s on rank %d: %w", what, c.rank, failure.ErrClosed)
	}
	seq := c.seq + 1
	if err := c.stopErr(); err != nil {
		return fmt.Errorf("shm %s %d: %w", what, seq, err)
	}
	if c.broken != nil {
		return fmt.Errorf("shm %s %d on rank %d: broken by an earlier error: %w", what, seq, c.rank, c.broken)
	}
	c.seq = seq
	var err error
	switch {
	case !dt.Valid():
		err = fmt.Errorf("invalid dtype %v", dt)
	case !op.Valid():
		err = fmt.Errorf("invalid op %v", op)
	default:
		for _, b := range bufs {
			if len(b)%dt.Size() != 0 {
				err = fmt.Errorf("buffer of %d bytes is not a whole number of %v", len(b), dt)
				break
			}
		}
		if err == nil {
			err = c.run(ctx, bufs, dt, op, seq, root)
		}
	}
	if err != nil {
		err = fmt.Errorf("shm %s %d on rank %d of %d: %w", what, seq, c.rank, c.world, err)
		c.broken = err
		if c.raise(err) {
			err = firstError{err}
		}
		c.wakeAll()
	}
	return err
}

// slotBytes returns the staging bytes of each rank in the segment.
func (c *Comm) slotBytes() int { return depth * c.world * c.seg }
