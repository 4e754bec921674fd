package pluginhost

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins/detector"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

// healthyRun: a plugin that ran this long before failing starts its
// backoff again from the first wait.
const healthyRun = time.Minute

// The kinds a runner's plugin can have; unknown until it first starts.
const (
	kindUnknown int32 = iota
	kindDetector
	kindNotifier
)

// runner keeps one --plugin running: it starts the process, serves its
// kind (a detector's watch, a notifier's deliveries) and, when the
// process crashes or hangs, reports it and starts it again with backoff.
type runner struct {
	h    *Host
	sp   Spec
	kind atomic.Int32
	up   atomic.Bool // a process serves now

	q                          chan notifier.Event
	pending                    atomic.Int64 // queued or in delivery
	delivered, failed, dropped atomic.Int64
	warnedDrop, warnedFail     atomic.Bool
}

func newRunner(h *Host, sp Spec) *runner {
	return &runner{h: h, sp: sp, q: make(chan notifier.Event, h.cfg.QueueSize)}
}

// run serves the plugin until the host closes. p is the process Start
// launched (nil when it failed with err). Every failure, to start or
// while serving, takes the one path below: told, then a backoff.
func (r *runner) run(p *proc, sched detector.Schedule, err error) {
	fails, toldRefused := 0, false
	for {
		if p == nil && err == nil {
			if p, sched, err = r.h.start(r.h.ctx, r.sp); err == nil {
				toldRefused = false
				if fails > 0 {
					r.h.log.Info("plugin restarted", "plugin", r.sp.Name, "after_failures", fails)
				}
			}
		}
		if err == nil {
			began := time.Now()
			err = r.serve(p, sched)
			if time.Since(began) > healthyRun {
				fails = 0
			}
		}
		p = nil
		if r.h.ctx.Err() != nil {
			return
		}
		fails++
		wait := restartDelay(fails, r.h.cfg.FirstBackoff, r.h.cfg.MaxBackoff)
		var refused *RefusedError
		if errors.As(err, &refused) {
			// Replaced or removed since the agent started: the job goes
			// on; the plugin is tried again, quietly, in case it comes back.
			wait = r.h.cfg.MaxBackoff
			if !toldRefused {
				r.h.pluginFailed(r.sp, err, wait)
			}
			toldRefused = true
		} else {
			r.h.pluginFailed(r.sp, err, wait)
		}
		if !r.h.sleep(wait) {
			return
		}
		err = nil
	}
}

// serve runs a started plugin's kind (a detector's watch, a notifier's
// deliveries) until it fails or the host closes, then stops the process.
func (r *runner) serve(p *proc, sched detector.Schedule) error {
	var err error
	r.up.Store(true)
	if p.det != nil {
		r.kind.Store(kindDetector)
		r.discard()
		err = r.h.watch(r.sp, p, sched)
	} else {
		r.kind.Store(kindNotifier)
		err = r.deliver(p)
	}
	r.up.Store(false)
	if p.exited() {
		// Its stderr is read to its end by now; a plugin not served by the
		// SDK's Serve writes its os.Stderr over go-plugin's stream, which trails.
		time.Sleep(100 * time.Millisecond)
	}
	err = p.stderr.wrap(err)
	p.kill()
	return err
}

// enqueue queues ev for a notifier (or a plugin not yet started, which
// may be one); never blocks: a full queue drops the event and counts it.
func (r *runner) enqueue(ev notifier.Event) {
	if r.kind.Load() == kindDetector {
		return
	}
	r.pending.Add(1)
	select {
	case r.q <- ev:
	default:
		r.pending.Add(-1)
		r.dropped.Add(1)
		// A plugin that never started may be a detector: nothing to say.
		if r.kind.Load() == kindNotifier && !r.warnedDrop.Swap(true) {
			r.h.log.Warn("notifier behind: its queue is full, events are dropped (counted; the total at exit)",
				"plugin", r.sp.Name, "queue", cap(r.q))
		}
	}
}

// discard empties the queue of a plugin that turned out a detector.
func (r *runner) discard() {
	for {
		select {
		case <-r.q:
			r.pending.Add(-1)
		default:
			return
		}
	}
}

// drain waits until a serving notifier has delivered what it holds, or
// until deadline.
func (r *runner) drain(deadline time.Time) {
	for r.up.Load() && r.kind.Load() == kindNotifier && r.pending.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}

// summary logs what a notifier delivered, failed and dropped.
func (r *runner) summary() {
	if r.kind.Load() != kindNotifier { // a detector, or a plugin that never started (its failures were logged)
		return
	}
	lost := r.failed.Load() + r.dropped.Load() + r.pending.Load()
	log := r.h.log.Info
	if lost > 0 {
		log = r.h.log.Warn
	}
	log("notifier events", "plugin", r.sp.Name, "delivered", r.delivered.Load(), "failed", r.failed.Load(),
		"dropped", r.dropped.Load(), "undelivered_at_exit", r.pending.Load())
}
