package nccl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/nccl/nccltest"
	"github.com/ddp-agent/ddp-agent/shim/status"
)

const (
	blockingCode    = 20904 // 2.9.4: blocking ncclCommInitRank, no avg, no bf16
	nonBlockingCode = 22005 // 2.20.5: everything
	margin          = 2 * time.Second
)

var modes = []struct {
	name string
	code int
}{
	{"blocking 2.9", blockingCode},
	{"non-blocking 2.20", nonBlockingCode},
}

// TestConfigSeenByNCCL: the fake (declaring NCCL 2.27's larger
// ncclConfig_t) records the config as parseCommConfig would see it: our
// size, the magic, the version we declare against, blocking=0, and NCCL's
// own defaults past our struct. Before 2.14 no config is passed at all.
func TestConfigSeenByNCCL(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) == 8 && configSize() != 48 {
		t.Errorf("sizeof(ncclConfig_t) = %d, want 48 on LP64 (size_t, 2 unsigned, 4 int, pointer, int, padding)", configSize())
	}
	undef := strconv.Itoa(math.MinInt32)
	for _, code := range []int{21400, 22005} {
		t.Run(ParseVersion(code).String(), func(t *testing.T) {
			lib, rec := setup(t, code)
			for _, c := range openAll(t, lib, 1, 5*time.Second) {
				if !c.NonBlocking() {
					t.Error("not a non-blocking communicator")
				}
				if err := c.Close(); err != nil {
					t.Error(err)
				}
			}
			evs := find(records(t, rec), "init", "api=ncclCommInitRankConfig")
			if len(evs) != 1 {
				t.Fatalf("got %d InitRankConfig events, want 1", len(evs))
			}
			want := map[string]string{
				"size":           strconv.Itoa(configSize()),
				"magic":          "0xcafebeef",
				"version":        strconv.Itoa(configVersion()),
				"blocking":       "0",
				"cgaClusterSize": undef,
				"minCTAs":        undef,
				"maxCTAs":        undef,
				"netName":        "NULL",
				"splitShare":     undef,
				"trafficClass":   undef, // newer than our version: NCCL's default
				"collnetEnable":  undef, // past our struct: NCCL's initializer
				// What NCCL 2.25+ copies into trafficClass before the
				// version check resets it: our zeroed trailing padding.
				"copiedTrafficClass": "0",
			}
			for k, v := range want {
				if got := evs[0].kv[k]; got != v {
					t.Errorf("config %s: got %s, want %s", k, got, v)
				}
			}
			if configVersion() != VersionCode(2, 18, 0) {
				t.Errorf("declared config version %d, want NCCL_VERSION(2,18,0)", configVersion())
			}
		})
	}
	for _, code := range []int{blockingCode, 21303} {
		t.Run(ParseVersion(code).String(), func(t *testing.T) {
			lib, rec := setup(t, code)
			for _, c := range openAll(t, lib, 1, 5*time.Second) {
				if c.NonBlocking() {
					t.Error("non-blocking communicator before 2.14")
				}
			}
			evs := records(t, rec)
			if n := len(find(evs, "init", "api=ncclCommInitRank")); n != 1 {
				t.Errorf("got %d ncclCommInitRank events, want 1", n)
			}
			if n := len(find(evs, "init", "api=ncclCommInitRankConfig")); n != 0 {
				t.Errorf("got %d ncclCommInitRankConfig events, want 0", n)
			}
		})
	}
}

