package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// TestAllReduce checks every dtype and op against a float64 reference, for
// 1 to 8 ranks and counts that are zero, smaller than the world size, not
// divisible by it, and several MiB. The inputs are multiples of 0.5 in
// [-8, 8] (whole numbers in [-16, 16] for integer types), so every partial
// sum is exact in every dtype and the results must equal the reference bit
// for bit: no tolerance. Avg divides once, rounding the quotient once, as
// the reference does (integers truncate toward zero in both).
func TestAllReduce(t *testing.T) {
	const large = 1<<20 + 3 // elements: 4 MiB of float32
	type ring struct {
		name   string
		n, seg int
		counts []int
	}
	var rings []ring
	for n := 1; n <= 8; n++ {
		counts := []int{0, 1, n - 1, n + 1, 1037}
		slices.Sort(counts)
		counts = slices.Compact(counts)
		if n%3 != 1 { // 2, 3, 5, 6, 8: keep -race quick
			counts = append(counts, large)
		}
		rings = append(rings, ring{fmt.Sprintf("n=%d", n), n, 0, counts})
	}
	rings = append(rings,
		// Tiny segments: many per chunk, ragged and empty last ones.
		ring{"n=3/seg=48B", 3, 48, []int{73, 1037}},
		ring{"n=5/seg=100B", 5, 100, []int{5*13 + 4, 1037}},
		ring{"n=4/seg=4KiB", 4, 4 << 10, []int{large}},
	)
	for _, rc := range rings {
		t.Run(rc.name, func(t *testing.T) {
			comms := newRing(t, rc.n, Config{SegmentBytes: rc.seg, Timeout: time.Minute})
			for _, count := range rc.counts {
				in := newInputs(rc.n, count)
				for _, dt := range reduce.DTypes {
					for _, op := range []reduce.Op{reduce.Sum, reduce.Avg} {
						t.Run(fmt.Sprintf("count=%d/%v/%v", count, dt, op), func(t *testing.T) {
							bufs := in.encode(dt)
							errs := each(rc.n, func(r int) error {
								return comms[r].AllReduce(t.Context(), bufs[r], dt, op)
							})
							for r, err := range errs {
								if err != nil {
									t.Fatalf("rank %d: %v", r, err)
								}
							}
							want := in.want(dt, op)
							for r, got := range bufs {
								if !bytes.Equal(got, want) {
									t.Fatalf("rank %d: %s", r, firstDiff(dt, got, want))
								}
							}
						})
					}
				}
			}
		})
	}
}

// inputs are the ranks' values of one test, for floating-point (halves)
// and integer (wholes) dtypes, and their sums.
type inputs struct {
	n                    int
	halves, wholes       [][]float64
	sumHalves, sumWholes []float64
}

func newInputs(n, count int) *inputs {
	in := &inputs{n: n, sumHalves: make([]float64, count), sumWholes: make([]float64, count)}
	for r := range n {
		h, w := make([]float64, count), make([]float64, count)
		for i := range count {
			v := float64((i*7+r*13)%33 - 16)
			h[i], w[i] = v/2, v
			in.sumHalves[i] += v / 2
			in.sumWholes[i] += v
		}
		in.halves, in.wholes = append(in.halves, h), append(in.wholes, w)
	}
	return in
}

func (in *inputs) encode(dt reduce.DType) [][]byte {
	vals := in.halves
	if !dt.Float() {
		vals = in.wholes
	}
	bufs := make([][]byte, in.n)
	for r := range bufs {
		bufs[r] = reduce.Encode(dt, vals[r])
	}
	return bufs
}

func (in *inputs) want(dt reduce.DType, op reduce.Op) []byte {
	sum := in.sumHalves
	if !dt.Float() {
		sum = in.sumWholes
	}
	if op == reduce.Avg {
		avg := make([]float64, len(sum))
		for i, s := range sum {
			avg[i] = s / float64(in.n) // Encode truncates integers toward zero, as Div does
		}
		sum = avg
	}
	return reduce.Encode(dt, sum)
}

func firstDiff(dt reduce.DType, got, want []byte) string {
	if len(got) != len(want) {
		return fmt.Sprintf("got %d bytes, want %d", len(got), len(want))
	}
	es := dt.Size()
	for i := 0; i < len(got); i += es {
		if !bytes.Equal(got[i:i+es], want[i:i+es]) {
			return fmt.Sprintf("element %d: got %v, want %v", i/es,
				reduce.Decode(dt, got[i:i+es])[0], reduce.Decode(dt, want[i:i+es])[0])
		}
	}
	return "equal"
}

