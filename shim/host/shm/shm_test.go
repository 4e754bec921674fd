package shm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/internal/leaktest"
	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// TestMain doubles as a rank in another process: with SHM_TEST_HELPER set,
// the test binary runs the helper named by it and never runs tests.
func TestMain(m *testing.M) {
	if mode := os.Getenv("SHM_TEST_HELPER"); mode != "" {
		os.Exit(helper(mode))
	}
	before := runtime.NumGoroutine()
	code := m.Run()
	if code == 0 {
		// Every rank goroutine has returned and every helper was waited for.
		if err := leaktest.CheckCount(before, 2*time.Second); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// helper runs one rank of a segment made by the parent test: SHM_PATH,
// SHM_RANK, SHM_WORLD, SHM_SLOT and SHM_BYTES say which and how much.
func helper(mode string) int {
	env := func(k string) int {
		v, err := strconv.Atoi(os.Getenv(k))
		if err != nil {
			fmt.Fprintf(os.Stderr, "helper: %s: %v\n", k, err)
			os.Exit(2)
		}
		return v
	}
	c, err := Open(os.Getenv("SHM_PATH"), env("SHM_RANK"), env("SHM_WORLD"), Config{SlotBytes: env("SHM_SLOT"), Timeout: time.Minute})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	defer c.Close()
	if v := os.Getenv("SHM_PUSH_MIN"); v != "" {
		c.pushMin = env("SHM_PUSH_MIN")
	}
	if os.Getenv("SHM_NEGOTIATE") != "" {
		if _, err := c.Negotiate(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 2
		}
	}
	bufs := make([][]byte, max(1, env("SHM_BUFS")))
	for i := range bufs {
		bufs[i] = inputs(reduce.Float32, c.rank, env("SHM_BYTES")/4, i) // touched: no page faults in the collective
	}
	buf := bufs[0]
	switch mode {
	case "die": // exit in the middle of the first all-reduce
		in := c.ctl[c.rank].in
		// The parent starts its clock once this exists: a race-built helper
		// on a loaded machine can take longer than the timeout to get here.
		if err := os.WriteFile(os.Getenv("SHM_READY"), nil, 0o600); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 2
		}
		go func() {
			for atomic.LoadUint32(in) < 4 {
				time.Sleep(50 * time.Microsecond)
			}
			os.Exit(7)
		}()
		err = c.AllReduce(context.Background(), buf, reduce.Float32, reduce.Sum)
	case "bench": // SHM_ITERS all-reduces after one to warm up, cycling through SHM_BUFS buffers
		for i := env("SHM_ITERS"); i >= 0 && err == nil; i-- {
			err = c.AllReduce(context.Background(), bufs[i%len(bufs)], reduce.Float32, reduce.Sum)
		}
	case "bench-broadcast": // SHM_ITERS broadcasts from rank SHM_ROOT (default 0) after one to warm up, cycling through SHM_BUFS buffers
		root := 0
		if os.Getenv("SHM_ROOT") != "" {
			root = env("SHM_ROOT")
		}
		for i := env("SHM_ITERS"); i >= 0 && err == nil; i-- {
			err = c.Broadcast(context.Background(), [][]byte{bufs[i%len(bufs)]}, reduce.Float32, root)
		}
	case "vanish": // SHM_ITERS all-reduces after one, then exit without closing, as a SIGKILL between collectives
		for i := env("SHM_ITERS"); i >= 0 && err == nil; i-- {
			err = c.AllReduce(context.Background(), buf, reduce.Float32, reduce.Sum)
		}
		if err == nil {
			os.Exit(0)
		}
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	return 0
}

// startHelper runs the test binary as rank of the segment at path.
func startHelper(t testing.TB, mode, path string, rank, world, slot, nbytes int, extra ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "SHM_TEST_HELPER="+mode, "SHM_PATH="+path,
		"SHM_RANK="+strconv.Itoa(rank), "SHM_WORLD="+strconv.Itoa(world),
		"SHM_SLOT="+strconv.Itoa(slot), "SHM_BYTES="+strconv.Itoa(nbytes), "SHM_BUFS=1")
	cmd.Env = append(cmd.Env, extra...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// segPath returns a fresh segment path in a directory that is removed after
// the test: under /dev/shm where there is one, as in production.
func segPath(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "shmtest-")
	if err != nil {
		dir = t.TempDir()
	} else {
		t.Cleanup(func() {
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				t.Errorf("left behind: %s", e.Name())
			}
			os.RemoveAll(dir)
		})
	}
	return filepath.Join(dir, "seg")
}

// newGroup makes a segment for world ranks, opens every rank in this
// process and unlinks the file, as the host transport does.
func newGroup(t testing.TB, world int, cfg Config) []*Comm {
	t.Helper()
	path := segPath(t)
	c0, err := Create(path, world, cfg)
	if err != nil {
		t.Fatal(err)
	}
	comms := []*Comm{c0}
	t.Cleanup(func() {
		for _, c := range comms {
			if err := c.Close(); err != nil {
				t.Error(err)
			}
		}
	})
	for r := 1; r < world; r++ {
		c, err := Open(path, r, world, cfg)
		if err != nil {
			t.Fatal(err)
		}
		comms = append(comms, c)
	}
	if err := Unlink(path); err != nil {
		t.Fatal(err)
	}
	return comms
}

// allRanks runs fn for every rank in its own goroutine and returns the
// errors by rank.
func allRanks(comms []*Comm, fn func(r int, c *Comm) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = fn(r, c)
		}()
	}
	wg.Wait()
	return errs
}