// TestInProgress: with FAKE_NCCL_INPROGRESS=k, init, each all-reduce and
// finalize report ncclInProgress at least k times; Open, AllReduce and
// Close poll through them to success.
func TestInProgress(t *testing.T) {
	for _, k := range []int{1, 5, 200} {
		t.Run(fmt.Sprintf("k=%d", k), func(t *testing.T) {
			lib, rec := setup(t, nonBlockingCode, fmt.Sprintf("FAKE_NCCL_INPROGRESS=%d", k))
			const n, count = 2, 64
			comms := openAll(t, lib, n, 10*time.Second)
			bufs := fill(t, n, count, Float32, func(r, i int) float64 { return float64(r + i) })
			for step := range 3 {
				errs := each(n, func(r int) error {
					return comms[r].AllReduce(unsafe.Pointer(&bufs[r][0]), count, Float32, Sum, nil)
				})
				for r, err := range errs {
					if err != nil {
						t.Fatalf("step %d rank %d: %v", step, r, err)
					}
				}
			}
			for r, c := range comms {
				if err := c.Close(); err != nil {
					t.Errorf("close rank %d: %v", r, err)
				}
			}
			for i := range count { // (0+i)+(1+i) = 2i+1, doubled twice more
				if got, want := getF(bufs[0], Float32, i), float64(4*(2*i+1)); got != want {
					t.Fatalf("element %d: got %v, want %v", i, got, want)
				}
			}
			evs := records(t, rec)
			for r := range n {
				for _, op := range []string{"init", "allreduce", "finalize"} {
					got := find(evs, "inprogress", "op="+op, fmt.Sprintf("rank=%d", r), "result=0")
					want := map[string]int{"init": 1, "allreduce": 3, "finalize": 1}[op]
					if len(got) != want {
						t.Errorf("rank %d: %d successful %s events, want %d", r, len(got), op, want)
					}
					for _, ev := range got {
						if reports, _ := strconv.Atoi(ev.kv["reports"]); reports < k {
							t.Errorf("rank %d %s: %d ncclInProgress reports, want at least %d", r, op, reports, k)
						}
					}
				}
				if len(find(evs, "destroy", fmt.Sprintf("rank=%d", r))) != 1 || len(find(evs, "abort")) != 0 {
					t.Errorf("rank %d: want a destroy and no abort, got %v", r, evs)
				}
			}
		})
	}
}

// TestAllReduce: two and three ranks (threads) all-reduce every data type
// with sum and avg; every rank ends with the same bytes, and the right
// values (exact: small integers, halves).
func TestAllReduce(t *testing.T) {
	type kase struct {
		name      string
		dtype, op int
	}
	cases := []kase{
		{"f32 sum", Float32, Sum},
		{"f32 avg", Float32, Avg},
		{"bf16 sum", BFloat16, Sum},
		{"bf16 avg", BFloat16, Avg},
		{"f16 sum", Float16, Sum},
		{"f16 avg", Float16, Avg},
		{"f64 sum", Float64, Sum},
		{"i32 sum", Int32, Sum},
		{"i32 avg", Int32, Avg},
		{"i64 sum", Int64, Sum},
	}
	for _, m := range modes {
		for _, n := range []int{2, 3} {
			t.Run(fmt.Sprintf("%s/%d ranks", m.name, n), func(t *testing.T) {
				lib, rec := setup(t, m.code)
				comms := openAll(t, lib, n, 10*time.Second)
				issued := 0
				for _, tc := range cases {
					t.Run(tc.name, func(t *testing.T) {
						if lib.checkOp(tc.dtype, tc.op) != nil {
							t.Skipf("not in NCCL %s", lib.Version())
						}
						const count = 1000
						val := func(r, i int) float64 { return float64(r + 1 + i%7) }
						bufs := fill(t, n, count, tc.dtype, val)
						errs := each(n, func(r int) error {
							return comms[r].AllReduce(unsafe.Pointer(&bufs[r][0]), count, tc.dtype, tc.op, nil)
						})
						issued++
						for r, err := range errs {
							if err != nil {
								t.Fatalf("rank %d: %v", r, err)
							}
						}
						for r := 1; r < n; r++ {
							if !bytes.Equal(bufs[r], bufs[0]) {
								t.Fatalf("rank %d's result differs from rank 0's", r)
							}
						}
						for i := range count {
							sum := float64(n*(n+1)/2 + n*(i%7))
							want := sum
							if tc.op == Avg {
								want = sum / float64(n)
								if tc.dtype == Int32 || tc.dtype == Int64 {
									want = math.Trunc(want)
								}
							}
							if got := getF(bufs[0], tc.dtype, i); got != want {
								t.Fatalf("element %d: got %v, want %v", i, got, want)
							}
						}
					})
				}
				// A zero-length all-reduce is a no-op that needs no buffer.
				for r, err := range each(n, func(r int) error { return comms[r].AllReduce(nil, 0, Float32, Sum, nil) }) {
					if err != nil {
						t.Errorf("empty all-reduce, rank %d: %v", r, err)
					}
				}
				for r, c := range comms {
					if err := c.AsyncError(); err != nil {
						t.Errorf("rank %d: AsyncError: %v", r, err)
					}
				}
				evs := records(t, rec)
				for r := range n {
					got := find(evs, "allreduce", fmt.Sprintf("rank=%d", r), "inplace=1")
					if len(got) != issued+1 {
						t.Errorf("rank %d: %d in-place ncclAllReduce calls, want %d", r, len(got), issued+1)
					}
				}
			})
		}
	}
}

