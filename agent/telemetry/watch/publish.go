package watch

import (
	"context"
	"slices"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
)

// Publisher is the rendezvous when it has a store for `ddp-agent status`.
type Publisher interface {
	PublishStalls(context.Context, rdzv.NodeStalls) error
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
		ns := rdzv.NodeStalls{Stalls: slices.Clone(s.stalls), Hang: s.lastHang}
		s.mu.Unlock()
		for _, st := range stragglers {
			w := s.Worker(st.Rank)
			ns.Stragglers = append(ns.Stragglers, rdzv.StragglerInfo{Rank: st.Rank, Last: st.Last, Steps: st.Steps, Host: w.Host, GPU: w.GPU,
				LateMS: float64(st.Late) / float64(time.Millisecond), Share: st.Share, Cause: string(st.Cause), Evidence: st.Evidence})
		}
		if err := pub.PublishStalls(ctx, ns); err != nil {
			s.log.Debug("publish stalls for status", "err", err)
			s.mu.Lock()
			s.dirty = true // again at the next tick
			s.mu.Unlock()
		}
	}
}
