package comm

import (
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// TestWaitRunsQueuedInOrder: collectives run in issue order and complete
// correctly whoever runs them, the executor or a waiter (runUpTo): each
// rank issues a batch, then waits for the works in reverse order or from
// one goroutine per work, over shared memory and over the TCP ring; every
// fourth is a broadcast (broadcastRoot), queued among the all-reduces.
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
						var w *Work
						var err error
						if root, ok := broadcastRoot(i); ok {
							// Two buffers, cut where each rank likes.
							half := int64(1000 + 7*r)
							w, err = comms[r].Broadcast([]unsafe.Pointer{unsafe.Pointer(&b[0]), unsafe.Pointer(&b[half])},
								[]int64{half, count - half}, reduce.Float32, root, uint64(i), 0)
						} else {
							w, err = comms[r].AllReduce(unsafe.Pointer(&b[0]), count, reduce.Float32, reduce.Sum, nil, uint64(i), 0)
						}
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
						want := float32(2*i + 1 + 2*(k%7))
						if root, ok := broadcastRoot(i); ok {
							want = float32(root + i + k%7)
						}
						if v != want {
							t.Fatalf("rank %d, collective %d, element %d: got %v, want %v", r, i, k, v, want)
						}
					}
				}
			}
		})
	}
}

// broadcastRoot says which collectives of TestWaitRunsQueuedInOrder's
// batch are broadcasts (every fourth), and from which rank.
func broadcastRoot(i int) (int, bool) { return (i / 4) % 2, i%4 == 3 }

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

// TestUnwaitedWorkRuns: collectives that no caller waits on still run, in
// order, with the executor woken by the kick timer (Done only looks) or by
// Test, and later ones queue behind a running one and run too.
func TestUnwaitedWorkRuns(t *testing.T) {
	const world, batch, count = 2, 8, 1031
	for _, poll := range []string{"done", "test"} {
		t.Run(poll, func(t *testing.T) {
			comms := openWorld(t, world, func(r int) string {
				return `{"rank":` + strconv.Itoa(r) + `,"world_size":2,"timeout_ms":20000,"name":"t"}`
			})
			bufs := make([][][]float32, world)
			works := make([][]*Work, world)
			for r := range world {
				for i := range batch {
					b := make([]float32, count)
					for k := range b {
						b[k] = float32(r*i + k%5)
					}
					w, err := comms[r].AllReduce(unsafe.Pointer(&b[0]), count, reduce.Float32, reduce.Sum, nil, uint64(i), 0)
					if err != nil {
						t.Fatal(err)
					}
					bufs[r] = append(bufs[r], b)
					works[r] = append(works[r], w)
				}
			}
			deadline := time.Now().Add(10 * time.Second)
			for r := range world {
				for i, w := range works[r] {
					for !(poll == "done" && w.Done() || poll == "test" && w.Test()) {
						if time.Now().After(deadline) {
							t.Fatalf("rank %d, collective %d: not done after 10 s without a waiter", r, i)
						}
						time.Sleep(50 * time.Microsecond)
					}
					if w.err != nil {
						t.Fatalf("rank %d, collective %d: %v", r, i, w.err)
					}
					for k, v := range bufs[r][i] {
						if want := float32(i + 2*(k%5)); v != want {
							t.Fatalf("rank %d, collective %d, element %d: got %v, want %v", r, i, k, v, want)
						}
					}
				}
			}
			for r := range world {
				comms[r].mu.Lock()
				n := comms[r].byWaiter
				comms[r].mu.Unlock()
				if n != 0 {
					t.Errorf("rank %d: %d collectives run by a waiter, want 0: no caller waited", r, n)
				}
			}
		})
	}
}