// TestUnsupported: an avg or a bf16 the version lacks, a bad type, op,
// count or buffer fail before NCCL is called, and leave the Comm usable.
func TestUnsupported(t *testing.T) {
	lib, rec := setup(t, blockingCode)
	c := openAll(t, lib, 1, 5*time.Second)[0]
	buf, free := nccltest.HostBuffer(64)
	defer free()
	p := unsafe.Pointer(&buf[0])
	tests := []struct {
		name      string
		buf       unsafe.Pointer
		count     int64
		dtype, op int
		want      error
	}{
		{"avg before 2.10", p, 4, Float32, Avg, ErrUnsupported},
		{"bf16 before 2.10", p, 4, BFloat16, Sum, ErrUnsupported},
		{"unknown type", p, 4, 42, Sum, failure.ErrInvalid},
		{"negative type", p, 4, -1, Sum, failure.ErrInvalid},
		{"unknown op", p, 4, Float32, 9, failure.ErrInvalid},
		{"negative count", p, -1, Float32, Sum, failure.ErrInvalid},
		{"nil buffer", nil, 4, Float32, Sum, failure.ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := c.AllReduce(tc.buf, tc.count, tc.dtype, tc.op, nil)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if Status(err) != status.Invalid {
				t.Errorf("status %d, want %d", Status(err), status.Invalid)
			}
		})
	}
	if n := len(find(records(t, rec), "allreduce")); n != 0 {
		t.Errorf("NCCL was called %d times", n)
	}
	if err := c.AllReduce(p, 4, Float32, Sum, nil); err != nil {
		t.Errorf("a valid all-reduce afterwards: %v", err)
	}
}

// TestHang: an all-reduce that never completes (FAKE_NCCL_HANG) returns
// when another goroutine calls Abort or Close, or at the Comm's timeout.
func TestHang(t *testing.T) {
	const n = 2
	for _, m := range modes {
		for _, how := range []string{"Abort", "Close", "timeout"} {
			t.Run(m.name+"/"+how, func(t *testing.T) {
				lib, rec := setup(t, m.code, "FAKE_NCCL_HANG=allreduce")
				timeout := 30 * time.Second
				if how == "timeout" {
					timeout = 300 * time.Millisecond
				}
				comms := openAll(t, lib, n, timeout)
				bufs := fill(t, n, 16, Float32, func(r, i int) float64 { return 1 })
				start := time.Now()
				done := make([]time.Time, n)
				errc := make(chan []error, 1)
				go func() {
					errc <- each(n, func(r int) error {
						err := comms[r].AllReduce(unsafe.Pointer(&bufs[r][0]), 16, Float32, Sum, nil)
						done[r] = time.Now()
						return err
					})
				}()
				for r := range n {
					waitFor(t, rec, "allreduce", fmt.Sprintf("rank=%d", r))
				}
				var stopped time.Time
				switch how {
				case "Abort":
					time.Sleep(100 * time.Millisecond)
					stopped = time.Now()
					each(n, func(r int) error { comms[r].Abort(); return nil })
				case "Close":
					time.Sleep(100 * time.Millisecond)
					stopped = time.Now()
					for r, err := range each(n, func(r int) error { return comms[r].Close() }) {
						if err != nil {
							t.Errorf("close rank %d: %v", r, err)
						}
					}
				case "timeout":
					stopped = start.Add(timeout)
				}
				var errs []error
				select {
				case errs = <-errc:
				case <-time.After(timeout + 10*time.Second):
					t.Fatal("the hung all-reduce did not return")
				}
				for r, err := range errs {
					t.Logf("rank %d: %v", r, err)
					wantErr, wantStatus := failure.ErrAborted, status.Aborted
					if how == "timeout" {
						wantErr, wantStatus = failure.ErrTimeout, status.Timeout
						if d := done[r].Sub(start); d < timeout {
							t.Errorf("rank %d returned after %v, before the %v timeout", r, d, timeout)
						}
					}
					if !errors.Is(err, wantErr) || Status(err) != wantStatus {
						t.Errorf("rank %d: got %v (status %d), want %v (status %d)", r, err, Status(err), wantErr, wantStatus)
					}
					if d := done[r].Sub(stopped); d > margin {
						t.Errorf("rank %d returned %v after it was stopped, want within %v", r, d, margin)
					}
				}
				// Every later call fails at once.
				for r, c := range comms {
					err := c.AllReduce(unsafe.Pointer(&bufs[r][0]), 16, Float32, Sum, nil)
					want := failure.ErrAborted
					if how == "Close" {
						want = failure.ErrClosed
					}
					if !errors.Is(err, want) {
						t.Errorf("rank %d, next all-reduce: got %v, want %v", r, err, want)
					}
					if how == "timeout" && !errors.Is(err, failure.ErrTimeout) {
						t.Errorf("rank %d, next all-reduce: %v does not carry the first cause", r, err)
					}
					if err := c.AsyncError(); err == nil {
						t.Errorf("rank %d: AsyncError is nil after the abort", r)
					}
					if err := c.Close(); err != nil {
						t.Errorf("rank %d: close: %v", r, err)
					}
				}
				evs := records(t, rec)
				for r := range n {
					if len(find(evs, "abort", fmt.Sprintf("rank=%d", r))) != 1 {
						t.Errorf("rank %d: ncclCommAbort not called once", r)
					}
					if len(find(evs, "destroy", fmt.Sprintf("rank=%d", r))) != 0 {
						t.Errorf("rank %d: ncclCommDestroy called on an aborted communicator", r)
					}
				}
			})
		}
	}
}

