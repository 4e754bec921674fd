package watch

import (
	"context"
	"slices"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// Publisher is the rendezvous when it has a store for `ddp-agent status`:
// it keeps the encoded telemetry.Report as opaque data (rdzv.Membership).
type Publisher interface {
	PublishStalls(ctx context.Context, report []byte) error
}

// Reformed keeps line, an in-process re-formation of the job's ranks, as
// the last one for `ddp-agent status`.
func (s *Watch) Reformed(line string) {
	s.mu.Lock()
	s.reformed, s.dirty = line, true
	s.mu.Unlock()
}

// Publish puts what status shows into the store every 2 s while there is
// something new, until ctx ends; it never holds up the analysis.
func (s *Watch) Publish(ctx context.Context, pub Publisher) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		stragglers := s.noteStragglers()
		s.mu.Lock()
		if !s.dirty {
			s.mu.Unlock()
			continue
		}
		s.dirty = false
		r := telemetry.Report{Stalls: slices.Clone(s.stalls), Hang: s.lastHang, Reformed: s.reformed}
		s.mu.Unlock()
		for _, st := range stragglers {
			r.Stragglers = append(r.Stragglers, telemetry.ReportStraggler(st, s.Worker(st.Rank)))
		}
		b, err := r.Encode(time.Now())
		if err == nil {
			err = pub.PublishStalls(ctx, b)
		}
		if err != nil {
			s.log.Debug("publish stalls for status", "err", err)
			s.mu.Lock()
			s.dirty = true // again at the next tick
			s.mu.Unlock()
		}
	}
}
