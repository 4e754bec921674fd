package comm

import (
	"context"
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/shim/cuda"
	"github.com/ddp-agent/ddp-agent/shim/nccl/nccltest"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
	"github.com/ddp-agent/ddp-agent/shim/status"
	"github.com/ddp-agent/ddp-agent/wire"
)

// gpuWorld is ncclWorld with the fake's CUDA driver too, so the watchdog
// records events, and an event ring on each rank to read what it reports.
// Each rank gets a stream of its own, as each GPU has.
func gpuWorld(t *testing.T, knobs map[string]string, n, timeoutMS int) (string, []*Comm, []unsafe.Pointer) {
	t.Helper()
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("a real CUDA driver is here: the shim would take it before the fake")
	}
	lib := fakeNCCL(t, knobs)
	t.Setenv("DDP_AGENT_CUDA_LIB", lib)
	comms := ncclWorld(t, lib, n, timeoutMS)
	for _, c := range comms {
		if c.tp.(*ncclTransport).cu == nil {
			t.Fatal("the fake CUDA driver was not loaded")
		}
		c.events = newEventRing()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if _, err := comms[0].tp.(*ncclTransport).cu.Current(nil); err != nil {
		t.Fatal(err)
	}
	streams := make([]unsafe.Pointer, n)
	for r, c := range comms {
		s, err := c.tp.(*ncclTransport).cu.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		streams[r] = s.Ptr()
	}
	return lib, comms, streams
}

// gpuAllreduce is allreduce on a locked thread per rank, as from the
// Python thread that owns a CUDA context; it returns when every rank has
// enqueued, not when the "GPU" is done.
func gpuAllreduce(comms []*Comm, streams []unsafe.Pointer, step uint64, bucket int32) []error {
	var wg sync.WaitGroup
	errs := make([]error, len(comms))
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			buf, _ := nccltest.HostBuffer(8) // freed with the process: the fake may still read it
			p := unsafe.Pointer(&buf[0])
			w, err := c.newWork(p, 2, reduce.Float32, reduce.Sum, step, bucket)
			if err == nil {
				err = c.tp.allReduce(w, p, 2, streams[r])
			}
			errs[r] = err
		}()
	}
	wg.Wait()
	return errs
}

// waitEvents takes events from c's ring until n have come or 5 s pass.
func waitEvents(c *Comm, n int) []wire.CollectiveEvent {
	var got []wire.CollectiveEvent
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < n && time.Now().Before(deadline) {
		got = append(got, c.events.take().Events...)
		time.Sleep(5 * time.Millisecond)
	}
	return got
}

// TestWatchdogTimesOnTheGPU: the events a rank reports carry the GPU's
// start and end of each collective (the fake "GPU" runs each for 60 ms,
// one after the other on the stream), not the host's enqueue.
func TestWatchdogTimesOnTheGPU(t *testing.T) {
	lib, comms, streams := gpuWorld(t, map[string]string{"FAKE_CUDA_KERNEL_MS": "60"}, 2, 10000)
	enqueued := time.Now()
	for step := range uint64(3) {
		for r, err := range gpuAllreduce(comms, streams, step, 1) {
			if err != nil {
				t.Fatalf("step %d rank %d: %v", step, r, err)
			}
		}
	}
	if took := time.Since(enqueued); took > 150*time.Millisecond {
		t.Errorf("enqueueing 3 collectives took %v: the caller waited for the GPU", took)
	}
	for r, c := range comms {
		evs := waitEvents(c, 3)
		if len(evs) != 3 {
			t.Fatalf("rank %d: %d events, want 3", r, len(evs))
		}
		for i, ev := range evs {
			d := time.Duration(ev.TEnd - ev.TStart)
			if ev.Step != uint64(i) || ev.Status != status.OK || d < 55*time.Millisecond || d > 90*time.Millisecond {
				t.Errorf("rank %d event %d: step %d status %d GPU time %v, want step %d, ok, 60ms", r, i, ev.Step, ev.Status, d, i)
			}
			if i > 0 && ev.TStart < evs[i-1].TEnd-int64(2*time.Millisecond) {
				t.Errorf("rank %d event %d starts %v before the previous one ends", r, i, time.Duration(evs[i-1].TEnd-ev.TStart))
			}
			// On the host clock: the third ends about 180 ms after the enqueue.
			if off := time.Duration(ev.TEnd - enqueued.UnixNano()); off < time.Duration(i+1)*55*time.Millisecond || off > time.Duration(i+1)*60*time.Millisecond+100*time.Millisecond {
				t.Errorf("rank %d event %d ends %v after the first enqueue", r, i, off)
			}
			// The GPU's times reach the host clock through an anchor
			// (nccl.clock), known to half its Record+Sync round trip: ms
			// under load. The first collective starts as it arrives.
			if ev.TArrive > ev.TStart+int64(10*time.Millisecond) {
				t.Errorf("rank %d event %d: arrived %v after it started on the GPU", r, i, time.Duration(ev.TArrive-ev.TStart))
			}
		}
	}
	for _, c := range comms {
		c.Close()
	}
	if n, err := nccltest.LiveEvents(lib); err != nil || n != 0 {
		t.Errorf("after close: %d CUDA events left (%v)", n, err)
	}
}

