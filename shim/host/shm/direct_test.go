package shm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// negotiate runs Negotiate on every rank and returns each one's verdict.
func negotiate(t *testing.T, comms []*Comm) []bool {
	t.Helper()
	got := make([]bool, len(comms))
	errs := allRanks(comms, func(r int, c *Comm) error {
		var err error
		got[r], err = c.Negotiate(context.Background())
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: negotiate: %v", r, err)
		}
	}
	return got
}

// TestDirectAllReduce: with the single-copy path forced for every size
// (DirectMin 1), every dtype, op and count gives the reference result on
// every rank, bit-identical to the staged path's on the same inputs.
func TestDirectAllReduce(t *testing.T) {
	for _, world := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("world%d", world), func(t *testing.T) {
			t.Parallel()
			direct := newGroup(t, world, Config{SlotBytes: 64 << 10, Timeout: time.Minute, DirectMin: 1})
			staged := newGroup(t, world, Config{SlotBytes: 64 << 10, Timeout: time.Minute, DirectMin: -1})
			for r, on := range negotiate(t, direct) {
				if !on || !direct[r].Direct() {
					t.Fatalf("rank %d: single copy is off (%v); this test needs process_vm_readv on its own pid", r, direct[r].WhyStaged())
				}
			}
			for r, on := range negotiate(t, staged) {
				if on || staged[r].WhyStaged() == nil {
					t.Fatalf("rank %d: DirectMin -1, yet single copy is on (or no reason given)", r)
				}
			}
			salt := 100
			for _, count := range []int{0, 1, world - 1, 1037, 3<<20/4 + 5} {
				for _, dt := range reduce.DTypes {
					for _, op := range []reduce.Op{reduce.Sum, reduce.Avg} {
						salt++
						// The large case (several bounce buffers per chunk)
						// on 2 and 3 ranks: under -race it is the slow one.
						if count > 1<<20 && world > 3 {
							continue
						}
						t.Run(fmt.Sprintf("%d/%v/%v", count, dt, op), func(t *testing.T) {
							got := runAll(t, direct, dt, op, count, salt)
							checkResult(t, dt, op, got, salt)
							want := runAll(t, staged, dt, op, count, salt)
							if !bytes.Equal(got[0], want[0]) {
								t.Fatalf("single copy and staged results differ")
							}
						})
					}
				}
			}
		})
	}
}