// TestMismatch: ranks that disagree get failure.ErrMismatch where a neighbour's
// header shows it, failure.ErrPeer where only the fallout arrives, and nobody hangs.
func TestMismatch(t *testing.T) {
	type call struct {
		count int
		dt    reduce.DType
		op    reduce.Op
	}
	std := call{10, reduce.Float32, reduce.Sum}
	tests := []struct {
		name  string
		n     int
		odd   int // the rank that issues other
		other call
	}{
		{"count", 2, 1, call{11, reduce.Float32, reduce.Sum}},
		{"zero count", 2, 0, call{0, reduce.Float32, reduce.Sum}},
		{"dtype with equal bytes", 3, 2, call{10, reduce.Int32, reduce.Sum}},
		{"op", 4, 1, call{10, reduce.Float32, reduce.Avg}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			comms := newRing(t, tc.n, Config{Timeout: 30 * time.Second})
			start := time.Now()
			errs := each(tc.n, func(r int) error {
				c := std
				if r == tc.odd {
					c = tc.other
				}
				return comms[r].AllReduce(t.Context(), make([]byte, c.count*c.dt.Size()), c.dt, c.op)
			})
			if el := time.Since(start); el > 5*time.Second {
				t.Errorf("took %v, want well under the 30s timeout", el)
			}
			mismatches := 0
			for r, err := range errs {
				switch {
				case errors.Is(err, failure.ErrMismatch):
					mismatches++
				case errors.Is(err, failure.ErrPeer):
				default:
					t.Errorf("rank %d: got %v, want failure.ErrMismatch or failure.ErrPeer", r, err)
				}
				t.Logf("rank %d: %v", r, err)
			}
			if mismatches == 0 {
				t.Errorf("got no failure.ErrMismatch")
			}
			for r, c := range comms {
				err := c.AllReduce(t.Context(), nil, reduce.Float32, reduce.Sum)
				if !errors.Is(err, failure.ErrAborted) {
					t.Errorf("rank %d: AllReduce after the failure: got %v, want failure.ErrAborted", r, err)
				}
			}
		})
	}
}

// TestStalledPeer: a rank that stays alive but never joins the collective
// makes the others fail with failure.ErrTimeout within the deadline.
func TestStalledPeer(t *testing.T) {
	tests := []struct {
		name     string
		n        int
		timeout  time.Duration // Config.Timeout
		deadline time.Duration // ctx deadline, 0 for none
		want     time.Duration // when the errors are due
	}{
		{"config timeout", 2, time.Second, 0, time.Second},
		{"ctx deadline", 2, time.Minute, 500 * time.Millisecond, 500 * time.Millisecond},
		{"three ranks", 3, time.Second, 0, time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			comms := newRing(t, tc.n, Config{Timeout: tc.timeout})
			stalled := comms[tc.n-1]
			ctx := t.Context()
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.deadline)
				defer cancel()
			}
			start := time.Now()
			errs := each(tc.n-1, func(r int) error {
				return comms[r].AllReduce(ctx, make([]byte, 8<<20), reduce.Float32, reduce.Sum)
			})
			el := time.Since(start)
			if el < tc.want-50*time.Millisecond || el > tc.want+2*time.Second {
				t.Errorf("errors after %v, want about %v", el, tc.want)
			}
			timeouts := 0
			for r, err := range errs {
				t.Logf("rank %d: %v", r, err)
				switch {
				case errors.Is(err, failure.ErrTimeout):
					timeouts++
				case errors.Is(err, failure.ErrPeer) && tc.n > 2: // the fallout of a neighbour's timeout
				default:
					t.Errorf("rank %d: got %v, want failure.ErrTimeout", r, err)
				}
			}
			if timeouts == 0 {
				t.Errorf("got no failure.ErrTimeout")
			}
			// The stalled rank notices that its neighbours gave up.
			select {
			case <-stalled.Done():
				if err := stalled.Err(); !errors.Is(err, failure.ErrPeer) {
					t.Errorf("stalled rank: got %v, want failure.ErrPeer", err)
				}
			case <-time.After(2 * time.Second):
				t.Errorf("stalled rank: Done not closed")
			}
		})
	}
}

