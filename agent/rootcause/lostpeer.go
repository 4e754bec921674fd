package rootcause

import (
	"strings"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/supervisor"
)

// Workers that do not use the hook leave no note of the peer that failed
// them. When a node is lost, this node's workers fail on their
// connections to it, and the first of them to exit looked like the root
// cause: "worker rank 0 exited with code 1", a restart used, the lost
// node named only after. A failure whose last words say a connection to a
// peer was lost is worth a look at the other nodes first (the agent
// probes them); when one is gone, LostPeer re-reads the blame.

// LooksLikeLostPeer reports whether e's error file or last stderr lines
// say a connection to a peer was lost.
func LooksLikeLostPeer(e *supervisor.WorkerExitError) bool {
	if e == nil || !e.Failed() {
		return false
	}
	var words []string
	if e.ErrorFile != nil {
		words = append(words, e.ErrorFile.Message)
	}
	words = append(words, e.StderrTail...)
	// What torch's backends say when a peer's process or link went away
	// under a collective, in lower case: the versions differ in case
	// (torch 2.x's TCP store says "Failed to recv, got 0 bytes").
	signs := []string{
		"connection closed by peer",   // gloo
		"connection reset by peer",    // gloo, the TCP store
		"remote process exited",       // NCCL's ncclRemoteError
		"ncclremoteerror",             // NCCL
		"broken pipe",                 // the TCP store
		"socket timeout",              // gloo
		"failed to recv, got 0 bytes", // the TCP store
	}
	for _, w := range words {
		w = strings.ToLower(w)
		for _, sign := range signs {
			if strings.Contains(w, sign) {
				return true
			}
		}
	}
	return false
}

// NoNotes reports whether b's root is this node's worker and no worker
// left a note of a peer that failed it: the case LooksLikeLostPeer is for.
func (b Blame) NoNotes() bool {
	return b.Local && b.Exit != nil && b.Note == nil && len(b.Victims) == 0
}

// lostNode is the peer a victim of a lost node names.
const lostNode = -2

// lostNode reports whether b is LostPeer's.
func (b Blame) lostNode() bool {
	return b.Root < 0 && len(b.Victims) > 0 && b.Victims[0].Note.Peer == lostNode
}

// LostPeer is b once the job moved on because another node was lost
// (reason, the new generation's): that node is the root cause, and this
// node's failed workers are its victims, their connections to it lost.
func (b Blame) LostPeer(reason string) Blame {
	out := Blame{Root: -1, At: b.At, Elsewhere: reason}
	for _, e := range append([]*supervisor.WorkerExitError{b.Exit}, b.Others...) {
		if e == nil {
			continue
		}
		out.Victims = append(out.Victims, Victim{Rank: e.Rank, Exit: e,
			Note: supervisor.PeerFailure{Peer: lostNode, Kind: "lost", Time: e.Time, Message: e.Error()}})
	}
	return out
}

// LostNodeVictims is the blame of an attempt that the job left because
// another node was lost (reason, the new generation's) before this node's
// agent had decided a failure of its own workers: the node's lease ran
// out while they were still raising on their connections to it. The
// workers that failed by cutoff, or after it on a lost connection (they
// raised before the stop and were still tearing down: a stopped worker
// dies by the signal), are that node's victims. ok: there are any.
func LostNodeVictims(outs []supervisor.Outcome, cutoff time.Time, reason string) (b Blame, ok bool) {
	failed := Blame{At: cutoff}
	for _, o := range outs { // in rank order
		if failedBy(o, cutoff) || LooksLikeLostPeer(o.Exit) {
			failed.Others = append(failed.Others, o.Exit)
		}
	}
	return failed.LostPeer(reason), len(failed.Others) > 0
}
