package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

// A detector's findings are taken at findingRate a second on average, in
// bursts of up to findingBurst: a check of every GPU of a node, every
// second, is 8 a second.
const (
	findingRate  = 100
	findingBurst = 200
)

func newFindingPace() *rate.Limiter { return rate.NewLimiter(findingRate, findingBurst) }

// hungError: a detector sent no verdict for longer than it promised.
type hungError struct{ silent, every time.Duration }

func (e *hungError) Error() string {
	return fmt.Sprintf("hung: no verdict for %s; it promised one every %s", e.silent, e.every)
}

// watch runs a detector's Watch until the host closes (nil), or the
// plugin crashes, ends its watch, or goes silent for 2 × Every + the
// grace (a hang: its stream is cancelled).
func (h *Host) watch(sp Spec, p *proc, sched detector.Schedule) error {
	limit := 2*sched.Every + h.cfg.HangGrace
	ctx, cancel := context.WithCancelCause(h.ctx)
	defer cancel(nil)
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	done := make(chan struct{})
	defer close(done)
	go func() {
		t := time.NewTicker(max(limit/8, 20*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				if silent := now.Sub(time.Unix(0, last.Load())); silent > limit {
					cancel(&hungError{silent: silent.Round(100 * time.Millisecond), every: sched.Every})
					return
				}
			}
		}
	}()
	pace := newFindingPace()
	err := p.det.Watch(ctx, func(f detector.Finding) error {
		last.Store(time.Now().UnixNano())
		h.verdicts.add(sp.Name, f)
		// Past its rate the watch waits, so a detector that floods is
		// slowed down by gRPC's flow control rather than served: one
		// sending as fast as it could took half a core of a node that
		// trains.
		return pace.Wait(ctx)
	})
	var hung *hungError
	switch {
	case errors.As(context.Cause(ctx), &hung):
		return hung
	case h.ctx.Err() != nil:
		return nil
	case p.exitedWithin(200 * time.Millisecond):
		return p.exitedError()
	case err == nil:
		return errors.New("the plugin ended its watch")
	}
	return err
}
