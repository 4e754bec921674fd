package stall

import (
	"cmp"
	"slices"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// history tallies, for the last steps of a generation, who arrived last in
// each step's collectives, to find ranks that are late step after step.
//
// A step's straggler is the rank that arrived last, meaningfully late, in
// more than half of the step's complete collectives. The number of buckets
// varies from step to step (DDP rebuilds its buckets after the first
// iteration), and records come out of order, so no collective marks the
// end of a step: the tally is kept per step number and read when asked.
//
// Meaningfully late (more than 1ms and more than a tenth of the bucket's
// median duration): in a balanced job some rank is always last by a few
// microseconds of jitter, and counting those would make a persistent
// straggler of whichever rank is on the slowest host. Steps without such a
// rank still count as steps looked at, so a few late steps among many
// balanced ones do not add up to a majority.
type history struct {
	size  int
	steps map[uint64]*stepTally
}

type stepTally struct {
	collectives int         // complete collectives of the step
	last        map[int]int // rank → collectives it was meaningfully last in
}

func newHistory(size int) history {
	return history{size: size, steps: make(map[uint64]*stepTally, size+1)}
}

// observe records a complete collective of step whose last arrival was
// rank, meaningfully late or not. Only the size highest steps are kept; a
// collective of an older step than all of them is left out.
func (h *history) observe(step uint64, rank int, late bool) {
	t := h.steps[step]
	if t == nil {
		if len(h.steps) >= h.size {
			lowest := step
			for s := range h.steps {
				lowest = min(lowest, s)
			}
			if lowest == step {
				return // older than every step kept
			}
			delete(h.steps, lowest)
		}
		t = &stepTally{}
		h.steps[step] = t
	}
	t.collectives++
	if late {
		if t.last == nil {
			t.last = make(map[int]int)
		}
		t.last[rank]++
	}
}

// stragglers returns the ranks that were the straggler of more than share
// of the steps kept, most steps first; nil while fewer than minSteps steps
// are kept.
func (h *history) stragglers(share float64, minSteps int) []telemetry.Straggler {
	n := len(h.steps)
	if n < minSteps {
		return nil
	}
	count := make(map[int]int)
	for _, t := range h.steps {
		for rank, c := range t.last {
			if 2*c > t.collectives { // at most one rank per step
				count[rank]++
			}
		}
	}
	var out []telemetry.Straggler
	for rank, c := range count {
		if float64(c) > share*float64(n) {
			out = append(out, telemetry.Straggler{Rank: rank, Last: c, Steps: n})
		}
	}
	slices.SortFunc(out, func(a, b telemetry.Straggler) int {
		return cmp.Or(cmp.Compare(b.Last, a.Last), cmp.Compare(a.Rank, b.Rank))
	})
	return out
}
