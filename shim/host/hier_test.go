package host

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// onHosts returns an edit that puts rank r on host layout[r].
func onHosts(layout ...int) func([]PeerInfo) {
	return func(p []PeerInfo) {
		for r := range p {
			p[r].HostID = fmt.Sprint("host ", layout[r])
		}
	}
}

// TestHierarchical: ranks spread over hosts (HostIDs; the hosts are all this
// machine, over loopback) all-reduce through shared memory within a host and
// the leaders' ring between them: every dtype, op and count, exact results,
// bit-identical on every rank also where the order of the additions shows
// (random float32), with hosts of unequal size and ranks of one host not
// next to each other in rank order, staged and single copy.
func TestHierarchical(t *testing.T) {
	for _, tc := range []struct {
		name   string
		layout []int
	}{
		{"2x2", []int{0, 0, 1, 1}},
		{"3+1+1", []int{0, 0, 0, 1, 2}},
		{"interleaved", []int{0, 1, 0, 1, 1}},
		{"1+2", []int{0, 1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := len(tc.layout)
			comms := connectWith(t, n, Config{SHM: true, Timeout: 30 * time.Second}, onHosts(tc.layout...))
			for r, c := range comms {
				if got := c.Transport(); got != "hierarchical" {
					t.Fatalf("rank %d: transport %q, want hierarchical", r, got)
				}
			}
			for _, seg := range []int{defaultPipeSeg, 40 << 10} {
				// 40 KiB segments pipeline the larger counts: a
				// segment's ring overlaps the next one's shared
				// memory, and segments end mid-element for no dtype.
				for _, c := range comms {
					c.data.(*hierarchy).seg = seg
				}
				for _, count := range []int{0, 1, n - 1, 1037, 300_001} {
					in := newInputs(n, count)
					for _, dt := range reduce.DTypes {
						for _, op := range []reduce.Op{reduce.Sum, reduce.Avg} {
							checkAllReduce(t, comms, in, dt, op)
						}
					}
				}
			}
			// Random values: sums depend on their order, and every rank
			// must still hold the same bytes.
			rng := rand.New(rand.NewPCG(1, uint64(n)))
			bufs := make([][]byte, n)
			for r := range bufs {
				v := make([]float64, 100_003)
				for i := range v {
					v[i] = rng.NormFloat64() * 1e3
				}
				bufs[r] = reduce.Encode(reduce.Float32, v)
			}
			if err := errors.Join(each(n, func(r int) error {
				return comms[r].AllReduce(t.Context(), bufs[r], reduce.Float32, reduce.Avg)
			})...); err != nil {
				t.Fatal(err)
			}
			for r := 1; r < n; r++ {
				if !bytes.Equal(bufs[r], bufs[0]) {
					t.Fatalf("rank %d's result differs from rank 0's: %s", r, firstDiff(reduce.Float32, bufs[r], bufs[0]))
				}
			}
		})
	}
}

// TestHierarchicalFailures: a mismatch fails every rank, and a rank that
// closes mid-collective, a leader or not, fails the others at once with
// failure.ErrPeer, long before the timeout.
func TestHierarchicalFailures(t *testing.T) {
	layout := onHosts(0, 0, 1, 1)
	t.Run("mismatch", func(t *testing.T) {
		comms := connectWith(t, 4, Config{SHM: true, Timeout: 30 * time.Second}, layout)
		errs := each(4, func(r int) error {
			return comms[r].AllReduce(t.Context(), make([]byte, 4*(100+r/3)), reduce.Float32, reduce.Sum)
		})
		for r, err := range errs {
			t.Logf("rank %d: %v", r, err)
			if !errors.Is(err, failure.ErrMismatch) && !errors.Is(err, failure.ErrPeer) {
				t.Errorf("rank %d: got %v, want failure.ErrMismatch or failure.ErrPeer", r, err)
			}
		}
	})
	for _, closing := range []int{2, 3} { // host 1's leader, then its other rank
		t.Run(fmt.Sprintf("rank %d closes", closing), func(t *testing.T) {
			comms := connectWith(t, 4, Config{SHM: true, Timeout: 30 * time.Second}, layout)
			time.AfterFunc(200*time.Millisecond, func() { comms[closing].Close() })
			start := time.Now()
			errs := each(4, func(r int) error {
				if r == closing {
					return nil
				}
				return comms[r].AllReduce(t.Context(), make([]byte, 1<<20), reduce.Float32, reduce.Sum)
			})
			if el := time.Since(start); el > 3*time.Second {
				t.Errorf("took %v, want about 200ms", el)
			}
			for r, err := range errs {
				if r == closing {
					continue
				}
				t.Logf("rank %d: %v", r, err)
				if !errors.Is(err, failure.ErrPeer) && !errors.Is(err, failure.ErrAborted) {
					t.Errorf("rank %d: got %v, want failure.ErrPeer", r, err)
				}
				// The leader of a rank that closes hears it through shared
				// memory, whose ranks are local: the blame must name the
				// rank. (When the leader closes, its host's other rank may
				// hear the cascade through the full ring first.)
				var pe *failure.PeerError
				if closing == 3 && r == 2 && (!errors.As(err, &pe) || pe.Rank != closing) {
					t.Errorf("rank %d: got %v, want a failure.PeerError naming rank %d", r, err, closing)
				}
			}
		})
	}
}