// TestWatchdogAbortsAHungKernel: a collective that was enqueued but never
// completes on the GPU aborts the communicator at the timeout; the next
// call fails with the cause, and the agent is told.
func TestWatchdogAbortsAHungKernel(t *testing.T) {
	_, comms, streams := gpuWorld(t, map[string]string{"FAKE_NCCL_HANG": "stream"}, 2, 400)
	start := time.Now()
	for r, err := range gpuAllreduce(comms, streams, 812, 3) {
		if err != nil {
			t.Fatalf("rank %d: the enqueue failed: %v", r, err)
		}
	}
	for r, c := range comms {
		select {
		case <-c.ctx.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("rank %d: not aborted 5s after the 400ms timeout", r)
		}
		if took := time.Since(start); took < 400*time.Millisecond || took > 1500*time.Millisecond {
			t.Errorf("rank %d aborted after %v, want just after 400ms", r, took)
		}
	}
	for r, err := range gpuAllreduce(comms, streams, 812, 4) {
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if status.Of(err) != status.Aborted || !strings.Contains(msg, "step 812 bucket 3") || !strings.Contains(msg, "has not completed on the GPU") {
			t.Errorf("rank %d, next call: %v (status %d), want aborted naming step 812 bucket 3", r, err, status.Of(err))
		}
	}
	for r, c := range comms {
		evs := waitEvents(c, 1)
		if len(evs) != 1 || evs[0].Step != 812 || evs[0].Bucket != 3 || evs[0].Status != status.Timeout {
			t.Errorf("rank %d: events %+v, want step 812 bucket 3 with status timeout", r, evs)
		}
	}
}

// TestWatchdogAsyncError: a peer lost mid-collective (NCCL's asynchronous
// error) aborts at once, long before the timeout, with NCCL's words.
func TestWatchdogAsyncError(t *testing.T) {
	_, comms, streams := gpuWorld(t, map[string]string{"FAKE_NCCL_FAIL": "async"}, 2, 60000)
	start := time.Now()
	for r, err := range gpuAllreduce(comms, streams, 5, 0) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r, c := range comms {
		select {
		case <-c.ctx.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("rank %d: the asynchronous error did not abort", r)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("rank %d aborted after %v", r, took)
		}
		cause := context.Cause(c.ctx).Error()
		if !strings.Contains(cause, "asynchronous error") || !strings.Contains(cause, "remote process exited") {
			t.Errorf("rank %d: cause %q", r, cause)
		}
		evs := waitEvents(c, 1)
		if len(evs) != 1 || evs[0].Status != status.Aborted {
			t.Errorf("rank %d: events %+v, want the collective reported aborted", r, evs)
		}
	}
}