// TestAbort: Abort and a cancelled ctx unblock a waiting AllReduce at once,
// and the Comm stays failed.
func TestAbort(t *testing.T) {
	reason := errors.New("agent says stop")
	tests := []struct {
		name  string
		abort func(c *Comm, cancel context.CancelFunc)
		want  []error
	}{
		{"Abort", func(c *Comm, _ context.CancelFunc) { c.Abort(reason) }, []error{failure.ErrAborted, reason}},
		{"Abort nil", func(c *Comm, _ context.CancelFunc) { c.Abort(nil) }, []error{failure.ErrAborted}},
		{"Close", func(c *Comm, _ context.CancelFunc) { c.Close() }, []error{failure.ErrAborted, failure.ErrClosed}},
		{"ctx cancel", func(_ *Comm, cancel context.CancelFunc) { cancel() }, []error{failure.ErrAborted, context.Canceled}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			comms := newRing(t, 2, Config{Timeout: time.Minute})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- comms[0].AllReduce(ctx, make([]byte, 1<<20), reduce.Float32, reduce.Sum) }()
			time.Sleep(100 * time.Millisecond) // rank 1 never joins: rank 0 is blocked
			start := time.Now()
			tc.abort(comms[0], cancel)
			var err error
			select {
			case err = <-errc:
			case <-time.After(5 * time.Second):
				t.Fatal("AllReduce still blocked 5s after the abort")
			}
			if el := time.Since(start); el > 500*time.Millisecond {
				t.Errorf("AllReduce returned %v after the abort", el)
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("got %v, want it to wrap %v", err, w)
				}
			}
			<-comms[0].Done()
			first := comms[0].Err()
			// Later calls fail at once with the first cause; more aborts
			// and closes change nothing.
			each(4, func(int) error { comms[0].Abort(errors.New("later")); return comms[0].Close() })
			if got := comms[0].Err(); got != first {
				t.Errorf("Err changed from %v to %v", first, got)
			}
			err = comms[0].AllReduce(t.Context(), make([]byte, 4), reduce.Float32, reduce.Sum)
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("later AllReduce: got %v, want it to wrap %v", err, w)
				}
			}
			// Rank 1 sees its predecessor go away while idle.
			select {
			case <-comms[1].Done():
				if err := comms[1].Err(); !errors.Is(err, failure.ErrPeer) {
					t.Errorf("rank 1: got %v, want failure.ErrPeer", err)
				}
			case <-time.After(2 * time.Second):
				t.Errorf("rank 1: Done not closed")
			}
		})
	}
}

// TestInvalid: bad arguments fail without panicking or breaking the Comm.
func TestInvalid(t *testing.T) {
	comms := newRing(t, 2, Config{Timeout: 30 * time.Second})
	tests := []struct {
		name string
		buf  []byte
		dt   reduce.DType
		op   reduce.Op
	}{
		{"ragged buffer", make([]byte, 6), reduce.Float32, reduce.Sum},
		{"unknown dtype", make([]byte, 8), reduce.DType(3), reduce.Sum},
		{"unknown op", make([]byte, 8), reduce.Float32, reduce.Op(2)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := comms[0].AllReduce(t.Context(), tc.buf, tc.dt, tc.op); !errors.Is(err, failure.ErrInvalid) {
				t.Errorf("got %v, want failure.ErrInvalid", err)
			}
		})
	}
	t.Run("concurrent call", func(t *testing.T) {
		buf := reduce.Encode(reduce.Int32, []float64{1, 2, 3})
		errc := make(chan error, 1)
		go func() { errc <- comms[0].AllReduce(t.Context(), buf, reduce.Int32, reduce.Sum) }()
		time.Sleep(50 * time.Millisecond)
		if err := comms[0].AllReduce(t.Context(), make([]byte, 4), reduce.Int32, reduce.Sum); !errors.Is(err, failure.ErrInvalid) {
			t.Errorf("got %v, want failure.ErrInvalid", err)
		}
		other := reduce.Encode(reduce.Int32, []float64{10, 20, 30})
		if err := comms[1].AllReduce(t.Context(), other, reduce.Int32, reduce.Sum); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if got, want := reduce.Decode(reduce.Int32, buf), []float64{11, 22, 33}; !slices.Equal(got, want) {
			t.Errorf("got %v, want %v", got, want)
		}
	})
	t.Run("done context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := comms[0].AllReduce(ctx, make([]byte, 4), reduce.Int32, reduce.Sum); !errors.Is(err, context.Canceled) {
			t.Errorf("got %v, want context.Canceled", err)
		}
	})
	// Nothing was sent: the ring still works.
	errs := each(2, func(r int) error {
		return comms[r].AllReduce(t.Context(), make([]byte, 64), reduce.Float64, reduce.Avg)
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d after bad calls: %v", r, err)
		}
	}
}
