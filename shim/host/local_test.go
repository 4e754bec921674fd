package host

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// connectWith connects n ranks over loopback with peers edited by edit;
// the Comms are closed when the test ends.
func connectWith(t testing.TB, n int, cfg Config, edit func([]PeerInfo)) []*Comm {
	t.Helper()
	eps, peers := listen(t, n)
	if edit != nil {
		edit(peers)
	}
	comms := make([]*Comm, n)
	errs := each(n, func(r int) (err error) {
		comms[r], err = Connect(t.Context(), eps[r], r, peers, cfg)
		return err
	})
	t.Cleanup(func() {
		for _, c := range comms {
			if c != nil {
				c.Close()
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if name := "/dev/shm/ddpshim-" + peers[0].Nonce; fileExists(name) {
		t.Errorf("%s still exists after Connect", name)
	}
	return comms
}

func fileExists(name string) bool {
	_, err := os.Stat(name)
	return err == nil
}

// TestSharedMemory: with Config.SHM, ranks on one host all-reduce through
// shared memory, with the same results as the ring; ranks on several hosts
// with more than one on some go hierarchical (hier_test.go has more); one
// rank per host, or no SHM, use the ring.
func TestSharedMemory(t *testing.T) {
	elsewhere := func(p []PeerInfo) { p[len(p)-1].HostID = "another host" }
	tests := []struct {
		name string
		n    int
		shm  bool
		edit func([]PeerInfo)
		want string
	}{
		{"2 ranks", 2, true, nil, "shm"},
		{"3 ranks", 3, true, nil, "shm"},
		{"4 ranks", 4, true, nil, "shm"},
		{"one rank elsewhere", 3, true, elsewhere, "hierarchical"},
		{"every rank elsewhere", 3, true, func(p []PeerInfo) {
			for r := range p {
				p[r].HostID = fmt.Sprint("host ", r)
			}
		}, "tcp"},
		{"off", 2, false, nil, "tcp"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			comms := connectWith(t, tc.n, Config{SHM: tc.shm, Timeout: 30 * time.Second}, tc.edit)
			for r, c := range comms {
				if got := c.Transport(); got != tc.want {
					t.Errorf("rank %d: transport %q, want %q", r, got, tc.want)
				}
			}
			for _, count := range []int{0, 1, 1037, 300_001} {
				in := newInputs(tc.n, count)
				for _, dt := range []reduce.DType{reduce.Float32, reduce.BFloat16, reduce.Int64} {
					for _, op := range []reduce.Op{reduce.Sum, reduce.Avg} {
						checkAllReduce(t, comms, in, dt, op)
					}
				}
			}
		})
	}
}

// TestSharedMemoryFailures: over shared memory too, a mismatch gives
// failure.ErrMismatch (or failure.ErrPeer), and a rank that goes away fails the others at
// once, long before the timeout.
func TestSharedMemoryFailures(t *testing.T) {
	t.Run("mismatch", func(t *testing.T) {
		comms := connectWith(t, 3, Config{SHM: true, Timeout: 30 * time.Second}, nil)
		start := time.Now()
		errs := each(3, func(r int) error {
			return comms[r].AllReduce(t.Context(), make([]byte, 4*(100+r/2)), reduce.Float32, reduce.Sum)
		})
		if el := time.Since(start); el > 5*time.Second {
			t.Errorf("took %v", el)
		}
		mismatches := 0
		for r, err := range errs {
			t.Logf("rank %d: %v", r, err)
			switch {
			case errors.Is(err, failure.ErrMismatch):
				mismatches++
			case errors.Is(err, failure.ErrPeer):
			default:
				t.Errorf("rank %d: got %v, want failure.ErrMismatch or failure.ErrPeer", r, err)
			}
		}
		if mismatches == 0 {
			t.Errorf("got no failure.ErrMismatch")
		}
	})
	t.Run("rank closes", func(t *testing.T) {
		comms := connectWith(t, 3, Config{SHM: true, Timeout: 30 * time.Second}, nil)
		time.AfterFunc(200*time.Millisecond, func() { comms[2].Close() })
		start := time.Now()
		errs := each(2, func(r int) error {
			return comms[r].AllReduce(t.Context(), make([]byte, 1<<20), reduce.Float32, reduce.Sum)
		})
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("took %v, want about 200ms", el)
		}
		for r, err := range errs {
			t.Logf("rank %d: %v", r, err)
			if !errors.Is(err, failure.ErrPeer) {
				t.Errorf("rank %d: got %v, want failure.ErrPeer", r, err)
			}
		}
	})
}
