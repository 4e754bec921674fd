package comm

// #include <stdlib.h>
import "C"

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/internal/envname"
	"github.com/ddp-agent/ddp-agent/shim/agentconn"
	"github.com/ddp-agent/ddp-agent/shim/cuda"
	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/nccl"
	"github.com/ddp-agent/ddp-agent/shim/status"
	"github.com/ddp-agent/ddp-agent/wire"
)

// The NCCL transport. Unlike the host transport, whose collectives run in
// the executor goroutine, an NCCL all-reduce is enqueued on the caller's
// thread and CUDA stream inside ddpshim_allreduce: the hook completes its
// Future on that stream right after, so the enqueue must have happened by
// then, and NCCL takes the communicator's device from the calling thread
// at init. The work handle is complete when ddpshim_allreduce returns; the
// stream orders the rest, and the watchdog (nccl.Watchdog) watches it.

// ncclIDPrefix marks rank 0's bootstrap blob: the NCCL unique id in hex.
// The other ranks' blobs only say who they are.
const ncclIDPrefix = "nccl-id:"

// ncclTransport is the NCCL library, rank 0's unique id, and once
// connected the NCCL communicator with its watchdog.
type ncclTransport struct {
	c   *Comm
	lib *nccl.Lib
	id  [nccl.UniqueIDBytes]byte // rank 0's

	// Under c.mu, set by connect.
	nc    *nccl.Comm
	cu    *cuda.Lib      // nil without a CUDA driver
	watch *nccl.Watchdog // nil until connected
}

var _ transport = (*ncclTransport)(nil)

// openNCCL loads NCCL for c and, on rank 0, makes the unique id.
func openNCCL(c *Comm) (*ncclTransport, error) {
	lib, err := nccl.Load(c.cfg.ncclLib())
	if err != nil {
		return nil, status.Errorf(status.Unavailable, "transport nccl: %w", err)
	}
	t := &ncclTransport{c: c, lib: lib}
	if c.rank == 0 {
		id, err := lib.UniqueID()
		if err != nil {
			return nil, status.Errorf(nccl.Status(err), "transport nccl: %w", err)
		}
		t.id = id
	}
	c.log.Info("NCCL loaded", "source", lib.Source(), "version", lib.Version().String())
	return t, nil
}

// blob is this rank's blob for the external bootstrap.
func (t *ncclTransport) blob() (string, error) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.nc != nil {
		return "", status.Errorf(status.Invalid, "communicator is already connected")
	}
	if t.c.rank == 0 {
		return ncclIDPrefix + hex.EncodeToString(t.id[:]), nil
	}
	return "nccl-rank:" + strconv.Itoa(t.c.rank), nil
}

// connect makes the communicator from rank 0's blob.
func (t *ncclTransport) connect(lines []string) error {
	c := t.c
	if len(lines) != c.size {
		return status.Errorf(status.Invalid, "got %d bootstrap blobs for world size %d", len(lines), c.size)
	}
	hexID, ok := strings.CutPrefix(lines[0], ncclIDPrefix)
	raw, err := hex.DecodeString(hexID)
	if !ok || err != nil || len(raw) != nccl.UniqueIDBytes {
		return status.Errorf(status.Invalid, "blob 0 %q is not rank 0's NCCL unique id (mixed transports, or blobs out of order?)", truncate(lines[0], 40))
	}
	for r := 1; r < c.size; r++ {
		if want := "nccl-rank:" + strconv.Itoa(r); lines[r] != want {
			return status.Errorf(status.Invalid, "blob %d is %q, want %q: blobs must be in rank order, all from the nccl transport", r, truncate(lines[r], 40), want)
		}
	}
	var id [nccl.UniqueIDBytes]byte
	copy(id[:], raw)
	return t.open(id)
}

// bootstrapAgent passes rank 0's unique id through the agent's store.
func (t *ncclTransport) bootstrapAgent(ctx context.Context, cl *agentconn.Client) error {
	c := t.c
	key := "ddpshim/" + c.cfg.Name + "/nccl-id"
	if c.rank == 0 {
		if err := cl.KVSet(ctx, key, t.id[:]); err != nil {
			return status.Errorf(status.Unavailable, "publish the NCCL unique id through the agent: %w", err)
		}
		return t.open(t.id)
	}
	v, err := cl.KVGet(ctx, key, time.Until(deadline(ctx)))
	if err != nil {
		if cause := context.Cause(c.ctx); cause != nil {
			return status.AbortedBy(fmt.Errorf("waiting for the NCCL unique id: %w", cause))
		}
		if errors.Is(err, wire.ErrTimeout) || ctx.Err() != nil {
			return status.Errorf(status.Timeout, "rank 0 did not publish the NCCL unique id within %v: %w", c.cfg.timeout(), err)
		}
		return status.Errorf(status.Unavailable, "NCCL unique id from the agent: %w", err)
	}
	if len(v) != nccl.UniqueIDBytes {
		return status.Errorf(status.Invalid, "the NCCL unique id from the agent has %d bytes, want %d", len(v), nccl.UniqueIDBytes)
	}
	var id [nccl.UniqueIDBytes]byte
	copy(id[:], v)
	return t.open(id)
}

