package host

import (
	"bytes"
	"errors"
	"sync"
	"testing"

	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// newRing connects n ranks over loopback in this process; the Comms are
// closed when the test ends.
func newRing(t testing.TB, n int, cfg Config) []*Comm {
	t.Helper()
	return connectWith(t, n, cfg, nil)
}

// each runs f for ranks 0..n-1 concurrently and returns their errors.
func each(n int, f func(r int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(r)
		}()
	}
	wg.Wait()
	return errs
}

// checkAllReduce all-reduces in's buffers of dt on every rank of comms and
// checks each rank's result against the exact reference, bit for bit.
func checkAllReduce(t *testing.T, comms []*Comm, in *inputs, dt reduce.DType, op reduce.Op) {
	t.Helper()
	bufs := in.encode(dt)
	errs := each(len(comms), func(r int) error { return comms[r].AllReduce(t.Context(), bufs[r], dt, op) })
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("%d elements %v %v: %v", len(bufs[0])/dt.Size(), dt, op, err)
	}
	want := in.want(dt, op)
	for r, got := range bufs {
		if !bytes.Equal(got, want) {
			t.Fatalf("%d elements %v %v rank %d: %s", len(bufs[0])/dt.Size(), dt, op, r, firstDiff(dt, got, want))
		}
	}
}
