package watch

import (
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
	look := at.stragglers()
	if look.changed {
		s.mu.Lock()
		s.dirty = true
		s.mu.Unlock()
	}
	for _, st := range look.named {
		switch old, ok := look.was[st.Rank]; {
		case !ok:
			s.logStraggler(at, st, look.gpuState[st.Rank])
		case old != st.Cause:
			s.log.Warn(fmt.Sprintf("persistent straggler: rank %s: cause now %s (was %s): %s", at.describe(st.Rank), st.Cause, old, st.Evidence),
				"rank", st.Rank, "cause", string(st.Cause))
		}
	}
	for _, r := range look.gone {
		s.log.Info(fmt.Sprintf("rank %s is no longer a persistent straggler", at.describe(r)), "rank", r)
	}
	if s.exp != nil {
		s.exp.Stragglers(at.gen, look.named)
	}
	if s.cfg.OnStragglers != nil {
		s.cfg.OnStragglers(slices.Clone(look.named))
	}
	return look.named
}

// stragglerLook is what one look at the persistent stragglers found.
type stragglerLook struct {
	named    []telemetry.Straggler   // by global rank, their causes set
	gpuState map[int]string          // each named one's GPU state as read, for its line
	was      map[int]telemetry.Cause // those named at the look before, and their causes
	gone     []int                   // of those, the ones no longer named
	changed  bool                    // one is new, gone, or has another cause
}

// stragglers names the attempt's persistent stragglers now, with their
// causes (stall.Explain, from the analyzer's phases and the evidence),
// and what changed since the look before.
func (at *attempt) stragglers() stragglerLook {
	all := at.an.Stragglers()
	look := stragglerLook{named: all, gpuState: make(map[int]string, len(all))}
	now := make(map[int]telemetry.Cause, len(all))
	for i := range all {
		st := &all[i]
		st.Rank += at.base
		ev := at.evidenceFor(st.Rank)
		st.Cause, st.Evidence = stall.Explain(*st, ev.gpuSlow, ev.hostSlow)
		now[st.Rank] = st.Cause
		look.gpuState[st.Rank] = ev.gpuState
	}
	at.mu.Lock()
	look.was, at.known = at.known, now
	at.mu.Unlock()
	for r, c := range now {
		if old, ok := look.was[r]; !ok || old != c {
			look.changed = true
		}
	}
	for r := range look.was {
		if _, ok := now[r]; !ok {
			look.gone = append(look.gone, r)
			look.changed = true
		}
	}
	slices.Sort(look.gone)
	return look
}

// logStraggler is the paragraph a person can act on: who, by how much, how
// sure, at what cost, and why.
func (s *Watch) logStraggler(at *attempt, st telemetry.Straggler, gpuState string) {
	w := at.worker(st.Rank)
	msg := fmt.Sprintf("persistent straggler: rank %s held the others back in %d of the last %d steps, "+
		"by %s (median), %.1f%% of the job's time (median step %s); the job's noise band is %s, and a balanced job "+
		"would do this with probability %.1g; cause %s: %s",
		at.describe(st.Rank), st.Last, st.Steps, seconds(st.Late), 100*st.Share, seconds(st.StepTime),
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
func (at *attempt) evidenceFor(rank int) evidence {
	at.mu.Lock()
	ev, fresh := at.evid, time.Since(at.evidAt) < evidenceEvery
	at.mu.Unlock()
	if _, ok := ev[rank]; !ok || !fresh {
		ev = at.readEvidence()
		at.mu.Lock()
		at.evid, at.evidAt = ev, time.Now()
		at.mu.Unlock()
	}
	mine := ev[rank]
	if mine.gpuSlow != "" {
		others, slowed := 0, 0
		for r, e := range ev {
			if r != rank && at.worker(r).GPU != "" {
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
func (at *attempt) readEvidence() map[int]evidence {
	at.mu.Lock()
	ws := make([]telemetry.Worker, 0, len(at.workers))
	for _, w := range at.workers {
		ws = append(ws, w)
	}
	at.mu.Unlock()
	out := make(map[int]evidence, len(ws))
	for _, w := range ws {
		switch {
		case !at.isLocal(w.Rank):
			out[w.Rank] = evidence{gpuState: w.GPUState, gpuSlow: w.GPUSlowdown, hostSlow: w.HostSlowdown}
		case at.readLocal != nil:
			out[w.Rank] = at.readLocal(w)
		default:
			out[w.Rank] = evidence{}
		}
	}
	return out
}

// localEvidence reads the evidence of w, a worker of this node, now.
func (s *Watch) localEvidence(w telemetry.Worker) evidence {
	var ev evidence
	if s.cfg.ReadHost != nil {
		ev.hostSlow = s.cfg.ReadHost(w.Rank)
	}
	if w.GPU != "" && s.cfg.ReadGPU != nil {
		if g, err := s.cfg.ReadGPU(w.GPU); err != nil {
			ev.gpuState = "state unknown (" + err.Error() + ")"
		} else {
			ev.gpuState, ev.gpuSlow = g.State, g.Slowdown
		}
	}
	return ev
}

// withEvidence is ws, workers of this node, with their GPUs' and hosts'
// evidence read now, for the leader (plan.go's sendStates).
func (s *Watch) withEvidence(ws []telemetry.Worker) []telemetry.Worker {
	for i := range ws {
		ev := s.localEvidence(ws[i])
		ws[i].HostSlowdown, ws[i].GPUSlowdown = ev.hostSlow, ev.gpuSlow
		if ev.gpuState != "" {
			ws[i].GPUState = ev.gpuState
		}
	}
	return ws
}