// value is rank's input element i: a small integer, so sums of up to 8
// ranks are exact in every dtype (bfloat16 holds integers up to 256).
func value(rank, i, salt int) float64 {
	return float64((i*7+rank*13+salt)%31) - 15
}

func inputs(dt reduce.DType, rank, count, salt int) []byte {
	v := make([]float64, count)
	for i := range v {
		v[i] = value(rank, i, salt)
	}
	return reduce.Encode(dt, v)
}

// tolerance is the relative error allowed for Avg of floats, which rounds
// sum/world (twice for the half types: to float32, then to the type).
func tolerance(dt reduce.DType) float64 {
	switch dt {
	case reduce.Float16:
		return 1.0 / 1024
	case reduce.BFloat16:
		return 1.0 / 128
	case reduce.Float32:
		return 1e-6
	}
	return 1e-15
}

// checkResult compares every rank's buffer with the float64 reference:
// sums exactly, Avg of integers exactly (truncated), Avg of floats within
// tolerance; and checks the ranks agree bit for bit.
func checkResult(t *testing.T, dt reduce.DType, op reduce.Op, bufs [][]byte, salt int) {
	t.Helper()
	world := len(bufs)
	for r := 1; r < world; r++ {
		if !bytes.Equal(bufs[r], bufs[0]) {
			t.Fatalf("rank %d's result differs from rank 0's", r)
		}
	}
	got := reduce.Decode(dt, bufs[0])
	for i, g := range got {
		var sum float64
		for r := range world {
			sum += value(r, i, salt)
		}
		want, tol := sum, 0.0
		if op == reduce.Avg {
			want = sum / float64(world)
			if dt.Float() {
				tol = tolerance(dt) * math.Abs(want)
			} else {
				want = math.Trunc(want)
			}
		}
		if math.Abs(g-want) > tol {
			t.Fatalf("element %d of %d: got %v, want %v (tolerance %v)", i, len(got), g, want, tol)
		}
	}
}

