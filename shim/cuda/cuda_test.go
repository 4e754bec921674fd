package cuda_test

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/shim/cuda"
	"github.com/ddp-agent/ddp-agent/shim/nccl"
	"github.com/ddp-agent/ddp-agent/shim/nccl/nccltest"
)

// fake is the fake NCCL + CUDA driver library TestMain built ("" without gcc).
var fake string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fakecuda-build-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fake, err = nccltest.Build(dir)
	if err != nil && !errors.Is(err, nccltest.ErrNoCompiler) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func load(t *testing.T) *cuda.Lib {
	t.Helper()
	if fake == "" {
		t.Skip("no gcc to build the fake driver")
	}
	nccltest.SkipIfInstalled(t, "libcuda.so.1", nccltest.LibName)
	l, err := cuda.Load(fake)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestLoad(t *testing.T) {
	l := load(t)
	if l.Source() != fake || l.DriverVersion() != "12.8" {
		t.Errorf("source %q driver %q, want %q 12.8", l.Source(), l.DriverVersion(), fake)
	}
	_, err := cuda.Load("/nonexistent/libcuda.so.1")
	if err == nil || !strings.Contains(err.Error(), "no CUDA driver") || !strings.Contains(err.Error(), "libcuda.so.1") {
		t.Errorf("missing driver: %v", err)
	}
	if _, err := cuda.Load(""); err == nil {
		t.Error("no path, no driver: Load succeeded")
	}
	t.Setenv("FAKE_CUDA_FAIL", "init")
	_, err = cuda.Load(fake)
	var ce *cuda.Error
	if !errors.As(err, &ce) || ce.Func != "cuInit" || !strings.Contains(err.Error(), "CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device") {
		t.Errorf("cuInit failure: %v", err)
	}
}

// TestEventsTimeAKernel enqueues an all-reduce that the fake's "GPU" runs for
// 80 ms and times it with events queried from another thread.
func TestEventsTimeAKernel(t *testing.T) {
	l := load(t)
	t.Setenv("FAKE_CUDA_KERNEL_MS", "80")
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ctx, err := l.Current(nil)
	if err != nil || !ctx.Valid() {
		t.Fatalf("context: %v %v", ctx, err)
	}
	// A thread keeps its context, as in CUDA: this one goes back to Go's
	// pool without it, or a later test's goroutine run there would find
	// one where it wants none (the watchdog's query below, under -count 2).
	defer l.Bind(cuda.Context{})
	s, err := l.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer l.DestroyStream(s)
	start, _ := l.NewEvent()
	end, err := l.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer l.DestroyEvent(start)
	defer l.DestroyEvent(end)

	nl, err := nccl.Load(fake)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := nl.UniqueID()
	nc, err := nccl.Open(nl, id, 1, 0, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	buf, free := nccltest.HostBuffer(16)
	defer free()

	if err := l.Record(start, s.Ptr()); err != nil {
		t.Fatal(err)
	}
	if err := nc.AllReduce(unsafe.Pointer(&buf[0]), 4, nccl.Float32, nccl.Sum, s.Ptr()); err != nil {
		t.Fatal(err)
	}
	if err := l.Record(end, s.Ptr()); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Elapsed(start, end); err != cuda.ErrNotReady {
		t.Errorf("elapsed before the end: %v, want ErrNotReady", err)
	}

	// The watchdog's view: another thread, which must bind the context.
	res := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if _, err := l.Done(end); err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_INVALID_CONTEXT") {
			res <- fmt.Errorf("query without a context: %v", err)
			return
		}
		if err := l.Bind(ctx); err != nil {
			res <- err
			return
		}
		defer l.Bind(cuda.Context{})
		if done, err := l.Done(end); done || err != nil {
			res <- fmt.Errorf("done at once: %v %v", done, err)
			return
		}
		for {
			done, err := l.Done(end)
			if err != nil || done {
				res <- err
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	d, err := l.Elapsed(start, end)
	if err != nil || d < 79*time.Millisecond || d > 200*time.Millisecond {
		t.Errorf("elapsed %v %v, want about 80ms", d, err)
	}
	if back, _ := l.Elapsed(end, start); back != -d {
		t.Errorf("elapsed backwards %v, want %v", back, -d)
	}
}

// TestHungKernel: behind a kernel that never ends, an event stays pending
// until the communicator is aborted.
func TestHungKernel(t *testing.T) {
	l := load(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if _, err := l.Current(nil); err != nil {
		t.Fatal(err)
	}
	defer l.Bind(cuda.Context{}) // as in TestEventsTimeAKernel
	s, _ := l.NewStream()
	defer l.DestroyStream(s)
	end, _ := l.NewEvent()
	defer l.DestroyEvent(end)
	nl, _ := nccl.Load(fake)
	id, _ := nl.UniqueID()
	nc, err := nccl.Open(nl, id, 1, 0, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	buf, free := nccltest.HostBuffer(16)
	defer free()
	t.Setenv("FAKE_NCCL_HANG", "stream")
	if err := nc.AllReduce(unsafe.Pointer(&buf[0]), 4, nccl.Float32, nccl.Sum, s.Ptr()); err != nil {
		t.Fatal(err)
	}
	l.Record(end, s.Ptr())
	time.Sleep(20 * time.Millisecond)
	if done, err := l.Done(end); done || err != nil {
		t.Fatalf("behind a hung kernel: done %v %v", done, err)
	}
	nc.Abort()
	if done, err := l.Done(end); !done || err != nil {
		t.Fatalf("after the abort: done %v %v", done, err)
	}
}
