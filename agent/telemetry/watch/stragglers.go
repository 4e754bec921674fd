package watch

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/stall"
)

// noteStragglers logs each rank that becomes a persistent straggler, each
// whose cause changes, and each that stops being one, and returns those
// named now, by global rank, their causes set.
func (s *Watch) noteStragglers() []telemetry.Straggler {
	at := s.current()
	if at == nil || at.an == nil {
		return nil
	}
	all := at.an.Stragglers()
	now := make(map[int]telemetry.Cause, len(all))
	gpuStates := make(map[int]string, len(all))
	for i := range all {
		st := &all[i]
		st.Rank += at.base
		ev := s.evidenceFor(at, st.Rank)
		st.Cause, st.Evidence = stall.Explain(*st, ev.gpuSlow, ev.hostSlow)
		now[st.Rank] = st.Cause
		gpuStates[st.Rank] = ev.gpuState
	}
	s.mu.Lock()
	was := s.known
	s.known = now
	for r, c := range now {
		if old, ok := was[r]; !ok || old != c {
			s.dirty = true
		}
	}
	for r := range was {
		s.dirty = s.dirty || now[r] == ""
	}
	s.mu.Unlock()
	for _, st := range all {
		switch old, ok := was[st.Rank]; {
		case !ok:
			s.logStraggler(st, gpuStates[st.Rank])
		case old != st.Cause:
			s.log.Warn(fmt.Sprintf("persistent straggler: rank %s: cause now %s (was %s): %s", s.describe(st.Rank), st.Cause, old, st.Evidence),
				"rank", st.Rank, "cause", string(st.Cause))
		}
	}
	for r := range was {
		if _, ok := now[r]; !ok {
			s.log.Info(fmt.Sprintf("rank %s is no longer a persistent straggler", s.describe(r)), "rank", r)
		}
	}
	if s.exp != nil {
		s.exp.Stragglers(at.gen, all)
	}
	if s.onStraggler != nil {
		s.onStraggler(slices.Clone(all))
	}
	return all
}

// logStraggler is the paragraph a person can act on: who, by how much, how
// sure, at what cost, and why.
func (s *Watch) logStraggler(st telemetry.Straggler, gpuState string) {
	w := s.Worker(st.Rank)
	msg := fmt.Sprintf("persistent straggler: rank %s held the others back in %d of the last %d steps, "+
		"by %s (median), %.1f%% of the %s step time; the job's noise band is %s, and a balanced job "+
		"would do this with probability %.1g; cause %s: %s",
		s.describe(st.Rank), st.Last, st.Steps, seconds(st.Late), 100*st.Share, seconds(st.StepTime),
		seconds(st.Noise), st.P, st.Cause, st.Evidence)
	if gpuState != "" {
		msg += "; its GPU " + w.GPU + ": " + gpuState
	}
	s.log.Warn(msg, "rank", st.Rank, "gpu", w.GPU, "late", st.Late.Round(time.Microsecond),
		"share", fmt.Sprintf("%.3f", st.Share), "p", st.P, "cause", string(st.Cause))
}

// evidence is what a rank's node shows: its GPU's state and slowdown
// (NVML), and its host's slowdown.
type evidence struct {
	gpuState, gpuSlow, hostSlow string
}

// evidenceEvery bounds how often the evidence of every rank is read again
// while stragglers are named: NVML's calls can block while a GPU is in
// trouble, and a GPU's throttling does not come and go by the second.
const evidenceEvery = 10 * time.Second

// evidenceFor returns rank's evidence, read afresh for all ranks at most
// every evidenceEvery. A GPU slowdown counts only when most of the other
// ranks' GPUs show none: a slowdown every GPU shares (a hot machine room,
// one power cap on all) does not explain why one rank is behind.
func (s *Watch) evidenceFor(at *attempt, rank int) evidence {
	s.mu.Lock()
	ev, fresh := s.evid, time.Since(s.evidAt) < evidenceEvery
	s.mu.Unlock()
	if _, ok := ev[rank]; !ok || !fresh {
		ev = s.readEvidence(at)
		s.mu.Lock()
		s.evid, s.evidAt = ev, time.Now()
		s.mu.Unlock()
	}
	mine := ev[rank]
	if mine.gpuSlow != "" {
		others, slowed := 0, 0
		for r, e := range ev {
			if r != rank && s.Worker(r).GPU != "" {
				others++
				if e.gpuSlow != "" {
					slowed++
				}
			}
		}
		if others > 0 && 2*slowed >= others {
			mine.gpuSlow = ""
		}
	}
	return mine
}

// readEvidence reads every known rank's evidence: here for this node's
// ranks, else as their agent last sent it.
func (s *Watch) readEvidence(at *attempt) map[int]evidence {
	s.mu.Lock()
	ws := make([]telemetry.Worker, 0, len(s.workers))
	for _, w := range s.workers {
		ws = append(ws, w)
	}
	s.mu.Unlock()
	out := make(map[int]evidence, len(ws))
	for _, w := range ws {
		if w.Rank < at.offset || w.Rank >= at.offset+len(at.local) {
			out[w.Rank] = evidence{gpuState: w.GPUState, gpuSlow: w.GPUSlowdown, hostSlow: w.HostSlowdown}
			continue
		}
		out[w.Rank] = s.localEvidence(w)
	}
	return out
}

// localEvidence reads the evidence of w, a worker of this node, now.
func (s *Watch) localEvidence(w telemetry.Worker) evidence {
	var ev evidence
	if s.readHost != nil {
		ev.hostSlow = s.readHost(w.Rank)
	}
	if w.GPU != "" && s.readGPU != nil {
		if g, err := s.readGPU(w.GPU); err != nil {
			ev.gpuState = "state unknown (" + err.Error() + ")"
		} else {
			ev.gpuState, ev.gpuSlow = g.State, g.Slowdown
		}
	}
	return ev
}

// stateEvery is how often a follower sends its workers' GPU and host
// states.
const stateEvery = 10 * time.Second

// sendStates is a follower's side of persistent stragglers: the leader
// cannot read this node's NVML or /proc, so the workers go to it again
// every stateEvery with their GPUs' states and slowdowns, until ctx ends.
func (s *Watch) sendStates(ctx context.Context, fwd forwarder, local []telemetry.Worker) {
	if s.readGPU == nil && s.readHost == nil {
		return
	}
	t := time.NewTicker(stateEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ws := slices.Clone(local)
		for i := range ws {
			ev := s.localEvidence(ws[i])
			ws[i].HostSlowdown, ws[i].GPUSlowdown = ev.hostSlow, ev.gpuSlow
			if ev.gpuState != "" {
				ws[i].GPUState = ev.gpuState
			}
		}
		fwd.SendWorkers(ws)
	}
}
