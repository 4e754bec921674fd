package detector

import (
	"context"
	"sync"
	"time"

	detectorv1 "github.com/ddp-agent/ddp-agent/plugins/detector/proto"
)

// The batching of a plugin's verdicts on Watch. A verdict made when none
// was sent for batchWindow goes at once; under a storm, what comes within
// a window goes in one message. One gRPC message per verdict cost the
// agent a wake-up each: 1,000 verdicts a second took a fifth of a core
// (2-core VM, examples/bench/plugins).
const (
	batchWindow = 10 * time.Millisecond
	// batchMax: emit blocks while this many verdicts wait; a detector
	// faster than its stream is held back rather than buffered without
	// bound.
	batchMax = 4096
)

// batcher collects a detector's verdicts for its Watch stream's sender.
type batcher struct {
	send func(*detectorv1.Findings) error

	mu      sync.Mutex
	room    *sync.Cond // signalled when the sender took the pending verdicts, or stopped
	pending []*detectorv1.Finding
	err     error // the send that failed, or the stream's end; later adds return it
	wake    chan struct{}
}

func newBatcher(send func(*detectorv1.Findings) error) *batcher {
	b := &batcher{send: send, wake: make(chan struct{}, 1)}
	b.room = sync.NewCond(&b.mu)
	return b
}

// add queues f for the stream; it blocks while batchMax wait, and fails
// once the stream has failed or ended.
func (b *batcher) add(f *detectorv1.Finding) error {
	b.mu.Lock()
	for b.err == nil && len(b.pending) >= batchMax {
		b.room.Wait()
	}
	if b.err != nil {
		err := b.err
		b.mu.Unlock()
		return err
	}
	b.pending = append(b.pending, f)
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
	return nil
}

// run sends what is added until ctx ends or a send fails; then it sends
// what is left, once, and makes every later add fail with stop.
func (b *batcher) run(ctx context.Context, stop error) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			b.stop(stop)
			return
		case <-b.wake:
		}
		if wait := batchWindow - time.Since(last); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				b.stop(stop)
				return
			case <-t.C:
			}
		}
		if err := b.flush(); err != nil {
			b.stop(err)
			return
		}
		last = time.Now()
	}
}

// flush sends the pending verdicts, if any, in one message.
func (b *batcher) flush() error {
	b.mu.Lock()
	batch := b.pending
	b.pending = nil
	b.room.Broadcast()
	b.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	return b.send(&detectorv1.Findings{Findings: batch})
}

func (b *batcher) stop(err error) {
	b.mu.Lock()
	if b.err == nil {
		b.err = err
	}
	b.room.Broadcast()
	b.mu.Unlock()
}
