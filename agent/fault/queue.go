package fault

import (
	"context"
	"sync"
	"time"
)

// Queue is the one queue every fault source reports to. The run loop
// takes the first fault that belongs to the current attempt, a drain
// before anything else; a drain also closes Urgent, which ends what the
// loop waits on between attempts (the rendezvous, the backoff).
type Queue struct {
	mu      sync.Mutex
	pending []*Fault
	ready   chan struct{} // has a value when pending may be non-empty
	urgent  chan struct{} // closed on the first drain reported
	once    sync.Once
}

// NewQueue returns an empty queue.
func NewQueue() *Queue {
	return &Queue{ready: make(chan struct{}, 1), urgent: make(chan struct{})}
}

// Report queues f; it never blocks. A GPU fault takes the place of one of
// the same severity that still waits, with its findings: the report then
// names them all.
func (q *Queue) Report(f *Fault) {
	q.mu.Lock()
	if gf, ok := f.Err.(*GPUError); ok && f.Severity == Restart {
		for i, p := range q.pending {
			if old, ok := p.Err.(*GPUError); ok && p.Severity == Restart {
				gf.Findings = append(gf.Findings, old.Findings...)
				f.Seen, f.Reason = gf.Last(), gf.Finding()
				q.pending = append(q.pending[:i], q.pending[i+1:]...)
				break
			}
		}
	}
	q.pending = append(q.pending, f)
	q.mu.Unlock()
	if f.Severity >= Drain {
		q.once.Do(func() { close(q.urgent) })
	}
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// Take returns the first queued drain, else the first queued fault of
// the attempt of generation gen that started at started, dropping the
// stale ones before it (passed to drop, for the log); nil when there is
// none.
func (q *Queue) Take(gen uint64, started time.Time, drop func(*Fault)) *Fault {
	if f := q.Drain(); f != nil {
		return f
	}
	var stale []*Fault
	defer func() { // outside the lock: drop logs, and a blocked stderr must not block report
		for _, f := range stale {
			drop(f)
		}
	}()
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.pending) > 0 {
		f := q.pending[0]
		q.pending = q.pending[1:]
		if !f.Stale(gen, started) {
			return f
		}
		stale = append(stale, f)
	}
	return nil
}

// Drain returns the first queued drain, left in the queue; nil when there
// is none.
func (q *Queue) Drain() *Fault {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, f := range q.pending {
		if f.Severity >= Drain {
			return f
		}
	}
	return nil
}

// TakeWorker takes the queued failure of generation gen's workers, if
// there is one.
func (q *Queue) TakeWorker(gen uint64) *Fault {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, f := range q.pending {
		if f.Source == FromWorker && f.Gen == gen {
			q.pending = append(q.pending[:i], q.pending[i+1:]...)
			return f
		}
	}
	return nil
}

// Clear drops every queued fault but a drain: between attempts the others
// are all stale.
func (q *Queue) Clear() {
	q.mu.Lock()
	defer q.mu.Unlock()
	kept := q.pending[:0]
	for _, f := range q.pending {
		if f.Severity >= Drain {
			kept = append(kept, f)
		}
	}
	q.pending = kept
}

// Bound is ctx, ended too when a drain is reported: what the loop waits
// on outside an attempt's wait (the rendezvous, spawning the workers)
// gives way to it. Call cancel when done.
func (q *Queue) Bound(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-q.urgent:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// Ready has a value when the queue may hold a fault: wait on it, then
// Take.
func (q *Queue) Ready() <-chan struct{} { return q.ready }

// Urgent is closed once a drain has been reported.
func (q *Queue) Urgent() <-chan struct{} { return q.urgent }