// runAll all-reduces count elements of every rank's inputs and returns the
// buffers.
func runAll(t *testing.T, comms []*Comm, dt reduce.DType, op reduce.Op, count, salt int) [][]byte {
	t.Helper()
	bufs := make([][]byte, len(comms))
	errs := allRanks(comms, func(r int, c *Comm) error {
		bufs[r] = inputs(dt, r, count, salt)
		return c.AllReduce(context.Background(), bufs[r], dt, op)
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return bufs
}

// TestDirectMixed alternates sizes below and above DirectMin on the same
// communicators, so the two paths hand the counters and slots to each other.
func TestDirectMixed(t *testing.T) {
	comms := newGroup(t, 3, Config{SlotBytes: 16 << 10, Timeout: time.Minute, DirectMin: 64 << 10})
	negotiate(t, comms)
	salt := 0
	for _, n := range []int{1 << 20, 100, 16 << 10, 0, 64 << 10, 5, 3 << 20, 70 << 10, 1, 1 << 20} {
		salt++
		got := runAll(t, comms, reduce.Float32, reduce.Sum, n/4, salt)
		checkResult(t, reduce.Float32, reduce.Sum, got, salt)
	}
}

// TestDirectProcs: the single-copy path between two processes, as in
// production. The helper's "bench" mode all-reduces one buffer in place
// again and again, so after collective k both hold (x0+x1) * 2^k.
func TestDirectProcs(t *testing.T) {
	const world, nbytes, iters = 2, 4 << 20, 6
	path := segPath(t)
	c, err := Create(path, world, Config{SlotBytes: 64 << 10, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cmd := startHelper(t, "bench", path, 1, world, c.slotBytes(), nbytes, "SHM_ITERS="+fmt.Sprint(iters-1), "SHM_NEGOTIATE=1")
	defer cmd.Wait()
	on, err := c.Negotiate(context.Background())
	if err != nil || !on {
		t.Fatalf("negotiate with a helper process: %v, %v (%v)", on, err, c.WhyStaged())
	}
	if err := Unlink(path); err != nil {
		t.Fatal(err)
	}
	buf := inputs(reduce.Float32, 0, nbytes/4, 0)
	for i := range iters {
		if err := c.AllReduce(context.Background(), buf, reduce.Float32, reduce.Sum); err != nil {
			t.Fatal(err)
		}
		for k, g := range reduce.Decode(reduce.Float32, buf) {
			if want := (value(0, k, 0) + value(1, k, 0)) * float64(int(1)<<i); g != want {
				t.Fatalf("collective %d, element %d: got %v, want %v", i, k, g, want)
			}
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v", err)
	}
}

// TestDirectWrongProcess: a peer whose pid names another process (as when
// the ranks sit in different pid namespaces) fails the probe, so every rank
// stays on the staged path, and its collectives are still right.
func TestDirectWrongProcess(t *testing.T) {
	other := exec.Command("sleep", "60")
	if err := other.Start(); err != nil {
		t.Skip("no sleep(1) to stand in for another process:", err)
	}
	defer func() {
		other.Process.Kill()
		other.Wait()
	}()
	comms := newGroup(t, 3, Config{Timeout: time.Minute, DirectMin: 1})
	atomic.StoreUint32(comms[2].ctl[2].pid, uint32(other.Process.Pid))
	for r, on := range negotiate(t, comms) {
		if on {
			t.Fatalf("rank %d: single copy on with a peer whose pid is another process", r)
		}
	}
	for r := range 2 {
		if comms[r].WhyStaged() == nil {
			t.Errorf("rank %d: no reason given for staying staged", r)
		} else {
			t.Logf("rank %d: %v", r, comms[r].WhyStaged())
		}
	}
	got := runAll(t, comms, reduce.Int32, reduce.Sum, 4099, 7)
	checkResult(t, reduce.Int32, reduce.Sum, got, 7)
}

// TestDirectPeerGone: a peer process that exits in the middle of a
// single-copy collective fails this rank well before the timeout, naming
// the peer.
func TestDirectPeerGone(t *testing.T) {
	const world = 2
	path := segPath(t)
	c, err := Create(path, world, Config{Timeout: 20 * time.Second, DirectMin: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cmd := startHelper(t, "bench", path, 1, world, c.slotBytes(), 64<<20, "SHM_ITERS=1000000", "SHM_NEGOTIATE=1")
	if on, err := c.Negotiate(context.Background()); err != nil || !on {
		t.Fatalf("negotiate: %v, %v", on, err)
	}
	if err := Unlink(path); err != nil {
		t.Fatal(err)
	}
	buf := inputs(reduce.Float32, 0, 64<<20/4, 0)
	for range 2 { // the helper is in its loop
		if err := c.AllReduce(context.Background(), buf, reduce.Float32, reduce.Sum); err != nil {
			t.Fatal(err)
		}
	}
	time.AfterFunc(5*time.Millisecond, func() { cmd.Process.Kill() })
	start := time.Now()
	for err == nil && time.Since(start) < 10*time.Second {
		err = c.AllReduce(context.Background(), buf, reduce.Float32, reduce.Sum)
	}
	cmd.Wait()
	if err == nil {
		t.Fatal("no error 10 s after the peer was killed")
	}
	t.Logf("after %v: %v", time.Since(start), err)
	if time.Since(start) > 5*time.Second {
		t.Errorf("took %v to notice a dead peer, want well under the 20 s timeout", time.Since(start))
	}
}

// TestDirectBroadcastPeerGone: in a single-copy broadcast, where the root
// writes part of the bytes into its peers while they read the rest, a root
// that exits in the middle fails its peer, and a peer that exits fails the
// root, well before the timeout, naming the other.
func TestDirectBroadcastPeerGone(t *testing.T) {
	for _, tc := range []struct {
		name string
		root int // the helper is rank 1
	}{{"root", 1}, {"peer", 0}} {
		t.Run(tc.name+" gone", func(t *testing.T) {
			const world, size = 2, 64 << 20
			path := segPath(t)
			c, err := Create(path, world, Config{Timeout: 20 * time.Second, DirectMin: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			cmd := startHelper(t, "bench-broadcast", path, 1, world, c.slotBytes(), size,
				"SHM_ITERS=1000000", "SHM_NEGOTIATE=1", "SHM_ROOT="+strconv.Itoa(tc.root))
			if on, err := c.Negotiate(context.Background()); err != nil || !on {
				t.Fatalf("negotiate: %v, %v", on, err)
			}
			if err := Unlink(path); err != nil {
				t.Fatal(err)
			}
			buf := inputs(reduce.Float32, 0, size/4, 0)
			for range 2 { // the helper is in its loop
				if err := c.Broadcast(context.Background(), [][]byte{buf}, reduce.Float32, tc.root); err != nil {
					t.Fatal(err)
				}
			}
			time.AfterFunc(5*time.Millisecond, func() { cmd.Process.Kill() })
			start := time.Now()
			for err == nil && time.Since(start) < 10*time.Second {
				err = c.Broadcast(context.Background(), [][]byte{buf}, reduce.Float32, tc.root)
			}
			cmd.Wait()
			took := time.Since(start)
			var pe *failure.PeerError
			if !errors.As(err, &pe) || pe.Rank != 1 {
				t.Fatalf("after %v: %v, want rank 1's failure", took, err)
			}
			t.Logf("after %v: %v", took, err)
			if took > 5*time.Second {
				t.Errorf("took %v to notice a dead peer, want well under the 20 s timeout", took)
			}
		})
	}
}

// TestDirectPeerGoneBetweenCollectives: a peer that dies after one
// collective and before it publishes its buffer for the next leaves nothing
// to read: the wait for it sees the process gone, well before the timeout.
func TestDirectPeerGoneBetweenCollectives(t *testing.T) {
	const world, timeout = 2, 20 * time.Second
	path := segPath(t)
	c, err := Create(path, world, Config{Timeout: timeout, DirectMin: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cmd := startHelper(t, "vanish", path, 1, world, c.slotBytes(), 1<<20, "SHM_ITERS=1", "SHM_NEGOTIATE=1")
	if on, err := c.Negotiate(context.Background()); err != nil || !on {
		t.Fatalf("negotiate: %v, %v", on, err)
	}
	if err := Unlink(path); err != nil {
		t.Fatal(err)
	}
	buf := inputs(reduce.Float32, 0, 1<<20/4, 0)
	for range 2 {
		if err := c.AllReduce(context.Background(), buf, reduce.Float32, reduce.Sum); err != nil {
			t.Fatal(err)
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v", err)
	}
	start := time.Now()
	err = c.AllReduce(context.Background(), buf, reduce.Float32, reduce.Sum)
	took := time.Since(start)
	var pe *failure.PeerError
	if !errors.As(err, &pe) || pe.Rank != 1 || pe.Kind != failure.PeerLost {
		t.Fatalf("after %v: %v, want rank 1 lost", took, err)
	}
	t.Logf("after %v: %v", took, err)
	if took > timeout/4 {
		t.Errorf("took %v to notice a peer gone, want well under the %v timeout", took, timeout)
	}
}
