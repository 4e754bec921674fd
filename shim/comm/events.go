package comm

import (
	"context"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/wire"
)

// Event shipping: the executor records one event per collective into a
// bounded ring; a shipper goroutine sends batches to the agent. A full ring
// or a slow agent drops events (and counts them); it never delays a
// collective.
const (
	eventRingSize  = 4096
	eventBatchMax  = 1024
	eventFlushTick = 200 * time.Millisecond
)

// eventSink is what the shipper sends batches to: the control client.
type eventSink interface {
	SendEvents(wire.Events) error
}

type eventRing struct {
	mu      sync.Mutex
	buf     []wire.CollectiveEvent
	head    int // index of the oldest event
	n       int
	dropped uint64 // since the last batch taken
	kick    chan struct{}

	// totals, for ddpshim_comm_info
	sent, droppedTotal uint64
}

func newEventRing() *eventRing {
	return &eventRing{buf: make([]wire.CollectiveEvent, eventRingSize), kick: make(chan struct{}, 1)}
}

// push records ev, or counts it as dropped when the ring is full.
func (r *eventRing) push(ev wire.CollectiveEvent) {
	r.mu.Lock()
	if r.n == len(r.buf) {
		r.dropped++
		r.droppedTotal++
		r.mu.Unlock()
		return
	}
	r.buf[(r.head+r.n)%len(r.buf)] = ev
	r.n++
	full := r.n >= eventBatchMax
	r.mu.Unlock()
	if full {
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
}

// take removes up to eventBatchMax events and the dropped count.
func (r *eventRing) take() wire.Events {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := min(r.n, eventBatchMax)
	ev := wire.Events{Dropped: r.dropped, Events: make([]wire.CollectiveEvent, k)}
	for i := range k {
		ev.Events[i] = r.buf[(r.head+i)%len(r.buf)]
	}
	r.head = (r.head + k) % len(r.buf)
	r.n -= k
	r.dropped = 0
	return ev
}

// settle accounts for a batch: sent, or lost with the connection.
func (r *eventRing) settle(ev wire.Events, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.dropped += ev.Dropped + uint64(len(ev.Events)) // report them with the next batch
		r.droppedTotal += uint64(len(ev.Events))
		return
	}
	r.sent += uint64(len(ev.Events))
}

func (r *eventRing) stats() (sent, dropped uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sent, r.droppedTotal
}

// ship sends batches to sink until ctx is done, then flushes what is left.
// tick, if not nil, runs before each timed flush (it may push events).
func (r *eventRing) ship(ctx context.Context, sink eventSink, tick func()) {
	t := time.NewTicker(eventFlushTick)
	defer t.Stop()
	flush := func() {
		for {
			ev := r.take()
			if len(ev.Events) == 0 && ev.Dropped == 0 {
				return
			}
			r.settle(ev, sink.SendEvents(ev))
			if len(ev.Events) < eventBatchMax {
				return
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			flush()
			return
		case <-t.C:
			if tick != nil {
				tick()
			}
		case <-r.kick:
		}
		flush()
	}
}

// inFlightAfter is how long a collective is in flight before its event
// with wire.StatusInFlight (TEnd 0) is sent, once, so the agent sees who has
// arrived at a collective that hangs. Collectives that finish sooner cost
// nothing extra.
const inFlightAfter = time.Second

// reportInFlight pushes an in-flight event for each collective that has
// been in flight for inFlightAfter and was not reported yet.
func (c *Comm) reportInFlight() {
	if c.events == nil {
		return
	}
	old := time.Now().Add(-inFlightAfter)
	var evs []wire.CollectiveEvent
	c.mu.Lock()
	if f := c.first; f != nil && !f.reported && f.arrive.Before(old) {
		f.reported = true
		evs = append(evs, wire.CollectiveEvent{Step: f.step, Bucket: uint32(f.bucket), Status: wire.StatusInFlight,
			TArrive: f.arrive.UnixNano()})
	}
	works := c.queue
	if c.running != nil {
		works = append([]*Work{c.running}, works...)
	}
	for _, w := range works {
		if !w.reported && w.arrive.Before(old) {
			w.reported = true
			evs = append(evs, wire.CollectiveEvent{Step: w.step, Bucket: uint32(w.bucket), Bytes: uint64(w.bytes),
				DType: uint8(w.dt), Status: wire.StatusInFlight, TArrive: w.arrive.UnixNano(), TStart: w.started.Load()})
		}
	}
	c.mu.Unlock()
	evs = append(evs, c.tp.inFlight(old)...)
	for _, ev := range evs {
		c.events.push(ev)
	}
}

// firstArrival is the collective a communicator was opened for
// (Config.FirstStep), while its bootstrap waits for the other ranks: the
// caller has arrived at it. A rank that never opens its communicator
// never comes to its first all-reduce, and the ranks that wait for it wait
// in the bootstrap; reported in flight like a collective, their wait is a
// hang the agent names the missing rank of, with its stack, as at any
// later step. Its record has no bytes: the collective's own record has.
type firstArrival struct {
	step     uint64
	bucket   int32
	arrive   time.Time
	reported bool
}

// arrivedFirst ends the bootstrap's wait: the collective's own records
// follow.
func (c *Comm) arrivedFirst() {
	c.mu.Lock()
	c.first = nil
	c.mu.Unlock()
}

// Mark records that the caller started the forward pass of step now (kind
// wire.MarkForward), for the agent's split of a straggler's lateness into
// input and compute. It costs a ring push; without ddp-agent it does
// nothing. It does not touch the collectives, so it works on a closed or
// aborted communicator as a no-op.
func (c *Comm) Mark(step uint64, kind uint32) {
	if c.events == nil {
		return
	}
	c.events.push(wire.CollectiveEvent{Step: step, Bucket: kind, Status: wire.StatusMark, TArrive: time.Now().UnixNano()})
}