// TestConcurrentAbortClose: Abort, Close and AsyncError from many
// goroutines at once, during hung all-reduces, are safe (run with -race)
// and idempotent.
func TestConcurrentAbortClose(t *testing.T) {
	const n = 3
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			lib, rec := setup(t, m.code, "FAKE_NCCL_HANG=allreduce")
			comms := openAll(t, lib, n, 30*time.Second)
			bufs := fill(t, n, 8, Float32, func(r, i int) float64 { return 1 })
			var wg sync.WaitGroup
			arErrs := make([]error, n)
			for r := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					arErrs[r] = comms[r].AllReduce(unsafe.Pointer(&bufs[r][0]), 8, Float32, Sum, nil)
				}()
				waitFor(t, rec, "allreduce", fmt.Sprintf("rank=%d", r))
			}
			for g := range 12 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := comms[g%n]
					for i := range 20 {
						switch (g + i) % 3 {
						case 0:
							c.Abort()
						case 1:
							if err := c.Close(); err != nil {
								t.Errorf("close: %v", err)
							}
						case 2:
							c.AsyncError()
						}
					}
				}()
			}
			wg.Wait()
			for r, err := range arErrs {
				if !errors.Is(err, failure.ErrAborted) {
					t.Errorf("rank %d: got %v, want failure.ErrAborted", r, err)
				}
			}
			evs := records(t, rec)
			for r := range n {
				if got := len(find(evs, "abort", fmt.Sprintf("rank=%d", r))); got != 1 {
					t.Errorf("rank %d: %d ncclCommAbort calls, want 1", r, got)
				}
			}
		})
	}
}

// TestClose: a clean Close finalizes (non-blocking) and destroys; a second
// Close is a no-op; calls after Close fail with failure.ErrClosed.
func TestClose(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			lib, rec := setup(t, m.code)
			c := openAll(t, lib, 1, 5*time.Second)[0]
			for range 2 {
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
			}
			c.Abort() // no-op
			buf, free := nccltest.HostBuffer(4)
			defer free()
			err := c.AllReduce(unsafe.Pointer(&buf[0]), 1, Float32, Sum, nil)
			if !errors.Is(err, failure.ErrClosed) || Status(err) != status.Closed {
				t.Errorf("all-reduce after close: got %v, want failure.ErrClosed", err)
			}
			if err := c.AsyncError(); !errors.Is(err, failure.ErrClosed) {
				t.Errorf("AsyncError after close: got %v, want failure.ErrClosed", err)
			}
			evs := records(t, rec)
			wantFinalize := 0
			if m.code == nonBlockingCode {
				wantFinalize = 1
			}
			if got := len(find(evs, "finalize")); got != wantFinalize {
				t.Errorf("%d ncclCommFinalize calls, want %d", got, wantFinalize)
			}
			if len(find(evs, "destroy")) != 1 || len(find(evs, "abort")) != 0 {
				t.Errorf("want one destroy and no abort: %v", evs)
			}
		})
	}
}

