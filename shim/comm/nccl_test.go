package comm

import (
	"encoding/binary"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/shim/nccl/nccltest"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
	"github.com/ddp-agent/ddp-agent/shim/status"
)

// fakeNCCL builds the fake libnccl.so.2 and points the fake's rendezvous
// at a fresh directory; the knobs go through the environment.
func fakeNCCL(t *testing.T, knobs map[string]string) string {
	t.Helper()
	nccltest.SkipIfInstalled(t, nccltest.LibName, "libcuda.so.1")
	path, err := nccltest.Build(t.TempDir())
	if errors.Is(err, nccltest.ErrNoCompiler) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("FAKE_NCCL_DIR", t.TempDir())
	for k, v := range knobs {
		t.Setenv(k, v)
	}
	return path
}

// ncclWorld opens n communicators of the nccl transport on the fake, as n
// ranks in this process, through the external bootstrap.
func ncclWorld(t *testing.T, lib string, n int, timeoutMS int) []*Comm {
	t.Helper()
	return openWorld(t, n, func(r int) string {
		return `{"rank":` + strconv.Itoa(r) + `,"world_size":` + strconv.Itoa(n) + `,"transport":"nccl","nccl_lib":"` + lib +
			`","timeout_ms":` + strconv.Itoa(timeoutMS) + `,"name":"t"}`
	})
}

// openWorld opens n communicators in this process from config(rank) and
// connects them through the external bootstrap: every rank's blob to every
// rank, all connecting at once (NCCL's init waits for every rank).
func openWorld(t *testing.T, n int, config func(rank int) string) []*Comm {
	t.Helper()
	comms := make([]*Comm, n)
	blobs := make([]string, n)
	for r := range n {
		cfg, err := ParseConfig(config(r))
		if err != nil {
			t.Fatal(err)
		}
		if comms[r], err = Open(cfg); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		t.Cleanup(comms[r].Close)
		if blobs[r], err = comms[r].Info(); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = comms[r].Connect(blobs)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("connect rank %d: %v", r, err)
		}
	}
	return comms
}

func f32s(vals ...float32) []byte {
	b := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// allreduce runs one all-reduce on every rank at once, as ddpshim_allreduce
// does, on C copies of bufs (NCCL's memory is never Go's), and copies the
// results back.
func allreduce(comms []*Comm, bufs [][]byte, op reduce.Op) []error {
	var wg sync.WaitGroup
	errs := make([]error, len(comms))
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cbuf, free := nccltest.HostBuffer(len(bufs[r]))
			defer free()
			copy(cbuf, bufs[r])
			p := unsafe.Pointer(&cbuf[0])
			w, err := c.newWork(p, int64(len(cbuf)/4), reduce.Float32, op, 7, 3)
			if err == nil {
				err = c.tp.allReduce(w, p, int64(len(cbuf)/4), nil)
			}
			copy(bufs[r], cbuf)
			errs[r] = err
		}()
	}
	wg.Wait()
	return errs
}

// TestNCCLTransport: a world of three over the fake NCCL, bootstrapped by
// exchanging blobs (rank 0's carries the unique id): sum and avg agree on
// every rank, and the communicator reports the NCCL it found.
func TestNCCLTransport(t *testing.T) {
	lib := fakeNCCL(t, map[string]string{"FAKE_NCCL_VERSION": "22005", "FAKE_NCCL_INPROGRESS": "2"})
	comms := ncclWorld(t, lib, 3, 10000)
	bufs := [][]byte{f32s(1, 2), f32s(10, 20), f32s(100, 200)}
	for r, err := range allreduce(comms, bufs, reduce.Sum) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		if want := f32s(111, 222); string(bufs[r]) != string(want) {
			t.Errorf("rank %d: sum got %v", r, bufs[r])
		}
	}
	// No broadcast over NCCL (torch.distributed's is NCCL's): refused
	// before NCCL is called, and the communicator stays usable.
	if _, err := comms[0].Broadcast([]unsafe.Pointer{unsafe.Pointer(&bufs[0][0])}, []int64{2}, reduce.Float32, 0, 0, 0); status.Of(err) != status.Invalid {
		t.Errorf("broadcast over nccl: got %v, want an invalid-argument error", err)
	}
	bufs = [][]byte{f32s(3), f32s(6), f32s(9)}
	for r, err := range allreduce(comms, bufs, reduce.Avg) {
		if err != nil || string(bufs[r]) != string(f32s(6)) {
			t.Errorf("rank %d: avg got %v, %v", r, bufs[r], err)
		}
	}
	info := comms[1].Describe()
	for _, want := range []string{`"transport":"nccl"`, `"version":"2.20.5"`, `"source":"` + lib + `"`, `"connected":true`, `"collectives":2`} {
		if !strings.Contains(info, want) {
			t.Errorf("comm info %s lacks %s", info, want)
		}
	}
	if _, err := comms[0].Info(); err == nil {
		t.Error("info after connect: want an error")
	}
}

