package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// hungNotifies: this many Notify calls in a row that outlive their
// timeout make the notifier hung; it is restarted.
const hungNotifies = 3

// deliver hands queued events to a notifier, one at a time, each within
// NotifyTimeout, until the host closes (nil) or the plugin crashes or
// hangs (its error).
func (r *runner) deliver(p *proc) error {
	timeouts := 0
	for {
		select {
		case <-r.h.ctx.Done():
			return nil
		case ev := <-r.q:
			ctx, cancel := context.WithTimeout(r.h.ctx, r.h.cfg.NotifyTimeout)
			err := p.not.Notify(ctx, ev)
			timedOut := errors.Is(ctx.Err(), context.DeadlineExceeded)
			cancel()
			r.pending.Add(-1)
			if err == nil {
				r.delivered.Add(1)
				timeouts = 0
				continue
			}
			r.failed.Add(1)
			switch {
			case r.h.ctx.Err() != nil:
				return nil
			case !pluginsOwn(err) && p.exitedWithin(200*time.Millisecond):
				return errors.New("the plugin exited")
			case timedOut:
				if timeouts++; timeouts >= hungNotifies {
					return fmt.Errorf("hung: %d Notify calls in a row outlived %s", timeouts, r.h.cfg.NotifyTimeout)
				}
			}
			if !r.warnedFail.Swap(true) {
				r.h.log.Warn("notifier failed to deliver an event (further failures are counted; the total at exit)",
					"plugin", r.sp.Name, "event", string(ev.Kind), "err", err)
			}
		}
	}
}
