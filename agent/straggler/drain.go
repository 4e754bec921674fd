package straggler

import (
	"context"
	"fmt"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
)

// drainCheck is what decides whether this node may drain itself for a
// straggler: whether the rank is its own, and how many nodes the job has,
// needs at least, and has waiting as spares (read only when the other
// numbers do not decide).
type drainCheck struct {
	Rank   int
	Local  bool
	Owner  string // who runs the rank when another node does: "node node-b", or "another node"
	Nodes  int    // in this generation, this one included
	Min    int    // --nnodes MIN
	Spares int    // nodes waiting in the rendezvous to take a place
}

// needsSpares reports whether the drain hangs on a spare: without this
// node the job would have fewer than MIN nodes.
func (d drainCheck) needsSpares() bool { return d.Local && d.Nodes-1 < d.Min }

// refusal is why this node must not drain itself, or "" when it may: the
// straggler is another node's (only that node's agent can take it out of
// the job), or the job would drop below MIN nodes with no spare to take
// this one's place.
func (d drainCheck) refusal() string {
	switch {
	case !d.Local:
		return fmt.Sprintf("not drained here: rank %d runs on %s, whose agent drains it (it reads the stragglers this agent publishes)", d.Rank, d.Owner)
	case d.Nodes-1 >= d.Min, d.Spares > 0:
		return ""
	}
	return fmt.Sprintf("drain refused: %d nodes, MIN %d, no spare", d.Nodes, d.Min)
}

// spareTimeout bounds the store read that counts the spares.
const spareTimeout = 5 * time.Second

// tryDrain drains this node for se when the straggler is one of its ranks
// and the job can go on without it; otherwise it says why not and only
// logs.
func (p *Policy) tryDrain(at Attempt, se *Error, attrs []any) {
	dc := drainCheck{Rank: se.Straggler.Rank, Local: at.local(se.Straggler.Rank), Nodes: at.Nodes, Min: p.minNodes}
	if !dc.Local {
		dc.Owner = "another node"
		if h := p.owner(dc.Rank); h != "" {
			dc.Owner = "node " + h
		}
	}
	if !dc.needsSpares() || p.spares == nil { // without spares (fixed nodes) nobody can take this one's place
		p.drainOr(dc, se, attrs)
		return
	}
	p.background(func() {
		ctx, cancel := context.WithTimeout(p.runCtx, spareTimeout)
		defer cancel()
		n, err := p.spares(ctx)
		if p.runCtx.Err() != nil { // the run ended meanwhile: nothing left to drain
			return
		}
		if err != nil {
			p.log.Warn("count the spare nodes in the rendezvous: taken as none", "err", err)
		}
		dc.Spares = n
		p.drainOr(dc, se, attrs)
	})
}

// drainOr drains this node when dc allows it, and logs the refusal
// otherwise.
func (p *Policy) drainOr(dc drainCheck, se *Error, attrs []any) {
	if why := dc.refusal(); why != "" {
		p.logOnly(se, why, attrs)
		return
	}
	p.log.Error(fmt.Sprintf("%s; action drain: this node leaves the job (%d nodes, MIN %d, %d spare(s))",
		se.Finding(), dc.Nodes, dc.Min, max(dc.Spares, 0)), attrs...)
	p.drain(se)
}

// countSpares counts the nodes that wait in the job's rendezvous as
// spares (live, not members of the running generation: the job was full
// when they came), as `ddp-agent status` would show them; these reads are
// rare (a drain's spare count).
func countSpares(status func(context.Context) (*rdzv.Status, error)) func(context.Context) (int, error) {
	return func(ctx context.Context) (int, error) {
		st, err := status(ctx)
		if err != nil {
			return 0, fmt.Errorf("count spares: %w", err)
		}
		n := 0
		for _, ns := range st.Nodes {
			if ns.Role == rdzv.RoleSpare {
				n++
			}
		}
		return n, nil
	}
}
