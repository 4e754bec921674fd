package shm

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

var benchSizes = []int{64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20}

func sizeName(n int) string {
	if n < 1<<10 {
		return fmt.Sprintf("%dB", n)
	}
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

// BenchmarkAllReduce all-reduces float32 buffers between 2 ranks with the
// default Config: as goroutines of this process; as 2 processes (the test
// binary re-run as rank 1), which is the real case (procs/0B: empty
// collectives, the cost of the synchronisation alone); and as 2 processes that
// cycle through 256 MiB of buffers, so each collective starts from memory
// rather than cache (as a DDP bucket that backward wrote long before would).
// busbw is 2(n-1)/n * bytes / time: for n = 2 it is bytes / time, the MB/s
// column.
func BenchmarkAllReduce(b *testing.B) {
	for _, size := range benchSizes {
		b.Run("goroutines/"+sizeName(size), func(b *testing.B) { benchGoroutines(b, size) })
	}
	for _, size := range append([]int{0}, benchSizes...) {
		b.Run("procs/"+sizeName(size), func(b *testing.B) { benchProcs(b, size, 1, -1) })
	}
	for _, size := range benchSizes[2:] {
		b.Run("procs-cold/"+sizeName(size), func(b *testing.B) { benchProcs(b, size, max(1, 256<<20/size), -1) })
	}
	// The same with the single-copy path for every size (direct.go).
	for _, size := range benchSizes {
		b.Run("procs-direct/"+sizeName(size), func(b *testing.B) { benchProcs(b, size, 1, 1) })
	}
	for _, size := range benchSizes[2:] {
		b.Run("procs-direct-cold/"+sizeName(size), func(b *testing.B) { benchProcs(b, size, max(1, 256<<20/size), 1) })
	}
}

func reportBusBW(b *testing.B, world, size int) {
	b.SetBytes(int64(size))
	sec := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(2*float64(world-1)/float64(world)*float64(size)/sec/1e9, "busbw-GB/s")
}

func benchGoroutines(b *testing.B, size int) {
	const world = 2
	comms := newGroup(b, world, Config{Timeout: time.Minute})
	bufs := make([][]byte, world)
	for r := range bufs {
		bufs[r] = inputs(reduce.Float32, r, size/4, 0)
	}
	errs := allRanks(comms, func(r int, c *Comm) error { // warm up
		return c.AllReduce(context.Background(), bufs[r], reduce.Float32, reduce.Sum)
	})
	b.ResetTimer()
	errs = append(errs, allRanks(comms, func(r int, c *Comm) error {
		for i := 0; i < b.N; i++ {
			if err := c.AllReduce(context.Background(), bufs[r], reduce.Float32, reduce.Sum); err != nil {
				return err
			}
		}
		return nil
	})...)
	b.StopTimer()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	reportBusBW(b, world, size)
}

// benchProcs runs rank 1 in a helper process; both ranks cycle through
// nbufs buffers of size bytes.
func benchProcs(b *testing.B, size, nbufs int, directMin int64) {
	const world = 2
	path := segPath(b)
	c, err := Create(path, world, Config{Timeout: time.Minute, DirectMin: directMin})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	cmd := startHelper(b, "bench", path, 1, world, c.slotBytes(), size,
		"SHM_ITERS="+strconv.Itoa(b.N), "SHM_BUFS="+strconv.Itoa(nbufs), "SHM_NEGOTIATE=1")
	defer cmd.Wait()
	if on, err := c.Negotiate(context.Background()); err != nil || on != (directMin > 0) {
		b.Fatalf("negotiate: %v, %v (%v)", on, err, c.WhyStaged())
	}
	bufs := make([][]byte, nbufs)
	for i := range bufs {
		bufs[i] = inputs(reduce.Float32, 0, size/4, i)
	}
	// The warm-up collective also waits for the helper to start.
	if err := c.AllReduce(context.Background(), bufs[0], reduce.Float32, reduce.Sum); err != nil {
		b.Fatal(err)
	}
	if err := Unlink(path); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := b.N - 1; i >= 0; i-- { // the helper's order
		if err := c.AllReduce(context.Background(), bufs[i%nbufs], reduce.Float32, reduce.Sum); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportBusBW(b, world, size)
}

// BenchmarkBroadcast broadcasts float32 buffers from rank 0 to rank 1 in
// another process with the single-copy path, warm and cold as
// BenchmarkAllReduce does: as it runs (the root writing its part into the
// peer while the peer reads the rest, pushCut), and with the peer reading
// everything (pull), as before the root wrote. The state a warm spare
// takes from a healthy peer goes this way. busbw is bytes / time, as
// nccl-tests count a broadcast's.
func BenchmarkBroadcast(b *testing.B) {
	for _, push := range []struct {
		name string
		min  int
	}{{"procs-direct", defaultPushMin}, {"procs-direct-pull", math.MaxInt}} {
		for _, size := range benchSizes {
			b.Run(push.name+"/"+sizeName(size), func(b *testing.B) { benchBroadcast(b, size, 1, push.min) })
		}
		for _, size := range benchSizes[2:] {
			b.Run(push.name+"-cold/"+sizeName(size), func(b *testing.B) { benchBroadcast(b, size, max(1, 256<<20/size), push.min) })
		}
	}
}

func benchBroadcast(b *testing.B, size, nbufs, pushMin int) {
	const world = 2
	path := segPath(b)
	c, err := Create(path, world, Config{Timeout: time.Minute, DirectMin: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	c.pushMin = pushMin
	cmd := startHelper(b, "bench-broadcast", path, 1, world, c.slotBytes(), size,
		"SHM_ITERS="+strconv.Itoa(b.N), "SHM_BUFS="+strconv.Itoa(nbufs), "SHM_NEGOTIATE=1", "SHM_PUSH_MIN="+strconv.Itoa(pushMin))
	defer cmd.Wait()
	if on, err := c.Negotiate(context.Background()); err != nil || !on {
		b.Fatalf("negotiate: %v, %v (%v)", on, err, c.WhyStaged())
	}
	bufs := make([][]byte, nbufs)
	for i := range bufs {
		bufs[i] = inputs(reduce.Float32, 0, size/4, i)
	}
	if err := c.Broadcast(context.Background(), [][]byte{bufs[0]}, reduce.Float32, 0); err != nil {
		b.Fatal(err)
	}
	if err := Unlink(path); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := b.N - 1; i >= 0; i-- {
		if err := c.Broadcast(context.Background(), [][]byte{bufs[i%nbufs]}, reduce.Float32, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.SetBytes(int64(size))
	b.ReportMetric(float64(size)/(b.Elapsed().Seconds()/float64(b.N))/1e9, "busbw-GB/s")
}

// BenchmarkCopy is the yardstick: one memcpy of the same sizes.
func BenchmarkCopy(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(sizeName(size), func(b *testing.B) {
			src, dst := make([]byte, size), make([]byte, size)
			copy(dst, src) // fault the pages in
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				copy(dst, src)
			}
		})
	}
}
