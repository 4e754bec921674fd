package watch

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// noteStragglers logs each new persistent straggler of the attempt once
// and returns them all, by global rank.
func (s *Watch) noteStragglers() []telemetry.Straggler {
	at := s.current()
	if at == nil || at.an == nil {
		return nil
	}
	all := at.an.Stragglers()
	for i := range all {
		all[i].Rank += at.base
		rank := all[i].Rank
		s.mu.Lock()
		seen := s.known[rank]
		if s.known == nil {
			s.known = map[int]bool{}
		}
		s.known[rank] = true
		s.dirty = s.dirty || !seen
		s.mu.Unlock()
		if !seen {
			w := s.Worker(rank)
			msg := fmt.Sprintf("persistent straggler: rank %s arrived last in %d of the last %d steps", s.describe(rank), all[i].Last, all[i].Steps)
			if st := s.gpuState(w); st != "" {
				msg += "; its GPU " + w.GPU + ": " + st
			}
			s.log.Warn(msg, "rank", rank, "gpu", w.GPU)
		}
	}
	return all
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
