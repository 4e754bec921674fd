// Package rootcause decides the root cause of a failed attempt: which
// rank failed first, and which failed only because of it, from this node's
// workers' exits and their shims' notes (Decide); and writes the report a
// person acts on (Format). The decisions are pure: the outcomes come from
// supervisor.Group.Outcomes, and nothing here reads a clock.
package rootcause

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/supervisor"
)

// Which rank failed first. When one rank raises, dies or exits while its
// peers are in a collective, the peers fail too, and one of them may exit
// before it (the raising rank closes its communicator at interpreter exit
// and then takes its time to tear down). The order of exits does not say
// who failed first; the shim does: a worker whose collective failed
// because a peer closed its communicator, aborted, or dropped its
// connection leaves a note naming the peer (supervisor.PeerFailure), and
// every worker's note says when it first closed a communicator. A worker
// with a peer failure is a victim of that peer, and the root cause is the
// earliest failure that is not a victim's, at its earliest sign. Without
// the hook there are no notes, and the workers' error files say who
// raised first: a rank's is written as its exception leaves main, before
// the teardown that drops its connections. The decisions here are pure;
// the outcomes come from supervisor.Group.Outcomes.

// Blame is the root cause of a failed attempt as this node sees it.
type Blame struct {
	Root  int       // the rank whose failure came first; -1 when no worker failed
	At    time.Time // when it was first seen failing: its communicator's close, a victim's collective failing on it, or its exit
	Local bool      // it is a worker of this node
	// Exit is its exit, when it is this node's and has been reaped (code
	// 0 for a rank that closed its communicator and exited cleanly).
	Exit *supervisor.WorkerExitError
	// Seen is how its first victim saw it go (a PeerFailure kind), "" when
	// none did.
	Seen string
	// Note is the root's own note when every failure was a victim's
	// and no rank they name is known (a communicator smaller than the
	// job): the earliest of them is the root, and Note says what failed it.
	Note *supervisor.PeerFailure
	// Elsewhere, when the root is another node's rank and that node's
	// agent told the rendezvous first, is the new generation's reason: it
	// names the root cause with what this node cannot see (the root's
	// exit, and whom it failed there).
	Elsewhere string
	Victims   []Victim                      // this node's workers that failed only because another rank failed first, by rank
	Others    []*supervisor.WorkerExitError // this node's other workers that failed on their own, by rank
}

// Victim is a worker that failed only because another rank failed first.
type Victim struct {
	Rank int
	Note supervisor.PeerFailure      // who failed it (Note.Peer; -1: a rank outside the job's numbering) and how
	Exit *supervisor.WorkerExitError // nil while it runs
}

// Decide works out the root cause of an attempt from the outcomes of this
// node's workers. Notes and exits after cutoff are not evidence: they
// come from the agent's own stopping of the attempt.
func Decide(outs []supervisor.Outcome, cutoff time.Time) Blame {
	v := victims(outs, cutoff)
	root, at := v.root(outs, cutoff)
	return v.classify(outs, cutoff, root, at)
}

// Reclassify is Decide with the root cause already decided (the one the
// attempt's fault named), for the report once the workers have stopped.
func Reclassify(outs []supervisor.Outcome, cutoff time.Time, decided Blame) Blame {
	if decided.lostNode() {
		failed := Blame{At: decided.At}
		for _, o := range outs { // in rank order
			if failedBy(o, cutoff) {
				failed.Others = append(failed.Others, o.Exit)
			}
		}
		return failed.LostPeer(decided.Elsewhere)
	}
	b := victims(outs, cutoff).classify(outs, cutoff, decided.Root, decided.At)
	b.Elsewhere = decided.Elsewhere
	return b
}

// victimOf maps each victim's rank to its note.
type victimOf map[int]supervisor.PeerFailure

