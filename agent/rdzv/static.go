package rdzv

import (
	"cmp"
	"context"
	"fmt"
	"time"
)

// Static is the rendezvous of a job whose nodes are fixed by the command
// line (--nnodes N --node-rank R --master-addr): no store, no elasticity.
// Each node counts its own failures, as torchrun's static backend does.
type Static struct {
	NodeRank, NNodes, NProc int
	MaxRestarts             int
	MasterAddr              string
	MasterPort              int // 0: a free port on MasterAddr for every round (one node only)
	// AgentStore: node rank 0's agent serves the workers' store; with no
	// one to agree with, every node must be told the same.
	AgentStore bool

	gen      uint64
	run      string // one node's run, made at its first round
	failures int
	offered  int // OfferStore's port
}

// Next returns the next round: the same ranks every time.
func (s *Static) Next(ctx context.Context) (*Round, error) {
	if err := ctx.Err(); err != nil {
		return nil, context.Cause(ctx)
	}
	port := cmp.Or(s.offered, s.MasterPort)
	if port == 0 {
		// A fresh port for every round, so a restart never trips over the
		// last round's store socket lingering in TIME_WAIT.
		var err error
		if port, err = freePort(s.MasterAddr); err != nil {
			return nil, err
		}
	}
	if s.NNodes == 1 && s.run == "" {
		s.run = newRunID() // the nodes of several have no one to agree on one with
	}
	r := &Round{
		Generation: s.gen, Run: s.run, GroupRank: s.NodeRank, NNodes: s.NNodes, RankOffset: s.NodeRank * s.NProc, NProc: s.NProc,
		WorldSize: s.NNodes * s.NProc, MasterAddr: s.MasterAddr, MasterPort: port, AgentStore: s.AgentStore, Restarts: s.failures,
		done: make(chan struct{}),
	}
	s.gen++
	return r, nil
}

// Fail counts a failure of round r; past MaxRestarts the job fails.
func (s *Static) Fail(_ context.Context, r *Round, reason string) error {
	s.failures++
	if s.failures > s.MaxRestarts {
		return &JobFailedError{Reason: fmt.Sprintf("%s; no restarts left (--max-restarts %d)", reason, s.MaxRestarts)}
	}
	return nil
}

// Succeed has no one to tell.
func (s *Static) Succeed(context.Context, *Round) error { return nil }

// Leave has no one to tell.
func (s *Static) Leave(string) {}

// CheckPeers finds nothing: a static job has no liveness ports to probe,
// and no round that a lost node ends.
func (s *Static) CheckPeers(context.Context) PeerCheck { return PeersAnswered }

// Running is false: a static job's nodes are all there from the start,
// and none joins later.
func (s *Static) Running(context.Context) (bool, error) { return false, nil }

// OthersDone is false: no node of a static job tells the others it
// finished.
func (s *Static) OthersDone(context.Context, *Round, time.Duration) bool { return false }

// OfferStore makes the next rounds' port for the workers' store port; 0
// goes back to MasterPort.
func (s *Static) OfferStore(port int) { s.offered = port }
