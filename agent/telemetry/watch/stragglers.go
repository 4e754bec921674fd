package watch

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// noteStragglers logs each rank that becomes a persistent straggler, and
// each that stops being one, and returns those named now, by global rank.
func (s *Watch) noteStragglers() []telemetry.Straggler {
	at := s.current()
	if at == nil || at.an == nil {
		return nil
	}
	all := at.an.Stragglers()
	now := make(map[int]bool, len(all))
	for i := range all {
		all[i].Rank += at.base
		now[all[i].Rank] = true
	}
	s.mu.Lock()
	was := s.known
	s.known = now
	for r := range now {
		s.dirty = s.dirty || !was[r]
	}
	for r := range was {
		s.dirty = s.dirty || !now[r]
	}
	s.mu.Unlock()
	for _, st := range all {
		if !was[st.Rank] {
			s.logStraggler(st)
		}
	}
	for r := range was {
		if !now[r] {
			s.log.Info(fmt.Sprintf("rank %s is no longer a persistent straggler", s.describe(r)), "rank", r)
		}
	}
	return all
}

// logStraggler is the paragraph a person can act on: who, by how much, how
// sure, at what cost.
func (s *Watch) logStraggler(st telemetry.Straggler) {
	w := s.Worker(st.Rank)
	msg := fmt.Sprintf("persistent straggler: rank %s held the others back in %d of the last %d steps, "+
		"by %s (median), %.1f%% of the %s step time; the job's noise band is %s, and a balanced job "+
		"would do this with probability %.1g",
		s.describe(st.Rank), st.Last, st.Steps, seconds(st.Late), 100*st.Share, seconds(st.StepTime),
		seconds(st.Noise), st.P)
	if gs := s.gpuState(w); gs != "" {
		msg += "; its GPU " + w.GPU + ": " + gs
	}
	s.log.Warn(msg, "rank", st.Rank, "gpu", w.GPU, "late", st.Late.Round(time.Microsecond),
		"share", fmt.Sprintf("%.3f", st.Share), "p", st.P)
}

// gpuState is what NVML says of w's GPU now, when it is on this node.
func (s *Watch) gpuState(w telemetry.Worker) string {
	if w.GPU == "" || s.readGPU == nil {
		return ""
	}
	at := s.current()
	if at == nil || w.Rank < at.offset || w.Rank >= at.offset+len(at.local) {
		return w.GPUState // on another node: as its agent last read it
	}
	st, err := s.readGPU(w.GPU)
	if err != nil {
		return "state unknown (" + err.Error() + ")"
	}
	return st
}

// gpuStateEvery is how often a follower sends its workers' GPU states.
const gpuStateEvery = 10 * time.Second

// sendGPUStates is a follower's side of persistent stragglers: the leader
// cannot read this node's NVML, so the workers go to it again every
// gpuStateEvery with their GPUs' states, until ctx ends.
func (s *Watch) sendGPUStates(ctx context.Context, fwd forwarder, local []telemetry.Worker) {
	if s.readGPU == nil {
		return
	}
	t := time.NewTicker(gpuStateEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ws := slices.Clone(local)
		for i := range ws {
			if ws[i].GPU == "" {
				continue
			}
			if st, err := s.readGPU(ws[i].GPU); err == nil {
				ws[i].GPUState = st
			}
		}
		fwd.SendWorkers(ws)
	}
}
