package stall

import (
	"slices"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// window is a bucket's last durations, kept both in arrival order (to know
// which one leaves) and sorted (for the median). Insertion and removal are
// O(size) moves of a few hundred bytes, cheaper than sorting a copy for
// every collective.
type window struct {
	ring   []time.Duration // arrival order; once full, next is the oldest
	next   int
	sorted []time.Duration
}

func newWindow(size int) *window {
	return &window{
		ring:   make([]time.Duration, 0, size),
		sorted: make([]time.Duration, 0, size),
	}
}

func (w *window) len() int { return len(w.sorted) }

// add puts d in the window, pushing out the oldest duration when full.
func (w *window) add(d time.Duration) {
	if len(w.ring) < cap(w.ring) {
		w.ring = append(w.ring, d)
	} else {
		old := w.ring[w.next]
		w.ring[w.next] = d
		w.next = (w.next + 1) % len(w.ring)
		i, _ := slices.BinarySearch(w.sorted, old)
		w.sorted = slices.Delete(w.sorted, i, i+1)
	}
	i, _ := slices.BinarySearch(w.sorted, d)
	w.sorted = slices.Insert(w.sorted, i, d)
}

// median is the middle duration (the mean of the two middle ones for an
// even count); 0 when empty.
func (w *window) median() time.Duration {
	n := len(w.sorted)
	switch {
	case n == 0:
		return 0
	case n%2 == 1:
		return w.sorted[n/2]
	}
	return w.sorted[n/2-1] + (w.sorted[n/2]-w.sorted[n/2-1])/2
}

// recent remembers the last keys of completed or dropped collectives, so
// that a record arriving after its collective is gone (a delayed in-flight
// report, a duplicate) is recognised as stale instead of opening a
// collective that would never complete and would be reported as a hang.
type recent struct {
	set  map[telemetry.Key]struct{}
	ring []telemetry.Key // once full, next is the oldest
	next int
}

func newRecent(size int) recent {
	return recent{set: make(map[telemetry.Key]struct{}, size), ring: make([]telemetry.Key, 0, size)}
}

func (r *recent) has(k telemetry.Key) bool {
	_, ok := r.set[k]
	return ok
}

func (r *recent) add(k telemetry.Key) {
	if len(r.ring) < cap(r.ring) {
		r.ring = append(r.ring, k)
	} else {
		delete(r.set, r.ring[r.next])
		r.ring[r.next] = k
		r.next = (r.next + 1) % len(r.ring)
	}
	r.set[k] = struct{}{}
}
