package host

import (
	"errors"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// TestCloseRightAfterLastAllReduce: ranks finish a collective at different
// moments, and the first to finish closes at once (DDP's last bucket, then
// the end of training). The others must still complete it, and a later
// collective must fail (not hang) on a rank whose neighbour has left.
func TestCloseRightAfterLastAllReduce(t *testing.T) {
	for _, tc := range []struct {
		name string
		shm  bool
	}{{"tcp", false}, {"shm", true}} {
		t.Run(tc.name, func(t *testing.T) {
			const n, count, trials = 3, 300_000, 8
			for trial := range trials {
				comms := connectWith(t, n, Config{SHM: tc.shm, Timeout: 20 * time.Second}, nil)
				bufs := newInputs(n, count).encode(reduce.Float32)
				errs := each(n, func(r int) error {
					err := comms[r].AllReduce(t.Context(), bufs[r], reduce.Float32, reduce.Sum)
					comms[r].Close()
					return err
				})
				if err := errors.Join(errs...); err != nil {
					t.Fatalf("trial %d: %v", trial, err)
				}
			}
		})
	}
}

func TestAllReduceAfterNeighbourClosed(t *testing.T) {
	comms := newRing(t, 3, Config{Timeout: 20 * time.Second})
	comms[1].Close()
	buf := make([]byte, 4096)
	start := time.Now()
	// Rank 2 hears the goodbye at once; rank 0 notices when rank 2 fails
	// and closes its connections, or at the latest when its send fails.
	errs := each(2, func(i int) error {
		return comms[[]int{0, 2}[i]].AllReduce(t.Context(), buf, reduce.Float32, reduce.Sum)
	})
	for i, err := range errs {
		if !errors.Is(err, failure.ErrPeer) && !errors.Is(err, failure.ErrAborted) {
			t.Errorf("rank %d: got %v, want failure.ErrPeer", []int{0, 2}[i], err)
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
}