// open initializes the communicator on the calling thread (NCCL binds it
// to that thread's CUDA device), bounded by the timeout.
func (t *ncclTransport) open(id [nccl.UniqueIDBytes]byte) error {
	c := t.c
	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		return failure.ErrClosed
	case t.nc != nil:
		c.mu.Unlock()
		return status.Errorf(status.Invalid, "communicator is already connected")
	}
	c.mu.Unlock()
	cu, err := cuda.Load(c.cfg.cudaLib())
	if err != nil {
		c.log.Info("no CUDA driver: no GPU-side timing or hang detection", "err", err)
		cu = nil
	}
	var opts []nccl.Option
	if cu != nil {
		// A blocking init runs on a thread of its own: give it this
		// thread's context, hence its device.
		if ctx, err := cu.Current(nil); err == nil && ctx.Valid() {
			opts = append(opts, nccl.WithThreadSetup(func() error { return cu.Bind(ctx) }))
		}
	}
	nc, err := nccl.Open(t.lib, id, c.size, c.rank, c.cfg.timeout(), opts...)
	if err != nil {
		return status.Errorf(nccl.Status(err), "transport nccl: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		nc.Abort()
		return failure.ErrClosed
	}
	t.nc = nc
	t.cu = cu
	t.watch = nccl.NewWatchdog(watchOwner{c}, nc, cu, c.cfg.timeout(), c.log)
	c.log.Info("connected", "world_size", c.size, "transport", "nccl", "nonblocking", nc.NonBlocking(),
		"cuda", cu != nil)
	return nil
}

// allReduce enqueues w on stream and completes it, or returns why it
// could not (w is then dropped). A failure aborts the communicator: NCCL's
// state is unknown after one, and every later collective fails at once
// with the first cause.
func (t *ncclTransport) allReduce(w *Work, ptr unsafe.Pointer, count int64, stream unsafe.Pointer) error {
	c := t.c
	c.mu.Lock()
	nc, cu, watch := t.nc, t.cu, t.watch
	closed := c.closed
	c.mu.Unlock()
	switch {
	case closed:
		return failure.ErrClosed
	case nc == nil:
		return status.Errorf(status.Invalid, "communicator is not connected (call ddpshim_connect first)")
	}
	if err := context.Cause(c.ctx); err != nil {
		return status.AbortedBy(err)
	}
	feat := t.lib.Features()
	if (w.op == 4 && !feat.Avg) || (w.dt == 9 && !feat.BFloat16) {
		return status.Errorf(status.Invalid, "NCCL %s has no %s (from 2.10); use sum after dividing, or float32/float16",
			t.lib.Version(), map[bool]string{true: "avg", false: "bfloat16"}[w.op == 4 && !feat.Avg])
	}
	ev, timed, err := watch.Events(stream)
	if err != nil {
		c.Abort(err)
		return err
	}
	start := time.Now()
	w.started.Store(start.UnixNano())
	if timed {
		err = cu.Record(ev.Start, stream)
	}
	if err == nil {
		err = nc.AllReduce(ptr, count, int(w.dt), int(w.op), stream)
	}
	if err == nil && timed {
		err = cu.Record(ev.End, stream)
	}
	end := time.Now()
	f := nccl.Flight{Events: ev, Step: w.step, Bucket: w.bucket, Bytes: uint64(w.bytes), DType: uint8(w.dt), Arrive: w.arrive, Enqueued: end}
	switch {
	case err != nil:
		if timed {
			watch.Release(ev)
		}
		err = status.Errorf(statusOfGPU(err), "%s of step %d bucket %d (%d bytes, %v): %w", w.what(), w.step, w.bucket, w.bytes, w.dt, err)
		c.Abort(err)
		c.pushEvent(f, start, end, err)
	case timed:
		watch.Add(f) // its event, with GPU times, once it has run
	default:
		// Host-side times of the enqueue; the collective itself runs later.
		c.pushEvent(f, start, end, nil)
	}
	c.mu.Lock()
	c.collected++
	c.mu.Unlock()
	if err != nil {
		return err // the call itself fails: the caller learns at once, as with a hung enqueue
	}
	close(w.done)
	return nil
}

func (t *ncclTransport) abort(error) {
	t.c.mu.Lock()
	nc := t.nc
	t.c.mu.Unlock()
	if nc != nil {
		nc.Abort() // a collective hung in NCCL returns
	}
}

func (t *ncclTransport) connected() bool { return t.nc != nil }