// victims takes the notes written by cutoff, earliest first. A note
// written after its rank had closed a communicator, or that would close a
// cycle (the peer is already, through others, a victim of this rank), is
// the echo of a failure this rank caused, and is dropped.
func victims(outs []supervisor.Outcome, cutoff time.Time) victimOf {
	var notes []supervisor.Outcome
	for _, o := range outs {
		if o.Peer != nil && !o.Peer.Time.After(cutoff) && o.Peer.Peer != o.Rank && (o.Closed.IsZero() || !o.Closed.Before(o.Peer.Time)) {
			notes = append(notes, o)
		}
	}
	slices.SortFunc(notes, func(a, b supervisor.Outcome) int {
		return cmp.Or(a.Peer.Time.Compare(b.Peer.Time), cmp.Compare(a.Rank, b.Rank))
	})
	v := victimOf{}
	for _, o := range notes {
		if o.Peer.Peer < 0 || !v.reaches(o.Peer.Peer, o.Rank) {
			v[o.Rank] = *o.Peer
		}
	}
	return v
}

// reaches reports whether following the victims' notes from rank from
// leads to rank to.
func (v victimOf) reaches(from, to int) bool {
	seen := map[int]bool{}
	for r := from; r >= 0 && !seen[r]; {
		if r == to {
			return true
		}
		seen[r] = true
		n, ok := v[r]
		if !ok {
			return false
		}
		r = n.Peer
	}
	return false
}

// root is the earliest failure that is not a victim's: a worker of this
// node that failed by cutoff, a rank a victim named (of this node or not,
// exited or not), or a worker of this node that closed its communicator
// before a victim's collective failed, each at the earliest sign of it
// (its communicator's close, a victim's note, its exit). Ties go to the
// lower rank. With none (every failure a victim of a rank outside the
// job's numbering) it is the earliest failed exit.
func (v victimOf) root(outs []supervisor.Outcome, cutoff time.Time) (int, time.Time) {
	first := map[int]time.Time{}
	seen := func(r int, t time.Time) {
		if old, ok := first[r]; !ok || t.Before(old) {
			first[r] = t
		}
	}
	for _, o := range outs {
		if _, victim := v[o.Rank]; victim {
			continue
		}
		switch {
		case failedBy(o, cutoff):
			seen(o.Rank, failedAt(o))
		case !o.Raised.IsZero() && !o.Raised.After(cutoff):
			// It raised and is still tearing down (or exited after the
			// cutoff): its exit may come after its victims'.
			seen(o.Rank, o.Raised)
		}
	}
	var lastNote time.Time
	for _, n := range v {
		if _, victim := v[n.Peer]; n.Peer >= 0 && !victim {
			seen(n.Peer, n.Time)
		}
		if n.Time.After(lastNote) {
			lastNote = n.Time
		}
	}
	for _, o := range outs {
		_, victim := v[o.Rank]
		_, candidate := first[o.Rank]
		if victim || o.Closed.IsZero() || o.Closed.After(cutoff) {
			continue
		}
		// A rank of this node that closed its communicator: failed or
		// named, it closed before its victims noticed; neither (its
		// victims here named ranks of other nodes that it failed first),
		// it is a failure when it closed before a collective failed.
		if candidate || !o.Closed.After(lastNote) && len(v) > 0 {
			seen(o.Rank, o.Closed)
		}
	}
	if len(first) == 0 {
		for _, o := range outs {
			if failedBy(o, cutoff) {
				seen(o.Rank, failedAt(o))
			}
		}
	}
	root, at := -1, time.Time{}
	for r, t := range first {
		if root < 0 || t.Before(at) || t.Equal(at) && r < root {
			root, at = r, t
		}
	}
	return root, at
}

func failedBy(o supervisor.Outcome, cutoff time.Time) bool {
	return o.Exit != nil && o.Exit.Failed() && !o.Exit.Time.After(cutoff)
}

// failedAt is when a worker that failed was first seen failing: when it
// wrote its error file or closed its communicator, whichever came first,
// else its exit. A rank that raises writes the file as the exception
// leaves main and closes its communicator at interpreter exit, and its
// peers fail then, maybe long before it has exited; its exit would make
// it look later than its victims, or their victims on other nodes.
func failedAt(o supervisor.Outcome) time.Time {
	at := o.Exit.Time
	for _, t := range []time.Time{o.Closed, o.Raised} {
		if !t.IsZero() && t.Before(at) {
			at = t
		}
	}
	return at
}

