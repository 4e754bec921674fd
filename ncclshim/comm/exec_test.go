package comm

import (
	"errors"
	"strconv"
	"sync"
	"testing"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/ncclshim/reduce"
)

// TestWaitRunsQueuedInOrder: collectives run in issue order and complete
// correctly whoever runs them, the executor or a waiter (runUpTo): each
// rank issues a batch, then waits for the works in reverse order or from
// one goroutine per work, over shared memory and over the TCP ring.
func TestWaitRunsQueuedInOrder(t *testing.T) {
	const world, batch, count = 2, 16, 4099
	for _, tc := range []struct {
		name string
		shm  bool
		wait string // "reverse" or "concurrent"
	}{
		{"shm/reverse", true, "reverse"},
		{"shm/concurrent", true, "concurrent"},
		{"tcp/reverse", false, "reverse"},
		{"tcp/concurrent", false, "concurrent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := openWorld(t, world, func(r int) string {
				return `{"rank":` + strconv.Itoa(r) + `,"world_size":2,"timeout_ms":20000,"name":"t","shm":` +
					strconv.FormatBool(tc.shm) + `}`
			})
			var wg sync.WaitGroup
			errs := make([]error, world)
			bufs := make([][][]float32, world)
			for r := range world {
				wg.Add(1)
				go func() {
					defer wg.Done()
					bufs[r] = make([][]float32, batch)
					works := make([]*Work, batch)
					for i := range batch {
						b := make([]float32, count)
						for k := range b {
							b[k] = float32(r + i + k%7)
						}
						bufs[r][i] = b
						w, err := comms[r].AllReduce(unsafe.Pointer(&b[0]), count, reduce.Float32, reduce.Sum, nil, uint64(i), 0)
						if err != nil {
							errs[r] = err
							return
						}
						works[i] = w
					}
					errs[r] = waitAll(works, tc.wait)
				}()
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			for r := range world {
				for i, b := range bufs[r] {
					for k, v := range b {
						if want := float32(2*i + 1 + 2*(k%7)); v != want {
							t.Fatalf("rank %d, collective %d, element %d: got %v, want %v", r, i, k, v, want)
						}
					}
				}
			}
		})
	}
}

// waitAll waits for works: the last first ("reverse"), or each from a
// goroutine of its own ("concurrent").
func waitAll(works []*Work, how string) error {
	errs := make([]error, len(works))
	var wg sync.WaitGroup
	for i := len(works) - 1; i >= 0; i-- {
		if how == "concurrent" {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = works[i].Wait()
			}()
			continue
		}
		errs[i] = works[i].Wait()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// TestWaitAfterClose: a waiter whose work was still queued when the
// communicator closed returns an error at once instead of running it.
func TestWaitAfterClose(t *testing.T) {
	comms := openWorld(t, 2, func(r int) string {
		return `{"rank":` + strconv.Itoa(r) + `,"world_size":2,"timeout_ms":20000,"name":"t"}`
	})
	buf := make([]float32, 64)
	// Rank 1 never joins: the first collective blocks until Close aborts it,
	// and the rest stay queued behind it.
	var works []*Work
	for i := range 4 {
		w, err := comms[0].AllReduce(unsafe.Pointer(&buf[0]), int64(len(buf)), reduce.Float32, reduce.Sum, nil, uint64(i), 0)
		if err != nil {
			t.Fatal(err)
		}
		works = append(works, w)
	}
	comms[0].Close()
	for i, w := range works {
		if err := w.Wait(); err == nil {
			t.Errorf("work %d: got nil, want an error after close", i)
		}
	}
}
