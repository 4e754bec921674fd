package telemetry

import (
	"fmt"
	"strings"
	"time"
)

// Reform is an in-process re-formation of the job's ranks
// (ddp_agent.InProcess), as the first rank of this node to report it
// tells: the ranks kept their processes and re-made their communicators
// and process group after a fault, instead of being restarted.
type Reform struct {
	Gen    uint64 // the agent's generation it happened in
	N      int    // its number within the attempt: 1 for the first
	Rank   int    // the rank that reported it
	Step   int64  // the step that failed
	Resume int64  // the step every rank resumed at
	Source int    // the rank whose state the others took
	Error  string // the fault as the reporting rank saw it
	Phases []ReformPhase
}

// ReformPhase is one phase of a re-formation and how long it took.
type ReformPhase struct {
	Name string
	Took time.Duration
}

// Took is the whole re-formation: its phases, one after another.
func (r Reform) Took() time.Duration {
	var d time.Duration
	for _, p := range r.Phases {
		d += p.Took
	}
	return d
}

// Lost is how many steps the ranks did again: the failed one and any
// before it that not every rank had completed.
func (r Reform) Lost() int64 { return max(0, r.Step-r.Resume+1) }

// String is r in one line, for the log and `ddp-agent status`.
func (r Reform) String() string {
	var phases []string
	for _, p := range r.Phases {
		phases = append(phases, fmt.Sprintf("%s %s", p.Name, ms(p.Took)))
	}
	return fmt.Sprintf("re-formation %d of generation %d: step %d failed (%s); every rank resumed at step %d with rank %d's state, %s after the fault (%s)",
		r.N, r.Gen, r.Step, r.Error, r.Resume, r.Source, ms(r.Took()), strings.Join(phases, ", "))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
