package main

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

	"github.com/ddp-agent/ddp-agent/agent/control"
	"github.com/ddp-agent/ddp-agent/ncclshim/nccl"
)

// The NCCL transport. Unlike the host transport, whose collectives run in
// the executor goroutine, an NCCL all-reduce is enqueued on the caller's
// thread and CUDA stream inside ddpshim_allreduce: the hook completes its
// Future on that stream right after, so the enqueue must have happened by
// then, and NCCL takes the communicator's device from the calling thread
// at init. The work handle is complete when ddpshim_allreduce returns; the
// stream orders the rest.

// ncclIDPrefix marks rank 0's bootstrap blob: the NCCL unique id in hex.
// The other ranks' blobs only say who they are.
const ncclIDPrefix = "nccl-id:"

// openNCCLTransport loads NCCL for c and, on rank 0, makes the unique id.
func (c *comm) openNCCLTransport() error {
	lib, err := nccl.Load(c.cfg.ncclLib())
	if err != nil {
		return errorf(rcUnavailable, "transport nccl: %w", err)
	}
	c.ncLib = lib
	if c.rank == 0 {
		id, err := lib.UniqueID()
		if err != nil {
			return errorf(nccl.Status(err), "transport nccl: %w", err)
		}
		c.ncID = id
	}
	c.log.Info("NCCL loaded", "source", lib.Source(), "version", lib.Version().String())
	return nil
}

// ncclInfo is this rank's blob for the external bootstrap.
func (c *comm) ncclInfo() string {
	if c.rank == 0 {
		return ncclIDPrefix + hex.EncodeToString(c.ncID[:])
	}
	return "nccl-rank:" + strconv.Itoa(c.rank)
}

// connectNCCL makes the communicator from rank 0's blob.
func (c *comm) connectNCCL(lines []string) error {
	if len(lines) != c.size {
		return errorf(rcInvalid, "got %d bootstrap blobs for world size %d", len(lines), c.size)
	}
	hexID, ok := strings.CutPrefix(lines[0], ncclIDPrefix)
	raw, err := hex.DecodeString(hexID)
	if !ok || err != nil || len(raw) != nccl.UniqueIDBytes {
		return errorf(rcInvalid, "blob 0 %q is not rank 0's NCCL unique id (mixed transports, or blobs out of order?)", truncate(lines[0], 40))
	}
	for r := 1; r < c.size; r++ {
		if want := "nccl-rank:" + strconv.Itoa(r); lines[r] != want {
			return errorf(rcInvalid, "blob %d is %q, want %q: blobs must be in rank order, all from the nccl transport", r, truncate(lines[r], 40), want)
		}
	}
	var id [nccl.UniqueIDBytes]byte
	copy(id[:], raw)
	return c.openNCCL(id)
}

// bootstrapAgentNCCL passes rank 0's unique id through the agent's store.
func (c *comm) bootstrapAgentNCCL(ctx context.Context, cl *control.Client) error {
	key := "ddpshim/" + c.cfg.Name + "/nccl-id"
	if c.rank == 0 {
		if err := cl.KVSet(ctx, key, c.ncID[:]); err != nil {
			return errorf(rcUnavailable, "publish the NCCL unique id through the agent: %w", err)
		}
		return c.openNCCL(c.ncID)
	}
	v, err := cl.KVGet(ctx, key, time.Until(deadline(ctx)))
	if err != nil {
		if cause := context.Cause(c.ctx); cause != nil {
			return aborted(fmt.Errorf("waiting for the NCCL unique id: %w", cause))
		}
		if errors.Is(err, control.ErrTimeout) || ctx.Err() != nil {
			return errorf(rcTimeout, "rank 0 did not publish the NCCL unique id within %v: %w", c.cfg.timeout(), err)
		}
		return errorf(rcUnavailable, "NCCL unique id from the agent: %w", err)
	}
	if len(v) != nccl.UniqueIDBytes {
		return errorf(rcInvalid, "the NCCL unique id from the agent has %d bytes, want %d", len(v), nccl.UniqueIDBytes)
	}
	var id [nccl.UniqueIDBytes]byte
	copy(id[:], v)
	return c.openNCCL(id)
}

// openNCCL initializes the communicator on the calling thread (NCCL binds
// it to that thread's CUDA device), bounded by the timeout.
func (c *comm) openNCCL(id [nccl.UniqueIDBytes]byte) error {
	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		return errClosed
	case c.nc != nil:
		c.mu.Unlock()
		return errorf(rcInvalid, "communicator is already connected")
	}
	c.mu.Unlock()
	nc, err := nccl.Open(c.ncLib, id, c.size, c.rank, c.cfg.timeout())
	if err != nil {
		return errorf(nccl.Status(err), "transport nccl: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		nc.Abort()
		return errClosed
	}
	c.nc = nc
	c.log.Info("connected", "world_size", c.size, "transport", "nccl", "nonblocking", nc.NonBlocking())
	return nil
}

// allreduceNCCL enqueues w on stream and completes it, or returns why it
// could not (w is then dropped). A failure aborts the communicator: NCCL's state is unknown after
// one, and every later collective fails at once with the first cause.
func (c *comm) allreduceNCCL(w *work, ptr unsafe.Pointer, count int64, stream unsafe.Pointer) error {
	c.mu.Lock()
	nc := c.nc
	closed := c.closed
	c.mu.Unlock()
	switch {
	case closed:
		return errClosed
	case nc == nil:
		return errorf(rcInvalid, "communicator is not connected (call ddpshim_connect first)")
	}
	if err := context.Cause(c.ctx); err != nil {
		return aborted(err)
	}
	f := c.ncLib.Features()
	if (w.op == 4 && !f.Avg) || (w.dt == 9 && !f.BFloat16) {
		return errorf(rcInvalid, "NCCL %s has no %s (from 2.10); use sum after dividing, or float32/float16",
			c.ncLib.Version(), map[bool]string{true: "avg", false: "bfloat16"}[w.op == 4 && !f.Avg])
	}
	start := time.Now()
	w.started.Store(start.UnixNano())
	err := nc.AllReduce(ptr, count, int(w.dt), int(w.op), stream)
	end := time.Now()
	if err != nil {
		err = errorf(nccl.Status(err), "all-reduce of step %d bucket %d (%d bytes, %v): %w", w.step, w.bucket, len(w.buf), w.dt, err)
		c.abort(err)
	}
	if c.events != nil {
		// Host-side times of the enqueue; on a CUDA stream the collective
		// itself runs later.
		c.events.push(control.CollectiveEvent{
			Step: w.step, Bucket: uint32(w.bucket), Bytes: uint64(len(w.buf)), DType: uint8(w.dt),
			Status: uint8(statusOf(err)), TArrive: w.arrive.UnixNano(), TStart: start.UnixNano(), TEnd: end.UnixNano(),
		})
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

// ncclLib is the explicit NCCL library path: the config's, else
// $DDP_AGENT_NCCL_LIB.
func (c *config) ncclLib() string {
	if c.NCCLLib != "" {
		return c.NCCLLib
	}
	return getenv("DDP_AGENT_NCCL_LIB")
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

// ncclInfo is ddpshim_nccl_info's JSON: what NCCL this process would use.
func ncclInfo() string {
	info := map[string]any{"found": false}
	lib, err := nccl.Load(getenv("DDP_AGENT_NCCL_LIB"))
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
	out, _ := json.Marshal(info)
	return string(out)
}
