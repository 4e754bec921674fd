package host

import (
	"sync"
	"testing"
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
