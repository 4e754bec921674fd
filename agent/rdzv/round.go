package rdzv

import (
	"sync"
)

// Round is one node's part in one generation of the job.
type Round struct {
	Generation uint64
	// Run names this run of the job (State.Run), the same on every node;
	// "" where the nodes have nothing to agree on it through (Static with
	// several nodes) or the state predates it.
	Run        string
	GroupRank  int
	NNodes     int
	RankOffset int
	NProc      int
	WorldSize  int
	MasterAddr string
	MasterPort int
	// AgentStore: the agent of group rank 0 serves the workers' store at
	// MasterAddr:MasterPort, not rank 0's worker.
	AgentStore bool
	Restarts   int // faults so far: TORCHELASTIC_RESTART_COUNT
	// MasterNode is group rank 0's node id ("" for the static backend).
	MasterNode string
	// Carry: the last round's workers may carry on into this one in
	// process, and new workers join them (State.Carry).
	Carry bool
	// PlainNodes: the members without --spares where others have it
	// (State.PlainNodes).
	PlainNodes string

	once   sync.Once
	done   chan struct{}
	ending RoundEnd
	reason string

	state    *State // the Running state of this round, and its mod revision
	stateMod int64
}

func newRound(st *State, m Member) *Round {
	return &Round{
		Generation: st.Generation, Run: st.Run, GroupRank: m.GroupRank, NNodes: st.Nodes(), RankOffset: m.RankOffset, NProc: m.NProc,
		WorldSize: st.WorldSize, MasterAddr: st.MasterAddr, MasterPort: st.MasterPort, AgentStore: st.AgentStore, Restarts: st.Failures,
		MasterNode: st.MasterNode, Carry: st.Carry, PlainNodes: st.PlainNodes, done: make(chan struct{}),
	}
}

// Done is closed when the job left this generation: a fault or a scale
// event elsewhere, or this node was cut off.
func (r *Round) Done() <-chan struct{} { return r.done }

// Reason says why the round ended, for people; "" while it runs.
func (r *Round) Reason() string {
	select {
	case <-r.done:
		return r.reason
	default:
		return ""
	}
}

// End says why the round ended, for the agent to branch on; the zero
// RoundEnd while it runs.
func (r *Round) End() RoundEnd {
	select {
	case <-r.done:
		return r.ending
	default:
		return RoundEnd{}
	}
}

// finish ends the round, why said twice: typed and in words. Only the
// first call counts.
func (r *Round) finish(end RoundEnd, reason string) {
	r.once.Do(func() {
		r.ending, r.reason = end, reason
		close(r.done)
	})
}

// Stop ends the round's watch; the agent calls it when it is done with the
// round for its own reasons.
func (r *Round) Stop() { r.finish(RoundEnd{Kind: EndStopped}, "stopped by this agent") }

// startRound returns the round of state st for this node and starts
// watching it: the round ends (Done) when the job moves to another
// generation, and this node moves the job on itself when another member is
// lost.
func (e *Membership) startRound(st *State, m Member, mod, read int64) *Round {
	e.mu.Lock()
	e.lastGen = st.Generation + 1
	e.mu.Unlock()
	r := newRound(st, m)
	r.state, r.stateMod = st, mod
	_, lost := e.leaseChan()
	go e.watchRound(e.bg, r, read, lost)
	return r
}