func TestAllReduce(t *testing.T) {
	for world := 1; world <= 8; world++ {
		t.Run(fmt.Sprintf("world%d", world), func(t *testing.T) {
			t.Parallel()
			// A 64 KiB slot: the large count takes many steps and wraps
			// the ring of every slot many times.
			comms := newGroup(t, world, Config{SlotBytes: 64 << 10, Timeout: time.Minute})
			counts := []struct {
				name  string
				count int
			}{
				{"empty", 0},
				{"one", 1},
				{"world-1", world - 1},
				{"odd", 1037},
				{"large", -1}, // 3 MiB and a bit, whatever the dtype
			}
			salt := 0
			for _, cc := range counts {
				for _, dt := range reduce.DTypes {
					for _, op := range []reduce.Op{reduce.Sum, reduce.Avg} {
						salt++
						// The large case on every world would be slow under
						// -race; a few worlds cover it.
						if cc.name == "large" && world != 2 && world != 3 && world != 8 {
							continue
						}
						count := cc.count
						if count < 0 {
							count = 3<<20/dt.Size() + 5
						}
						t.Run(fmt.Sprintf("%s/%v/%v", cc.name, dt, op), func(t *testing.T) {
							checkResult(t, dt, op, runAll(t, comms, dt, op, count, salt), salt)
						})
					}
				}
			}
		})
	}
}

// TestConsecutive runs many collectives of varying size, dtype and op on the
// same communicators, with slots from the smallest possible (one 64-byte
// segment per chunk and ring entry) to the default.
func TestConsecutive(t *testing.T) {
	tests := []struct {
		name  string
		world int
		slot  int
	}{
		{"2 ranks, tiny slot", 2, depth * 2 * 64},
		{"3 ranks, small slot", 3, 16 << 10},
		{"4 ranks, default slot", 4, 0},
		{"5 ranks, small slot", 5, 20 << 10},
	}
	sizes := []int{0, 1, 7, 1037, 33, 200 << 10, 0, 3, 1 << 20, 64, 65, 1, 5000, 0, 2}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			comms := newGroup(t, tc.world, Config{SlotBytes: tc.slot, Timeout: time.Minute})
			for i, count := range sizes {
				dt := reduce.DTypes[i%len(reduce.DTypes)]
				op := []reduce.Op{reduce.Sum, reduce.Avg}[i/len(reduce.DTypes)%2]
				bufs := make([][]byte, tc.world)
				errs := allRanks(comms, func(r int, c *Comm) error {
					// Ranks arrive at different times, so some run ahead.
					time.Sleep(time.Duration((r*7+i*3)%5) * time.Millisecond / 2)
					bufs[r] = inputs(dt, r, count, i)
					return c.AllReduce(context.Background(), bufs[r], dt, op)
				})
				for r, err := range errs {
					if err != nil {
						t.Fatalf("collective %d (%d %v %v) rank %d: %v", i, count, dt, op, r, err)
					}
				}
				checkResult(t, dt, op, bufs, i)
			}
		})
	}
}