// TestInitTimeout: a rank whose peers never come gives up at the timeout.
// A non-blocking init is aborted then; a blocking one (before 2.14) cannot
// be, so it finishes in the background once the peer arrives, and the late
// communicator is aborted.
func TestInitTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			lib, rec := setup(t, m.code)
			id, err := lib.UniqueID()
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			c, err := Open(lib, id, 2, 0, timeout)
			d := time.Since(start)
			t.Logf("after %v: %v", d, err)
			if c != nil || !errors.Is(err, failure.ErrTimeout) || Status(err) != status.Timeout {
				t.Fatalf("got %v, %v; want failure.ErrTimeout", c, err)
			}
			if d < timeout || d > timeout+margin {
				t.Errorf("returned after %v, want %v (+%v)", d, timeout, margin)
			}
			if m.code == nonBlockingCode {
				if len(find(records(t, rec), "abort", "rank=0")) != 1 {
					t.Error("the half-made communicator was not aborted")
				}
				return
			}
			if len(find(records(t, rec), "abort")) != 0 {
				t.Error("abort before the blocking init returned")
			}
			peer, err := Open(lib, id, 2, 1, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer peer.Close()
			waitFor(t, rec, "abort", "rank=0")
		})
	}
}

// TestErrors: failures carry NCCL's own text (ncclGetErrorString, plus
// ncclGetLastError from 2.13) and abort the Comm.
func TestErrors(t *testing.T) {
	const (
		sysErr  = "unhandled system error (run with NCCL_DEBUG=INFO for details)"
		initErr = "fake NCCL: injected init failure (FAKE_NCCL_FAIL=init) on rank 0"
		arErr   = "fake NCCL: injected allreduce failure (FAKE_NCCL_FAIL=allreduce) on rank 0"
	)
	tests := []struct {
		name string
		code int
		fail string
		want string // the *Error's text
	}{
		{"init 2.9", blockingCode, "init", "ncclCommInitRank: " + sysErr},
		{"init 2.13", 21303, "init", "ncclCommInitRank: " + sysErr + ": " + initErr},
		{"init 2.20", nonBlockingCode, "init", "ncclCommInitRankConfig: " + sysErr + ": " + initErr},
		{"allreduce 2.9", blockingCode, "allreduce", "ncclAllReduce: " + sysErr},
		{"allreduce 2.13", 21303, "allreduce", "ncclAllReduce: " + sysErr + ": " + arErr},
		{"allreduce 2.20", nonBlockingCode, "allreduce", "ncclAllReduce: " + sysErr + ": " + arErr},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lib, rec := setup(t, tc.code, "FAKE_NCCL_FAIL="+tc.fail)
			id, err := lib.UniqueID()
			if err != nil {
				t.Fatal(err)
			}
			c, err := Open(lib, id, 1, 0, 5*time.Second)
			if tc.fail == "allreduce" {
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				buf, free := nccltest.HostBuffer(16)
				defer free()
				err = c.AllReduce(unsafe.Pointer(&buf[0]), 4, Float32, Sum, nil)
				if next := c.AsyncError(); !errors.Is(next, failure.ErrAborted) {
					t.Errorf("AsyncError after the failure: got %v, want failure.ErrAborted", next)
				}
			} else if c != nil {
				t.Fatal("Open succeeded")
			}
			t.Logf("%v", err)
			var ne *Error
			if !errors.As(err, &ne) {
				t.Fatalf("got %v, want an *Error", err)
			}
			if ne.Error() != tc.want || ne.Result != SystemError {
				t.Errorf("got %q (%v), want %q (ncclSystemError)", ne.Error(), ne.Result, tc.want)
			}
			if Status(err) != status.Peer {
				t.Errorf("status %d, want %d", Status(err), status.Peer)
			}
			if tc.code == nonBlockingCode || tc.fail == "allreduce" {
				waitFor(t, rec, "abort", "rank=0")
			}
		})
	}
}

