package rdzv

import (
	"sort"
)

// This file decides, from plain values, what the store's news means for a
// running round: whether the round is over, which members are gone, and
// what a member's going means for the job. round_watch.go reads the news
// and carries the decisions out.

// departure is what a member's going means for the job.
type departure struct {
	// Moves: the job must move to a new generation without the member.
	// False for a member whose workers all finished: the job stays.
	Moves bool
	// move is the move to make when Moves: node-left (no fault) or
	// node-lost (a fault).
	move
}

// departureOf judges member m, whose node entry was deleted, by the last
// value that entry held. A node that succeeded or left marks its entry so
// before it revokes its lease: succeeded moves nothing; left is a scale
// event, no fault. Anything else (its lease ran out; or the last value is
// unknown, the zero NodeInfo) means it was lost: a fault.
func departureOf(m Member, last NodeInfo) departure {
	switch last.State {
	case NodeSucceeded:
		return departure{}
	case NodeLeft:
		return departure{Moves: true, move: leftMove(m, last.Reason)}
	}
	return departure{Moves: true, move: lostMove(m)}
}

// absentMembers returns the members, other than self, whose node ids are
// not among the live node entries, by group rank.
func absentMembers(members map[string]Member, live map[string]bool, self string) []Member {
	var gone []Member
	for _, m := range members {
		if !live[m.Node] && m.Node != self {
			gone = append(gone, m)
		}
	}
	sort.Slice(gone, func(i, j int) bool { return gone[i].GroupRank < gone[j].GroupRank })
	return gone
}

// roundOver reports whether the job, whose state is st, has left the round
// of generation gen. A state that marks the round succeeded keeps it: the
// members that have not finished yet run on.
func roundOver(st State, gen uint64) bool {
	return st.Generation != gen || (st.Phase != Running && st.Phase != Succeeded)
}