// TestBackToBackSmall runs collectives of 0, 1 and 2 elements back to back,
// without the ranks meeting in between: a rank that gets nothing back from
// a collective must still not publish its next header before every peer
// has checked the last one (it did, and the peers saw a mismatch).
func TestBackToBackSmall(t *testing.T) {
	for _, world := range []int{2, 3} {
		t.Run(strconv.Itoa(world)+" ranks", func(t *testing.T) {
			comms := newGroup(t, world, Config{Timeout: time.Minute})
			errs := allRanks(comms, func(r int, c *Comm) error {
				for i := range 3000 {
					n := i % 3
					buf := make([]float32, n)
					for k := range buf {
						buf[k] = float32(r + 1)
					}
					b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(buf))), 4*n)
					if err := c.AllReduce(context.Background(), b, reduce.Float32, reduce.Sum); err != nil {
						return fmt.Errorf("collective %d: %w", i, err)
					}
					for k, v := range buf {
						if want := float32(world * (world + 1) / 2); v != want {
							return fmt.Errorf("collective %d element %d: got %v, want %v", i, k, v, want)
						}
					}
				}
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

func TestMismatch(t *testing.T) {
	type arg struct {
		count int
		dt    reduce.DType
		op    reduce.Op
	}
	ok := arg{1000, reduce.Float32, reduce.Sum}
	tests := []struct {
		name string
		args []arg // by rank
	}{
		{"count", []arg{ok, {1001, reduce.Float32, reduce.Sum}}},
		{"count zero", []arg{{0, reduce.Float32, reduce.Sum}, ok}},
		{"count large", []arg{ok, ok, {1 << 20, reduce.Float32, reduce.Sum}}},
		{"dtype same bytes", []arg{ok, {1000, reduce.Int32, reduce.Sum}}},
		{"dtype", []arg{ok, ok, {1000, reduce.Float64, reduce.Sum}}},
		{"op", []arg{ok, {1000, reduce.Float32, reduce.Avg}}},
		{"empty dtype", []arg{{0, reduce.Float32, reduce.Sum}, {0, reduce.Float16, reduce.Sum}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			comms := newGroup(t, len(tc.args), Config{SlotBytes: 16 << 10, Timeout: time.Minute})
			// A collective that agrees first, so the mismatch is not at step 0.
			allRanks(comms, func(r int, c *Comm) error {
				return c.AllReduce(context.Background(), make([]byte, 4096), reduce.Float32, reduce.Sum)
			})
			start := time.Now()
			errs := allRanks(comms, func(r int, c *Comm) error {
				a := tc.args[r]
				return c.AllReduce(context.Background(), make([]byte, a.count*a.dt.Size()), a.dt, a.op)
			})
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %v", d)
			}
			first := 0
			for r, err := range errs {
				if !errors.Is(err, failure.ErrMismatch) {
					t.Errorf("rank %d: got %v, want failure.ErrMismatch", r, err)
				}
				if RaisedFirst(err) {
					first++
				}
			}
			// One rank raised the abort flag; the others failed on it.
			if first != 1 {
				t.Errorf("%d ranks' errors say they were the segment's first, want 1: %v", first, errs)
			}
			// The communicator is broken now.
			errs = allRanks(comms, func(r int, c *Comm) error {
				return c.AllReduce(context.Background(), make([]byte, 4), reduce.Float32, reduce.Sum)
			})
			for r, err := range errs {
				if !errors.Is(err, failure.ErrMismatch) {
					t.Errorf("rank %d, next call: got %v, want the failure.ErrMismatch again", r, err)
				}
			}
		})
	}
}

// TestPeerKilled runs rank 1 in another process that exits in the middle of
// a large all-reduce: rank 0 times out after Config.Timeout.
func TestPeerKilled(t *testing.T) {
	const (
		timeout = 2 * time.Second
		slot    = 64 << 10
		nbytes  = 64 << 20
	)
	path := segPath(t)
	c, err := Create(path, 2, Config{SlotBytes: slot, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer os.Remove(path)
	ready := filepath.Join(t.TempDir(), "ready")
	cmd := startHelper(t, "die", path, 1, 2, slot, nbytes, "SHM_READY="+ready)
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			break
		}
	}
	start := time.Now()
	err = c.AllReduce(context.Background(), make([]byte, nbytes), reduce.Float32, reduce.Sum)
	elapsed := time.Since(start)
	werr := cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(werr, &exit) || exit.ExitCode() != 7 {
		t.Fatalf("helper: got %v, want exit status 7 (died mid-way)", werr)
	}
	if !errors.Is(err, failure.ErrTimeout) {
		t.Fatalf("got %v, want failure.ErrTimeout", err)
	}
	t.Logf("after %v: %v", elapsed, err)
	if elapsed < timeout-10*time.Millisecond || elapsed > timeout+time.Second {
		t.Errorf("returned after %v, want about %v", elapsed, timeout)
	}
	// Broken now: fails at once.
	if err := c.AllReduce(context.Background(), make([]byte, 4), reduce.Float32, reduce.Sum); !errors.Is(err, failure.ErrTimeout) {
		t.Errorf("next call: got %v, want the failure.ErrTimeout again", err)
	}
}

// TestStop blocks the first world-1 ranks in an all-reduce that the last
// rank has not joined, then stops it one way or another: they return
// promptly with the right error, and so does the last rank when it joins.
func TestStop(t *testing.T) {
	errBoom := errors.New("boom")
	tests := []struct {
		name       string
		world      int
		timeout    time.Duration // Config.Timeout
		ctxTimeout time.Duration // rank 0's ctx
		act        func(comms []*Comm, cancel context.CancelFunc)
		want0      []error // rank 0's error wraps all of these
		wantOthers error   // the other blocked ranks'
		wantLast   error   // the last rank's when it joins afterwards
	}{
		{"abort", 2, time.Minute, 0, func(cs []*Comm, _ context.CancelFunc) { cs[0].Abort(errBoom) }, []error{failure.ErrAborted, errBoom}, nil, failure.ErrPeer},
		{"abort twice", 2, time.Minute, 0, func(cs []*Comm, _ context.CancelFunc) { cs[0].Abort(errBoom); cs[0].Abort(nil) }, []error{failure.ErrAborted, errBoom}, nil, failure.ErrPeer},
		{"peer aborts", 3, time.Minute, 0, func(cs []*Comm, _ context.CancelFunc) { cs[2].Abort(nil) }, []error{failure.ErrPeer}, failure.ErrPeer, failure.ErrAborted},
		{"cancel", 2, time.Minute, 0, func(_ []*Comm, cancel context.CancelFunc) { cancel() }, []error{context.Canceled}, nil, failure.ErrPeer},
		{"ctx deadline", 2, time.Minute, 100 * time.Millisecond, nil, []error{failure.ErrTimeout, context.DeadlineExceeded}, nil, failure.ErrPeer},
		{"timeout", 2, 100 * time.Millisecond, 0, nil, []error{failure.ErrTimeout}, nil, failure.ErrPeer},
		{"close", 2, time.Minute, 0, func(cs []*Comm, _ context.CancelFunc) { cs[0].Close() }, []error{failure.ErrClosed}, nil, failure.ErrPeer},
		{"peer closes", 3, time.Minute, 0, func(cs []*Comm, _ context.CancelFunc) { cs[2].Close() }, []error{failure.ErrPeer}, failure.ErrPeer, failure.ErrClosed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			comms := newGroup(t, tc.world, Config{SlotBytes: 64 << 10, Timeout: tc.timeout})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.ctxTimeout > 0 {
				ctx, cancel = context.WithTimeout(ctx, tc.ctxTimeout)
				defer cancel()
			}
			var acted atomic.Int64
			start := time.Now()
			if tc.act != nil {
				go func() {
					time.Sleep(100 * time.Millisecond)
					acted.Store(int64(time.Since(start)))
					tc.act(comms, cancel)
				}()
			}
			blocked := comms[:tc.world-1]
			errs := allRanks(blocked, func(r int, c *Comm) error {
				rctx := context.Background()
				if r == 0 {
					rctx = ctx
				}
				err := c.AllReduce(rctx, make([]byte, 1<<20), reduce.Float32, reduce.Sum)
				if err == nil {
					return errors.New("succeeded")
				}
				// Latency from the stop to the return.
				stop := tc.timeout
				switch {
				case tc.act != nil:
					stop = time.Duration(acted.Load())
				case tc.ctxTimeout > 0:
					stop = tc.ctxTimeout
				}
				lat := time.Since(start) - stop
				t.Logf("rank %d returned %v after the stop", r, lat)
				if lat > 500*time.Millisecond || lat < 0 {
					return fmt.Errorf("returned %v after the stop: %w", lat, err)
				}
				return err
			})
			for _, want := range tc.want0 {
				if !errors.Is(errs[0], want) {
					t.Errorf("rank 0: got %v, want %v", errs[0], want)
				}
			}
			for r := 1; r < len(errs); r++ {
				if !errors.Is(errs[r], tc.wantOthers) {
					t.Errorf("rank %d: got %v, want %v", r, errs[r], tc.wantOthers)
				}
			}
			t.Logf("rank 0: %v", errs[0])
			// The last rank joins late and fails at once too.
			last := comms[tc.world-1]
			start = time.Now()
			err := last.AllReduce(context.Background(), make([]byte, 1<<20), reduce.Float32, reduce.Sum)
			if !errors.Is(err, tc.wantLast) {
				t.Errorf("last rank: got %v, want %v", err, tc.wantLast)
			}
			if d := time.Since(start); d > 500*time.Millisecond {
				t.Errorf("last rank returned after %v", d)
			}
			// Rank 0 is broken: later calls fail at once, with its error.
			if err := comms[0].AllReduce(context.Background(), nil, reduce.Float32, reduce.Sum); !errors.Is(err, tc.want0[0]) {
				t.Errorf("rank 0, next call: got %v, want %v", err, tc.want0[0])
			}
		})
	}
}

func TestConcurrentCalls(t *testing.T) {
	comms := newGroup(t, 2, Config{Timeout: time.Minute})
	done := make(chan error)
	go func() { done <- comms[0].AllReduce(context.Background(), make([]byte, 64), reduce.Float32, reduce.Sum) }()
	for !comms[0].busy.Load() {
		time.Sleep(time.Millisecond)
	}
	if err := comms[0].AllReduce(context.Background(), make([]byte, 64), reduce.Float32, reduce.Sum); err == nil {
		t.Error("overlapping call succeeded")
	}
	// The overlapping call did not disturb the first one.
	if err := comms[1].AllReduce(context.Background(), make([]byte, 64), reduce.Float32, reduce.Sum); err != nil {
		t.Error(err)
	}
	if err := <-done; err != nil {
		t.Error(err)
	}
}

func TestBadInput(t *testing.T) {
	tests := []struct {
		name string
		n    int
		dt   reduce.DType
		op   reduce.Op
	}{
		{"ragged length", 6, reduce.Float32, reduce.Sum},
		{"ragged half", 3, reduce.BFloat16, reduce.Avg},
		{"unknown dtype", 8, reduce.DType(3), reduce.Sum},
		{"zero dtype", 0, reduce.DType(0), reduce.Sum},
		{"unknown op", 8, reduce.Float32, reduce.Op(1)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			comms := newGroup(t, 2, Config{Timeout: time.Minute})
			if err := comms[0].AllReduce(context.Background(), make([]byte, tc.n), tc.dt, tc.op); err == nil {
				t.Fatal("got nil error")
			} else {
				t.Log(err)
			}
			// The peer is told rather than left to time out.
			start := time.Now()
			if err := comms[1].AllReduce(context.Background(), make([]byte, 8), reduce.Float32, reduce.Sum); !errors.Is(err, failure.ErrPeer) {
				t.Errorf("peer: got %v, want failure.ErrPeer", err)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("peer returned after %v", d)
			}
		})
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	valid := func(name string, world, slot int) string {
		p := filepath.Join(dir, name)
		c, err := Create(p, world, Config{SlotBytes: slot})
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		return p
	}
	garbage := make([]byte, 64<<10)
	for i := range garbage {
		garbage[i] = byte(i*131 + i>>8)
	}
	truncated := valid("truncated", 2, 64<<10)
	if err := os.Truncate(truncated, 8192); err != nil {
		t.Fatal(err)
	}
	badSeg := valid("badseg", 2, 64<<10)
	f, err := os.OpenFile(badSeg, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{1, 0, 0, 0, 0, 0, 0, 0}, offSeg) // 1-byte segments
	f.Close()
	link := filepath.Join(dir, "link")
	if err := os.Symlink(valid("target", 2, 64<<10), link); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name        string
		path        string
		rank, world int
		slot        int
	}{
		{"missing", filepath.Join(dir, "nope"), 1, 2, 0},
		{"empty", write("empty", nil), 1, 2, 0},
		{"too small", write("small", []byte("DDPSHM1")), 1, 2, 0},
		{"garbage", write("garbage", garbage), 1, 2, 0},
		{"truncated", truncated, 1, 2, 0},
		{"bad segment size", badSeg, 1, 2, 0},
		{"directory", dir, 1, 2, 0},
		{"symlink", link, 1, 2, 0},
		{"wrong world", valid("world", 3, 64<<10), 1, 2, 0},
		{"rank too big", valid("rank", 2, 64<<10), 2, 2, 0},
		{"negative rank", valid("negrank", 2, 64<<10), -1, 2, 0},
		{"slot disagrees", valid("slot", 2, 64<<10), 1, 2, 128 << 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Open(tc.path, tc.rank, tc.world, Config{SlotBytes: tc.slot})
			if err == nil {
				c.Close()
				t.Fatal("got nil error")
			}
			t.Log(err)
		})
	}
}

