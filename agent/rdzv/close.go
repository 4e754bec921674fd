package rdzv

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// This file decides when a round's leader closes the round and what the
// closed round holds, from plain values: the leader (lead.go) gathers them
// from the store and carries the decision out, so the rules are tested
// without a store, as torch's _RendezvousJoinOp decides apart from its
// executor.

// closeRule is the job's side of closing a round.
type closeRule struct {
	Min, Max int           // NNodesMin, NNodesMax
	LastCall time.Duration // after Min joined, how long to wait for more
}

// roundView is what a round's leader knows at one moment.
type roundView struct {
	Joiners []JoinInfo // the nodes that joined the round, in any order
	Live    []NodeInfo // the registered nodes, in any order
	// Reformation: the job ran before (the last round has members), so a
	// round after a fault waits for no one but the live nodes.
	Reformation bool
	// MinSince is when Min nodes had joined, as the last decision said;
	// zero when they had not.
	MinSince      time.Time
	Now, Deadline time.Time
}

// closeAction is what the leader does next.
type closeAction int

const (
	// waitForMore: keep the round open and look again on the next event.
	waitForMore closeAction = iota
	// closeNow: write the members (closedRound) and the Running state.
	closeNow
	// joinTimedOut: too few nodes joined by the deadline; the round fails
	// with *JoinTimeoutError.
	joinTimedOut
)

// closeDecision is decideClose's answer.
type closeDecision struct {
	Action closeAction
	Why    string    // for closeNow: which rule closed the round, for the log
	Joined int       // how many nodes joined
	Since  time.Time // MinSince for the next look
	// Awaited are the indexes in roundView.Live of the active nodes that
	// have not joined: the ones the round waits on, which the leader
	// probes to find those whose agent is already gone.
	Awaited []int
}

// decideClose decides whether the round of v closes now. It closes when
//   - Max nodes joined; or
//   - at least Min joined, the job ran before, and every live node
//     joined: a re-formation after a fault waits for no one else; or
//   - at least Min joined and the last-call window passed since then.
//
// Otherwise the round fails once the deadline passed, or waits.
func decideClose(v roundView, rule closeRule) closeDecision {
	d := closeDecision{Joined: len(v.Joiners), Since: v.MinSince}
	n := d.Joined
	if n >= rule.Min && d.Since.IsZero() {
		d.Since = v.Now
	}
	if n < rule.Min {
		d.Since = time.Time{}
	}
	joined := make(map[string]bool, n)
	for _, j := range v.Joiners {
		joined[j.Node] = true
	}
	for i, ln := range v.Live {
		if ln.State == NodeActive && !joined[ln.Node] {
			d.Awaited = append(d.Awaited, i)
		}
	}
	switch {
	case n >= rule.Max:
		d.Action, d.Why = closeNow, "all nodes joined"
	case n >= rule.Min && v.Reformation && len(d.Awaited) == 0:
		d.Action, d.Why = closeNow, "every live node joined"
	case n >= rule.Min && v.Now.Sub(d.Since) >= rule.LastCall:
		d.Action, d.Why = closeNow, "last call ended"
	case v.Now.After(v.Deadline):
		d.Action = joinTimedOut
	}
	return d
}

// closedRound picks the members of a closing round and their group ranks
// (see assign), and group rank 0's join: the workers' store is the one it
// offered (its port, and whether its agent serves it). plain are the
// members whose agents would serve no store (no --spares), in group rank
// order.
func closedRound(prev []Member, joiners []joiner, max int) (members []Member, master JoinInfo, plain []string) {
	list := make([]joiner, len(joiners))
	copy(list, joiners)
	sort.Slice(list, func(a, b int) bool { return list[a].rev < list[b].rev })
	members = assign(prev, list, max)
	byNode := make(map[string]JoinInfo, len(list))
	for _, j := range list {
		byNode[j.Node] = j.JoinInfo
	}
	master = byNode[members[0].Node]
	for _, m := range members {
		if !byNode[m.Node].AgentStore {
			plain = append(plain, m.Node)
		}
	}
	return members, master, plain
}

// runningState is the state that closes the round of st with members, of
// which plain serve no store (closedRound): the member list itself lives
// at membersKey and one key per member under assignPrefix, which the
// closer writes first. A lost node's failure owed since the bump (Owed)
// is counted here if the workers do not carry on, which may fail the job.
func runningState(st State, members []Member, master JoinInfo, plain []string, membersKey, assignPrefix string, now time.Time) State {
	next := st
	next.Phase = Running
	next.Since = now
	next.Members = nil
	next.NNodes = len(members)
	next.MembersKey = membersKey
	next.AssignPrefix = assignPrefix
	last := members[len(members)-1]
	next.WorldSize = last.RankOffset + last.NProc
	next.MasterAddr = members[0].Addr
	next.MasterPort = master.MasterPort
	next.AgentStore = master.AgentStore
	next.MasterNode = members[0].Node
	next.PlainNodes = ""
	if len(plain) > 0 && len(plain) < len(members) {
		next.PlainNodes = nodeList(plain)
	}
	next.Carry = carries(st, master) && next.PlainNodes == ""
	next.LastStore = ""
	if next.Owed {
		// A lost node the workers do not carry on past after all: they
		// restart, and that is a restart, counted as the bump would have.
		next.Owed = false
		if !next.Carry {
			next.Failures++
			if next.Failures > next.MaxRestarts {
				next.Phase = Failed
				next.Reason = fmt.Sprintf("%s; no restarts left (--max-restarts %d)", next.Reason, next.MaxRestarts)
			}
		}
	}
	return next
}

// nodeList names nodes for a log line: "node a", "nodes a, b, c", or,
// past three, "nodes a, b, c and 7 more"; the state that carries it
// reaches every agent at every change, so it stays short at any size.
func nodeList(nodes []string) string {
	switch n := len(nodes); {
	case n == 1:
		return "node " + nodes[0]
	case n <= 3:
		return "nodes " + strings.Join(nodes, ", ")
	default:
		return fmt.Sprintf("nodes %s and %d more", strings.Join(nodes[:3], ", "), n-3)
	}
}

// carries is whether the workers of the last round carry on into the
// round that st's members close, whose group rank 0 joined with master:
// the job's nodes changed, the last round ran with an agent's store, and
// this one's has an agent's too. That is the last round's store where its
// node stayed (its agent offers the same port, OfferStore), and else a
// new one on the new group rank 0, which the workers move to
// (agent/keep.go).
func carries(st State, master JoinInfo) bool {
	switch st.End.Kind {
	case EndNodeLost, EndNodeLeft, EndNodeJoined:
	default:
		return false
	}
	return master.AgentStore && st.LastStore != ""
}

// storeID names a workers' store served by the agent of node on port.
func storeID(node string, port int) string { return node + ":" + strconv.Itoa(port) }
