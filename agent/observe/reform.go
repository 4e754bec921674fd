package observe

import (
	"strconv"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
	"github.com/ddp-agent/ddp-agent/wire"
)

// Every rank of a job that re-forms in process (ddp_agent.InProcess)
// reports it over the control socket once the step it resumed at has
// completed. Each report is logged (its phases are the rank's own); the
// re-formation itself, at the first report of it on this node, is
// exported (a trace and metrics), kept for `ddp-agent status` and told to
// the notifiers.

// reforms remembers which re-formations of the current generation were
// told already.
type reforms struct {
	mu   sync.Mutex
	gen  uint64
	told map[int32]bool
}

// first reports whether re-formation n of generation gen is news, and
// remembers it. A later generation forgets the earlier one's: the numbers
// start again with each attempt's workers.
func (r *reforms) first(gen uint64, n int32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.told == nil || gen != r.gen {
		r.gen, r.told = gen, map[int32]bool{}
	}
	if r.told[n] {
		return false
	}
	r.told[n] = true
	return true
}

// reform is m, reported by rank in generation gen, as telemetry has it.
func reform(gen uint64, rank int, m wire.Reformed) telemetry.Reform {
	rf := telemetry.Reform{Gen: gen, N: int(m.Reform), Rank: rank, Step: m.Step, Resume: m.Resume, Source: int(m.Source), Error: m.Error}
	for _, p := range m.Phases {
		rf.Phases = append(rf.Phases, telemetry.ReformPhase{Name: p.Name, Took: time.Duration(p.Micros) * time.Microsecond})
	}
	return rf
}

// Reformed takes rank's report m, sent in generation gen (control.PIDAdmission.OnReformed).
func (o *Observer) Reformed(rank int, gen uint64, m wire.Reformed) {
	rf := reform(gen, rank, m)
	attrs := []any{"rank", rank, "generation", gen, "reform", rf.N, "step", rf.Step, "resume", rf.Resume,
		"source", rf.Source, "lost_steps", rf.Lost(), "took", rf.Took().Round(100 * time.Microsecond)}
	for _, p := range rf.Phases {
		attrs = append(attrs, p.Name, p.Took.Round(100*time.Microsecond))
	}
	o.log.Info("re-formed in process: the workers kept their processes", append(attrs, "error", rf.Error)...)
	if !o.reforms.first(gen, m.Reform) {
		return
	}
	o.Exp.Reformed(rf)
	line := rf.String()
	o.Watch.Reformed(line)
	if o.notify != nil {
		details := map[string]string{"reform": strconv.Itoa(rf.N), "step": strconv.FormatInt(rf.Step, 10),
			"resume": strconv.FormatInt(rf.Resume, 10), "source": strconv.Itoa(rf.Source),
			"lost_steps": strconv.FormatInt(rf.Lost(), 10), "took_ms": strconv.FormatInt(rf.Took().Milliseconds(), 10),
			"error": rf.Error}
		for _, p := range rf.Phases {
			details[p.Name+"_ms"] = strconv.FormatFloat(float64(p.Took)/float64(time.Millisecond), 'f', 1, 64)
		}
		o.notify(notifier.Event{Kind: notifier.Reformed, Generation: gen, Rank: rank, Message: line, Details: details})
	}
}
