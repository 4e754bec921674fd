package host

import (
	"sync"
	"testing"
)

// newRing connects n ranks over loopback in this process; the Comms are
// closed when the test ends.
func newRing(t testing.TB, n int, cfg Config) []*Comm {
	t.Helper()
	eps := make([]*Endpoint, n)
	peers := make([]PeerInfo, n)
	for r := range n {
		ep, err := Listen(Options{Host: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		eps[r], peers[r] = ep, ep.Info()
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
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return comms
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
