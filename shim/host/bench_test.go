package host

import (
	"errors"
	"flag"
	"fmt"
	"testing"

	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

var benchSegment = flag.Int("host.segment", 0, "Config.SegmentBytes for BenchmarkAllReduce (0: the default)")

// BenchmarkAllReduce all-reduces float32 buffers between 2 ranks of this
// process over loopback TCP and reports the bus bandwidth, 2(n-1)/n times
// the bytes per second, as NCCL's tests do (for 2 ranks it equals the
// MB/s column).
//
//	go test -run '^$' -bench AllReduce -benchtime 2s ./shim/host/ [-args -host.segment N]
func BenchmarkAllReduce(b *testing.B) {
	const n = 2
	comms := newRing(b, n, Config{SegmentBytes: *benchSegment})
	for _, size := range []int{64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			bufs := make([][]byte, n)
			for r := range bufs {
				bufs[r] = make([]byte, size)
			}
			b.SetBytes(int64(size))
			b.ResetTimer()
			errs := each(n, func(r int) error {
				for range b.N {
					if err := comms[r].AllReduce(b.Context(), bufs[r], reduce.Float32, reduce.Sum); err != nil {
						return err
					}
				}
				return nil
			})
			if err := errors.Join(errs...); err != nil {
				b.Fatal(err)
			}
			busbw := 2 * float64(n-1) / n * float64(size) * float64(b.N) / b.Elapsed().Seconds()
			b.ReportMetric(busbw/1e9, "busGB/s")
		})
	}
}