// inFlight returns the watchdog's collectives that have not completed on
// the GPU and were enqueued for a collective that arrived before old.
func (t *ncclTransport) inFlight(old time.Time) []wire.CollectiveEvent {
	t.c.mu.Lock()
	watch := t.watch
	t.c.mu.Unlock()
	if watch == nil {
		return nil
	}
	var evs []wire.CollectiveEvent
	for _, f := range watch.Unfinished(old) {
		evs = append(evs, wire.CollectiveEvent{Step: f.Step, Bucket: uint32(f.Bucket), Bytes: f.Bytes,
			DType: f.DType, Status: wire.StatusInFlight, TArrive: f.Arrive.UnixNano(), TStart: f.Enqueued.UnixNano()})
	}
	return evs
}

// settle has the watchdog take its last look, which ships the events of
// what has completed.
func (t *ncclTransport) settle() {
	t.c.mu.Lock()
	watch := t.watch
	t.c.mu.Unlock()
	if watch != nil {
		watch.Settle()
		watch.Close()
	}
}

func (t *ncclTransport) close() {
	t.c.mu.Lock()
	nc := t.nc
	t.c.mu.Unlock()
	if nc != nil {
		if err := nc.Close(); err != nil {
			t.c.log.Warn("close the NCCL communicator", "err", err)
		}
	}
}

func (t *ncclTransport) describe(info map[string]any) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	info["connected"] = t.nc != nil
	info["transport"] = "nccl"
	info["nccl"] = map[string]any{"source": t.lib.Source(), "version": t.lib.Version().String(),
		"nonblocking": t.nc != nil && t.nc.NonBlocking(), "cuda": t.cu != nil}
}

// statusOfGPU maps an NCCL or CUDA error to its C status code.
func statusOfGPU(err error) int {
	var ce *cuda.Error
	if errors.As(err, &ce) {
		return status.Unavailable
	}
	return nccl.Status(err)
}

// cudaLib is the explicit CUDA driver path: the config's, else
// $DDP_AGENT_CUDA_LIB.
func (c *Config) cudaLib() string {
	if c.CUDALib != "" {
		return c.CUDALib
	}
	return getenv(envname.CUDALib)
}

// ncclLib is the explicit NCCL library path: the config's, else
// $DDP_AGENT_NCCL_LIB.
func (c *Config) ncclLib() string {
	if c.NCCLLib != "" {
		return c.NCCLLib
	}
	return getenv(envname.NCCLLib)
}

// noteFile is where the process's communicators leave their Note: the
// config's, else $DDP_AGENT_COMM_NOTE_FILE (set by the agent); "" for
// nowhere.
func (c *Config) noteFile() string {
	if c.NoteFile != "" {
		return c.NoteFile
	}
	return getenv(envname.CommNoteFile)
}

// getenv reads the C environment: Go's os.Getenv sees a copy taken when the
// runtime started, which misses what Python's os.environ set since.
func getenv(name string) string {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	if v := C.getenv(cs); v != nil {
		return C.GoString(v)
	}
	return ""
}

// NCCLInfo is ddpshim_nccl_info's JSON: what NCCL this process would use.
func NCCLInfo() string {
	info := map[string]any{"found": false}
	lib, err := nccl.Load(getenv(envname.NCCLLib))
	if err != nil {
		info["error"] = err.Error()
	} else {
		f := lib.Features()
		info["found"] = true
		info["source"] = lib.Source()
		info["version"] = lib.Version().String()
		info["features"] = map[string]bool{"avg": f.Avg, "bfloat16": f.BFloat16, "nonblocking": f.NonBlocking,
			"last_error": f.LastError, "finalize": f.Finalize}
	}
	// The driver the watchdog would time collectives with.
	if cu, err := cuda.Load(getenv(envname.CUDALib)); err != nil {
		info["cuda"] = map[string]any{"found": false, "error": err.Error()}
	} else {
		info["cuda"] = map[string]any{"found": true, "source": cu.Source(), "driver": cu.DriverVersion()}
	}
	out, _ := json.Marshal(info)
	return string(out)
}

// pushEvent reports a collective's times to the agent, if there is one.
func (c *Comm) pushEvent(f nccl.Flight, start, end time.Time, err error) {
	if c.events == nil {
		return
	}
	c.events.push(wire.CollectiveEvent{
		Step: f.Step, Bucket: uint32(f.Bucket), Bytes: f.Bytes, DType: f.DType, Status: uint8(status.Of(err)),
		TArrive: f.Arrive.UnixNano(), TStart: start.UnixNano(), TEnd: end.UnixNano(),
	})
}

// watchOwner is the comm as its watchdog sees it.
type watchOwner struct{ c *Comm }

func (o watchOwner) Abort(cause error) { o.c.Abort(cause) }
func (o watchOwner) Cause() error      { return context.Cause(o.c.ctx) }
func (o watchOwner) Report(f nccl.Flight, start, end time.Time, err error) {
	o.c.pushEvent(f, start, end, err)
}