func TestCreateErrors(t *testing.T) {
	dir := t.TempDir()
	exists := filepath.Join(dir, "exists")
	os.WriteFile(exists, nil, 0o600)
	tests := []struct {
		name  string
		path  string
		world int
		cfg   Config
	}{
		{"exists", exists, 2, Config{}},
		{"no dir", filepath.Join(dir, "a", "b"), 2, Config{}},
		{"zero world", filepath.Join(dir, "w0"), 0, Config{}},
		{"huge world", filepath.Join(dir, "wbig"), 1 << 20, Config{}},
		{"slot too small", filepath.Join(dir, "slot"), 8, Config{SlotBytes: depth*8*64 - 1}},
		{"negative timeout", filepath.Join(dir, "timeout"), 2, Config{Timeout: -time.Second}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Create(tc.path, tc.world, tc.cfg)
			if err == nil {
				c.Close()
				t.Fatal("got nil error")
			}
			t.Log(err)
			if tc.path != exists {
				if _, err := os.Stat(tc.path); err == nil {
					t.Error("file left behind")
				}
			}
		})
	}
}

func TestSegmentFile(t *testing.T) {
	path := segPath(t)
	c0, err := Create(path, 2, Config{SlotBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c0.Close()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode: got %v, want 0600", st.Mode().Perm())
	}
	if want := int64(2*(1<<20) + pageSize); st.Size() != want {
		t.Errorf("size: got %d, want %d", st.Size(), want)
	}
	c1, err := Open(path, 1, 2, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	if err := Unlink(path); err != nil {
		t.Fatal(err)
	}
	if err := Unlink(path); err == nil {
		t.Error("second Unlink: got nil error")
	}
	// The mappings outlive the name.
	bufs := [][]byte{inputs(reduce.Float32, 0, 1000, 0), inputs(reduce.Float32, 1, 1000, 0)}
	errs := allRanks([]*Comm{c0, c1}, func(r int, c *Comm) error {
		return c.AllReduce(context.Background(), bufs[r], reduce.Float32, reduce.Sum)
	})
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	checkResult(t, reduce.Float32, reduce.Sum, bufs, 0)
	for i := 0; i < 2; i++ {
		if err := c1.Close(); err != nil {
			t.Errorf("close %d: %v", i, err)
		}
	}
	if err := c1.AllReduce(context.Background(), nil, reduce.Float32, reduce.Sum); !errors.Is(err, failure.ErrClosed) {
		t.Errorf("after close: got %v, want failure.ErrClosed", err)
	}
	c1.Abort(nil) // after Close: no effect, no crash
}
