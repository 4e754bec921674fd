package comm

import (
	"encoding/json"
	"math"

	"github.com/ddp-agent/ddp-agent/shim/status"
	"github.com/ddp-agent/ddp-agent/wire"
)

// reformedJSON is ddpshim_reformed's argument, as ddp_agent.InProcess
// writes it: phase times in milliseconds, in order.
type reformedJSON struct {
	Reform int32            `json:"reform"`
	Step   int64            `json:"step"`
	Resume int64            `json:"resume"`
	Source int32            `json:"source"`
	Error  string           `json:"error"`
	Phases []reformedPhaseJ `json:"phases"`
}

type reformedPhaseJ struct {
	Name string  `json:"name"`
	MS   float64 `json:"ms"`
}

// ParseReformed reads ddpshim_reformed's JSON into the message the agent
// gets.
func ParseReformed(s string) (wire.Reformed, error) {
	var j reformedJSON
	if err := json.Unmarshal([]byte(s), &j); err != nil {
		return wire.Reformed{}, status.Errorf(status.Invalid, "reformed: %v", err)
	}
	m := wire.Reformed{Reform: j.Reform, Step: j.Step, Resume: j.Resume, Source: j.Source, Error: j.Error}
	for _, p := range j.Phases {
		if p.Name == "" || math.IsNaN(p.MS) || p.MS < 0 || p.MS > 1e12 {
			return wire.Reformed{}, status.Errorf(status.Invalid, "reformed: phase %q of %v ms", p.Name, p.MS)
		}
		m.Phases = append(m.Phases, wire.Phase{Name: p.Name, Micros: uint64(math.Round(p.MS * 1e3))})
	}
	return m, nil
}

// Reformed tells the agent (or the sidecar) that watches this
// communicator's rank that the job re-formed in process. Without one
// (torchrun alone) there is no one to tell, and it does nothing; a lost
// connection or a slow agent costs at most the events' write timeout.
func (c *Comm) Reformed(m wire.Reformed) error {
	var err error
	switch {
	case c.agent != nil:
		err = c.agent.SendReformed(m)
	case c.side != nil:
		err = c.side.SendReformed(m)
	}
	if err != nil {
		return status.Errorf(status.Unavailable, "tell the agent of re-formation %d: %w", m.Reform, err)
	}
	return nil
}
