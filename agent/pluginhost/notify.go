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
			timedOut := outlived(ctx, err)
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
				return p.exitedError()
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

// outlived reports whether a Notify call that returned err outlived its
// deadline. The plugin's side of the call may see the deadline pass
// first, and its DEADLINE_EXCEEDED arrive while ctx has not yet ended
// (plugins.RPCError): counting ctx alone, a notifier that hung on every
// call was seldom seen hung.
func outlived(ctx context.Context, err error) bool {
	return errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded)
}