// classify fills in the Blame of root, first seen failing at at: its
// exit, how it was seen to go, its victims and the other failures.
func (v victimOf) classify(outs []supervisor.Outcome, cutoff time.Time, root int, at time.Time) Blame {
	b := Blame{Root: root, At: at}
	var seenAt time.Time
	for _, o := range outs { // in rank order: the same answer every time
		if n, ok := v[o.Rank]; ok && n.Peer == root && (b.Seen == "" || n.Time.Before(seenAt)) {
			b.Seen, seenAt = n.Kind, n.Time
		}
	}
	for _, o := range outs {
		n, victim := v[o.Rank]
		switch {
		case o.Rank == root:
			b.Local, b.Exit = true, o.Exit
			if victim {
				b.Note = &n
			}
		case victim:
			b.Victims = append(b.Victims, Victim{Rank: o.Rank, Note: n, Exit: o.Exit})
		case failedBy(o, cutoff):
			b.Others = append(b.Others, o.Exit)
		}
	}
	slices.SortFunc(b.Victims, func(a, b Victim) int { return cmp.Compare(a.Rank, b.Rank) })
	slices.SortFunc(b.Others, func(a, b *supervisor.WorkerExitError) int { return cmp.Compare(a.Rank, b.Rank) })
	return b
}

// peerDid says what a peer did to fail a collective, by PeerFailure kind.
func peerDid(kind string) string {
	switch kind {
	case "closed":
		return "closed its communicator"
	case "lost":
		return "dropped its connection (it died, or its communicator failed)"
	case "aborted":
		return "aborted its communicator"
	}
	return "failed (" + kind + ")"
}

func rankName(r int) string {
	if r == lostNode {
		return "a worker of the lost node"
	}
	if r < 0 {
		return "a peer (a rank of a smaller communicator)"
	}
	return "rank " + strconv.Itoa(r)
}

// rootLine says who failed first, in one line.
func (b Blame) rootLine() string {
	switch {
	case b.Exit != nil:
		return b.Exit.Error()
	case b.Elsewhere != "":
		return "the job moved to a new generation first: " + b.Elsewhere
	case b.Local && b.Seen == "": // no victim named it: it raised (its error file)
		return fmt.Sprintf("worker rank %d raised and has not exited yet", b.Root)
	case b.Local:
		return fmt.Sprintf("worker rank %d %s and has not exited yet", b.Root, peerDid(b.Seen))
	case b.Seen != "":
		return fmt.Sprintf("rank %d (a worker of another node) %s", b.Root, peerDid(b.Seen))
	}
	return fmt.Sprintf("rank %d (a worker of another node) failed", b.Root)
}

// victimLines says, one line for each rank they name and how, which
// ranks failed only because of it: "ranks 1, 2 failed only because rank 0
// closed its communicator".
func (b Blame) victimLines() []string {
	type by struct {
		peer int
		kind string
	}
	var order []by
	ranks := map[by][]string{}
	for _, v := range b.Victims {
		k := by{v.Note.Peer, v.Note.Kind}
		if _, ok := ranks[k]; !ok {
			order = append(order, k)
		}
		ranks[k] = append(ranks[k], strconv.Itoa(v.Rank))
	}
	var lines []string
	for _, k := range order {
		who := "rank " + ranks[k][0]
		if len(ranks[k]) > 1 {
			who = "ranks " + strings.Join(ranks[k], ", ")
		}
		lines = append(lines, fmt.Sprintf("%s failed only because %s %s", who, rankName(k.peer), peerDid(k.kind)))
	}
	return lines
}

// Reason is the attempt's fault in one line, for the rendezvous, the log
// and the trace: the root cause, then its victims.
func (b Blame) Reason() string {
	s := b.rootLine()
	if b.Note != nil {
		s += " after " + rankName(b.Note.Peer) + " " + peerDid(b.Note.Kind)
	}
	for _, l := range b.victimLines() {
		s += "; " + l
	}
	return s
}

// VictimRanks are the victims' ranks, for the log.
func (b Blame) VictimRanks() []int {
	r := make([]int, len(b.Victims))
	for i, v := range b.Victims {
		r[i] = v.Rank
	}
	return r
}
