package wire

import "fmt"

// Reformed tells the agent that the worker's job re-formed in process
// (ddp_agent.InProcess) after a fault: its ranks kept their processes,
// aborted and re-made their communicators and process group, and resumed
// from a healthy rank's state, instead of being restarted. Every rank
// sends it, with id 0, once the step it resumed at has completed; it is
// never answered.
type Reformed struct {
	Reform int32  // the re-formation's number within the attempt: 1 for the first
	Step   int64  // the step that failed
	Resume int64  // the step every rank resumed at: the first one not completed everywhere
	Source int32  // the rank whose model and optimizer state the others took
	Error  string // the fault as this rank saw it: its type and first line
	// Phases are the re-formation's phases on this rank, in order, each
	// with its time: abort, rendezvous, process_group, state, and
	// first_step (the resumed step, until it completed).
	Phases []Phase
}

// Phase is one phase of a Reformed and how long it took on the rank.
type Phase struct {
	Name   string
	Micros uint64
}

// Bounds on a Reformed: a real one has a handful of phases with short
// names and a one-line error.
const (
	maxReformedPhases = 16
	maxPhaseName      = 64
	maxReformedError  = 4096
)

func (m Reformed) encode(e *encoder) {
	e.i32(m.Reform)
	e.i64(m.Step)
	e.i64(m.Resume)
	e.i32(m.Source)
	e.str(m.Error)
	e.u32(uint32(len(m.Phases)))
	for _, p := range m.Phases {
		e.str(p.Name)
		e.u64(p.Micros)
	}
}

func decodeReformed(d *decoder) Reformed {
	m := Reformed{Reform: d.i32(), Step: d.i64(), Resume: d.i64(), Source: d.i32(), Error: d.str()}
	if d.err == nil && len(m.Error) > maxReformedError {
		d.fail(fmt.Sprintf("Reformed error: %d bytes, limit %d", len(m.Error), maxReformedError))
	}
	if !d.countAtMost("Reformed phases", maxReformedPhases) {
		return m
	}
	n := d.count(4 + 8)
	if n == 0 {
		return m
	}
	m.Phases = make([]Phase, 0, n)
	for range n {
		p := Phase{Name: d.str(), Micros: d.u64()}
		if d.err == nil && len(p.Name) > maxPhaseName {
			d.fail(fmt.Sprintf("Reformed phase name: %d bytes, limit %d", len(p.Name), maxPhaseName))
		}
		if d.err != nil {
			return m
		}
		m.Phases = append(m.Phases, p)
	}
	return m
}