// TestBlockingInitTakesTheCallersDevice: before NCCL 2.14 the init blocks,
// so it runs on a thread of its own; NCCL takes the device from that
// thread's CUDA context, which must be the caller's (the fake records
// whether one was current). Threads get no context unless bound.
func TestBlockingInitTakesTheCallersDevice(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("a real CUDA driver is here")
	}
	record := t.TempDir() + "/record.txt"
	lib := fakeNCCL(t, map[string]string{"FAKE_NCCL_VERSION": "21304", "FAKE_NCCL_RECORD": record, "FAKE_CUDA_AUTOCTX": "0"})
	t.Setenv("DDP_AGENT_CUDA_LIB", lib)
	comms := make([]*Comm, 2)
	blobs := make([]string, 2)
	for r := range comms {
		cfg, err := ParseConfig(`{"rank":` + strconv.Itoa(r) + `,"world_size":2,"transport":"nccl","nccl_lib":"` + lib + `","name":"t"}`)
		if err != nil {
			t.Fatal(err)
		}
		if comms[r], err = Open(cfg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(comms[r].Close)
		blobs[r], _ = comms[r].Info()
	}
	errs := make(chan error, 2)
	for _, c := range comms {
		go func() {
			// The caller: a thread with the context current, as PyTorch's.
			runtime.LockOSThread()
			cu, err := cuda.Load(lib)
			if err != nil {
				errs <- err
				return
			}
			var anyStream byte
			ctx, err := cu.Current(unsafe.Pointer(&anyStream)) // none current: the stream's
			if err == nil {
				err = cu.Bind(ctx)
			}
			if err == nil {
				err = c.Connect(blobs)
			}
			errs <- err
		}()
	}
	for range comms {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if comms[0].tp.(*ncclTransport).nc.NonBlocking() {
		t.Fatal("2.13 gave a non-blocking communicator")
	}
	b, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	inits := 0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "init ") {
			inits++
			if !strings.Contains(line, "cuda_ctx=1") {
				t.Errorf("init without the caller's CUDA context: %s", line)
			}
		}
	}
	if inits != 2 {
		t.Errorf("%d inits recorded, want 2:\n%s", inits, b)
	}
}

// TestInFlightEvents: a collective still unfinished a second after the
// hook was called is reported once as in flight, so that the agent sees
// which ranks arrived at a collective that hangs.
func TestInFlightEvents(t *testing.T) {
	_, comms, streams := gpuWorld(t, map[string]string{"FAKE_NCCL_HANG": "stream"}, 2, 30000)
	for r, err := range gpuAllreduce(comms, streams, 9, 2) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	c := comms[1]
	c.reportInFlight()
	if evs := c.events.take().Events; len(evs) != 0 {
		t.Fatalf("in-flight events before a second: %+v", evs)
	}
	time.Sleep(inFlightAfter + 50*time.Millisecond)
	c.reportInFlight()
	c.reportInFlight()
	evs := c.events.take().Events
	if len(evs) != 1 || evs[0].Status != wire.StatusInFlight || evs[0].Step != 9 || evs[0].Bucket != 2 || evs[0].TEnd != 0 || evs[0].TArrive == 0 {
		t.Errorf("in-flight events %+v, want one for step 9 bucket 2", evs)
	}
	for _, c := range comms { // else close waits the 30 s timeout for the hung kernel
		c.Abort(errors.New("test over"))
	}
}

// TestCloseWaitsForTheGPU: a comm closed right after its last enqueue
// (hook.Close() does not synchronize) still reports that collective once
// it has run, instead of leaving the agent waiting for it.
func TestCloseWaitsForTheGPU(t *testing.T) {
	_, comms, streams := gpuWorld(t, map[string]string{"FAKE_CUDA_KERNEL_MS": "300"}, 2, 10000)
	for r, err := range gpuAllreduce(comms, streams, 4, 1) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r, c := range comms {
		start := time.Now()
		c.Close()
		evs := c.events.take().Events
		if len(evs) != 1 || evs[0].Status != status.OK || evs[0].Step != 4 {
			t.Errorf("rank %d: events after close %+v, want step 4 finished", r, evs)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("rank %d: close took %v", r, took)
		}
	}
}
