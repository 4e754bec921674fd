package rdzv

import "fmt"

// This file names why a round ends, as a value: the agent branches on the
// kind, and the reason beside it is the sentence for people. Every move of
// the job to a new generation is built here, from plain values, so the
// pairing of kind and sentence is tested without a store.

// EndKind is what ended a round.
type EndKind string

const (
	// EndUnknown: the state says nothing typed (written by an agent from
	// before RoundEnd, or by hand); the agent takes it for a restart.
	EndUnknown EndKind = ""
	// EndRestart: a fault on RoundEnd.Node (its workers failed, or it
	// lost its place and rejoined): the job restarts, counted against
	// --max-restarts.
	EndRestart EndKind = "restart"
	// EndNodeLost: RoundEnd.Node's lease ran out (its agent is gone or cut
	// off): a fault.
	EndNodeLost EndKind = "node-lost"
	// EndNodeLeft: RoundEnd.Node left the job (drained, stopped): a scale
	// event, no fault.
	EndNodeLeft EndKind = "node-left"
	// EndNodeJoined: RoundEnd.Node joined a job with room for it: a scale
	// event, no fault.
	EndNodeJoined EndKind = "node-joined"

	// The ends below are this node's own; no state carries them.

	// EndLeaseLost: this node lost its lease on the store.
	EndLeaseLost EndKind = "lease-lost"
	// EndStateLost: the job's state was deleted or overwritten.
	EndStateLost EndKind = "state-lost"
	// EndStopped: this agent stopped the round (Round.Stop).
	EndStopped EndKind = "stopped"
)

// RoundEnd is why a round ended. A State carries the RoundEnd of the move
// that began its generation (State.End, beside State.Reason); a Round
// hands out the one that ended it (Round.End, beside Round.Reason).
type RoundEnd struct {
	Kind EndKind `json:"kind"`
	// Node is the node id concerned: the one lost, left or joined, or
	// whose fault it was; "" for EndStateLost, EndStopped and EndUnknown.
	Node string `json:"node,omitempty"`
}

func (e RoundEnd) String() string {
	kind := string(e.Kind)
	if e.Kind == EndUnknown {
		kind = "unknown"
	}
	if e.Node == "" {
		return kind
	}
	return kind + " (node " + e.Node + ")"
}

// move is a move of the job to a new generation: why, typed and in words,
// and whether it counts against --max-restarts.
type move struct {
	End    RoundEnd
	Reason string
	Fault  bool
}

// faultMove: the workers of node (host, group rank) failed with reason.
func faultMove(node, host string, groupRank int, reason string) move {
	return move{End: RoundEnd{Kind: EndRestart, Node: node}, Fault: true,
		Reason: fmt.Sprintf("node %s (%s, group rank %d): %s", node, host, groupRank, reason)}
}

// rejoinMove: node ran the running generation and lost its lease before
// anyone moved the job on; it asks for its place again.
func rejoinMove(node string) move {
	return move{End: RoundEnd{Kind: EndRestart, Node: node}, Fault: true,
		Reason: fmt.Sprintf("node %s lost its lease and rejoined", node)}
}

// joinMove: node (host) joined a job of nodes nodes with room for more.
func joinMove(node, host string, nodes int) move {
	return move{End: RoundEnd{Kind: EndNodeJoined, Node: node},
		Reason: fmt.Sprintf("node %s (%s) joined; scaling up from %d nodes", node, host, nodes)}
}

// leftMove: member m left the job, saying why.
func leftMove(m Member, why string) move {
	return move{End: RoundEnd{Kind: EndNodeLeft, Node: m.Node},
		Reason: fmt.Sprintf("node %s (%s, group rank %d) left: %s", m.Node, m.Host, m.GroupRank, why)}
}

// lostMove: member m's lease ran out.
func lostMove(m Member) move {
	return move{End: RoundEnd{Kind: EndNodeLost, Node: m.Node}, Fault: true,
		Reason: fmt.Sprintf("node %s (%s, group rank %d) lost: its agent is gone or cut off (lease ended)", m.Node, m.Host, m.GroupRank)}
}