func TestOpenInvalid(t *testing.T) {
	lib, _ := setup(t, nonBlockingCode)
	var id [UniqueIDBytes]byte
	for _, a := range [][3]int{{0, 0, 1}, {2, 2, 1}, {2, -1, 1}, {2, 0, 0}} {
		if _, err := Open(lib, id, a[0], a[1], time.Duration(a[2])*time.Second); !errors.Is(err, failure.ErrInvalid) {
			t.Errorf("Open(nranks %d, rank %d, timeout %ds): got %v, want failure.ErrInvalid", a[0], a[1], a[2], err)
		}
	}
}

// waitFor waits up to 10 s for an event in the record file.
func waitFor(t *testing.T, rec, name string, match ...string) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); len(find(records(t, rec), name, match...)) == 0; {
		if time.Now().After(end) {
			t.Fatalf("no %s %v event", name, match)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fill returns one host buffer per rank holding val(rank, i) as dtype.
func fill(t *testing.T, n, count, dtype int, val func(r, i int) float64) [][]byte {
	t.Helper()
	bufs := make([][]byte, n)
	for r := range n {
		buf, free := nccltest.HostBuffer(count * elemSize(dtype))
		t.Cleanup(free)
		for i := range count {
			setF(buf, dtype, i, val(r, i))
		}
		bufs[r] = buf
	}
	return bufs
}

func elemSize(dtype int) int {
	switch dtype {
	case Float16, BFloat16:
		return 2
	case Int32, Float32:
		return 4
	}
	return 8
}

var le = binary.LittleEndian

func setF(b []byte, dtype, i int, v float64) {
	switch dtype {
	case Int32:
		le.PutUint32(b[4*i:], uint32(int32(v)))
	case Int64:
		le.PutUint64(b[8*i:], uint64(int64(v)))
	case Float32:
		le.PutUint32(b[4*i:], math.Float32bits(float32(v)))
	case Float64:
		le.PutUint64(b[8*i:], math.Float64bits(v))
	case BFloat16:
		le.PutUint16(b[2*i:], uint16(math.Float32bits(float32(v))>>16)) // exact for the test's values
	case Float16:
		le.PutUint16(b[2*i:], toHalf(float32(v)))
	}
}

func getF(b []byte, dtype, i int) float64 {
	switch dtype {
	case Int32:
		return float64(int32(le.Uint32(b[4*i:])))
	case Int64:
		return float64(int64(le.Uint64(b[8*i:])))
	case Float32:
		return float64(math.Float32frombits(le.Uint32(b[4*i:])))
	case Float64:
		return math.Float64frombits(le.Uint64(b[8*i:]))
	case BFloat16:
		return float64(math.Float32frombits(uint32(le.Uint16(b[2*i:])) << 16))
	case Float16:
		return float64(fromHalf(le.Uint16(b[2*i:])))
	}
	panic("dtype")
}

// toHalf converts a normal float32 that float16 holds exactly.
func toHalf(f float32) uint16 {
	if f == 0 {
		return 0
	}
	x := math.Float32bits(f)
	sign := uint16(x>>16) & 0x8000
	exp := int(x>>23&0xff) - 127 + 15
	return sign | uint16(exp)<<10 | uint16(x>>13&0x3ff)
}

func fromHalf(h uint16) float32 {
	if h&0x7fff == 0 {
		return 0
	}
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10&0x1f) - 15 + 127
	return math.Float32frombits(sign | exp<<23 | uint32(h&0x3ff)<<13)
}

func TestHalfHelpers(t *testing.T) {
	for _, v := range []float32{1, 1.5, 2, 7.5, 24, 1000} {
		if got := fromHalf(toHalf(v)); got != v {
			t.Errorf("%v round-trips to %v", v, got)
		}
	}
	if !strings.Contains(fmt.Sprint(InProgress), "ncclInProgress") {
		t.Error(InProgress)
	}
}