// TestNCCLGating: NCCL 2.9 has no avg: refused before NCCL is called, and
// the communicator stays usable.
func TestNCCLGating(t *testing.T) {
	lib := fakeNCCL(t, map[string]string{"FAKE_NCCL_VERSION": "2904"})
	comms := ncclWorld(t, lib, 2, 10000)
	for _, err := range allreduce(comms, [][]byte{f32s(1), f32s(2)}, reduce.Avg) {
		if status.Of(err) != status.Invalid || !strings.Contains(err.Error(), "NCCL 2.9.4 has no avg") {
			t.Errorf("avg on 2.9: got %v", err)
		}
	}
	bufs := [][]byte{f32s(1), f32s(2)}
	for r, err := range allreduce(comms, bufs, reduce.Sum) {
		if err != nil || string(bufs[r]) != string(f32s(3)) {
			t.Errorf("rank %d: sum after a refused avg: %v, %v", r, bufs[r], err)
		}
	}
}

// TestNCCLFailure: an NCCL error fails the call with NCCL's own words and
// aborts the communicator; later calls fail at once.
func TestNCCLFailure(t *testing.T) {
	lib := fakeNCCL(t, map[string]string{"FAKE_NCCL_VERSION": "21903", "FAKE_NCCL_FAIL": "allreduce"})
	comms := ncclWorld(t, lib, 2, 10000)
	for r, err := range allreduce(comms, [][]byte{f32s(1), f32s(2)}, reduce.Sum) {
		if err == nil || !strings.Contains(err.Error(), "ncclAllReduce") || !strings.Contains(err.Error(), "step 7 bucket 3") {
			t.Errorf("rank %d: got %v, want NCCL's error with the step and bucket", r, err)
		}
	}
	for r, err := range allreduce(comms, [][]byte{f32s(1), f32s(2)}, reduce.Sum) {
		if status.Of(err) != status.Aborted {
			t.Errorf("rank %d after the failure: got %v (status %d), want aborted", r, err, status.Of(err))
		}
	}
}

// TestNCCLHang: a collective that never completes fails at the timeout,
// and ddpshim_abort ends one at once.
func TestNCCLHang(t *testing.T) {
	lib := fakeNCCL(t, map[string]string{"FAKE_NCCL_VERSION": "22005", "FAKE_NCCL_HANG": "allreduce"})
	comms := ncclWorld(t, lib, 2, 500)
	start := time.Now()
	errs := allreduce(comms, [][]byte{f32s(1), f32s(2)}, reduce.Sum)
	took := time.Since(start)
	for r, err := range errs {
		if status.Of(err) != status.Timeout && status.Of(err) != status.Aborted {
			t.Errorf("rank %d: got %v (status %d), want a timeout", r, err, status.Of(err))
		}
	}
	if took < 500*time.Millisecond || took > 3*time.Second {
		t.Errorf("hung all-reduce returned after %v, want the 500ms timeout", took)
	}

	comms = ncclWorld(t, lib, 2, 60000)
	go func() {
		time.Sleep(200 * time.Millisecond)
		for _, c := range comms {
			c.Abort(errors.New("agent says stop"))
		}
	}()
	start = time.Now()
	for r, err := range allreduce(comms, [][]byte{f32s(1), f32s(2)}, reduce.Sum) {
		if err == nil {
			t.Errorf("rank %d: an aborted all-reduce succeeded", r)
		}
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("abort ended the hung all-reduce after %v", took)
	}
}

// TestNCCLUnavailable: no NCCL anywhere is DDPSHIM_ERR_UNAVAILABLE naming
// the places tried.
func TestNCCLUnavailable(t *testing.T) {
	nccltest.SkipIfInstalled(t, nccltest.LibName) // then Load finds it, whatever the config says
	cfg, err := ParseConfig(`{"rank":0,"world_size":1,"transport":"nccl","nccl_lib":"/nonexistent/libnccl.so.2"}`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(cfg)
	if status.Of(err) != status.Unavailable || !strings.Contains(err.Error(), "/nonexistent/libnccl.so.2") || !strings.Contains(err.Error(), "libnccl.so.2") {
		t.Errorf("got %v (status %d)", err, status.Of(err))
	}
	t.Setenv("DDP_AGENT_NCCL_LIB", "/nonexistent/libnccl.so.2")
	if info := NCCLInfo(); !strings.Contains(info, `"found":false`) || !strings.Contains(info, "/nonexistent") {
		t.Errorf("nccl info: %s", info)
	}
}
