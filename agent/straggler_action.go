package agent

import (
	"cmp"
	"fmt"
	"strconv"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// StragglerAction is what the agent does about a persistent straggler
// once it has been named without a gap for the confirmation window
// (--straggler-action).
type StragglerAction string

// The straggler actions.
const (
	// StragglerLog logs the confirmation and does nothing more: a slow
	// job is still a job, and the person who reads the log decides.
	StragglerLog StragglerAction = "log"
	// StragglerRestart restarts the job (a fault, counted against
	// --max-restarts): what slows a rank down is often state of the
	// process (a fragmented allocator, a leaked thread) that a fresh
	// one does not have.
	StragglerRestart StragglerAction = "restart"
	// StragglerDrain makes the node that runs the straggler leave the
	// job, as a GPU finding that drains it does, when the job can go on
	// without it: the slowness is the node's, and a scheduler replaces it.
	StragglerDrain StragglerAction = "drain"
)

// StragglerActions are the valid actions, for usage messages.
var StragglerActions = []StragglerAction{StragglerLog, StragglerRestart, StragglerDrain}

// Valid reports whether a is one of StragglerActions.
func (a StragglerAction) Valid() bool {
	switch a {
	case StragglerLog, StragglerRestart, StragglerDrain:
		return true
	}
	return false
}

// DefaultStragglerConfirm is the confirmation window when none is set:
// the analyzer names a straggler from its last 40 steps, so a minute is
// many windows of evidence, and a hiccup (a checkpoint, an evaluation)
// that makes a rank look slow for a few seconds never triggers a restart.
const DefaultStragglerConfirm = 60 * time.Second

// lookGap is the longest time between two looks of the watch (it looks
// every second or two) over which a rank still counts as named without a
// gap: a watch that did not look cannot vouch for what happened meanwhile.
const lookGap = 10 * time.Second

// StragglerError is a persistent straggler confirmed for the window,
// which --straggler-action restart or drain acts on: the Err of a
// FromStraggler fault, and the cause of the run's end on a drain.
type StragglerError struct {
	Straggler telemetry.Straggler
	Confirm   time.Duration // the confirmation window it was named throughout
	Action    StragglerAction
}

func (e *StragglerError) Error() string {
	msg := "persistent straggler " + e.what()
	if e.Action == StragglerDrain {
		msg += "; --straggler-action drain: this node leaves the job"
	}
	return msg
}

// what is "rank 1 confirmed for 60s (cause compute: forward and backward
// take 120ms longer)", the fault's reason without what is done about it.
func (e *StragglerError) what() string {
	st := e.Straggler
	msg := fmt.Sprintf("rank %d confirmed for %s", st.Rank, durationText(e.Confirm))
	cause := cmp.Or(string(st.Cause), string(telemetry.CauseUnknown))
	if st.Evidence != "" {
		return msg + fmt.Sprintf(" (cause %s: %s)", cause, st.Evidence)
	}
	return msg + " (cause " + cause + ")"
}

// durationText is "60s" for whole seconds (time.Duration says "1m0s"),
// else Go's form.
func durationText(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return d.String()
}

// stragglerDecision is what to do about a confirmed straggler.
type stragglerDecision struct {
	Action    StragglerAction
	Straggler telemetry.Straggler
	Named     time.Duration // how long it has been named without a gap
}

// stragglerClock confirms persistent stragglers within one attempt. It is
// pure: the caller passes each look's time, and it reads no clock.
type stragglerClock struct {
	gen    uint64
	since  map[int]time.Time // a rank named at every look since this time
	last   time.Time         // the last look; zero before the first
	decide bool              // this attempt's decision was made
}

// look takes the persistent stragglers named at now by the watch of the
// attempt of generation gen. It returns the decision when a rank has been
// named at every look for window, at most once per attempt (a restart or
// a drain ends the attempt anyway, and a log line a second is noise). A
// look that does not name a rank, or a gap of more than lookGap between
// looks, resets that rank's clock; a new generation resets them all.
func (c *stragglerClock) look(gen uint64, now time.Time, named []telemetry.Straggler, action StragglerAction, window time.Duration) (stragglerDecision, bool) {
	if gen != c.gen || c.since == nil {
		*c = stragglerClock{gen: gen, since: map[int]time.Time{}}
	}
	if !c.last.IsZero() && now.Sub(c.last) > lookGap {
		clear(c.since)
	}
	c.last = now
	still := make(map[int]bool, len(named))
	for _, st := range named {
		still[st.Rank] = true
		if _, ok := c.since[st.Rank]; !ok {
			c.since[st.Rank] = now
		}
	}
	for r := range c.since {
		if !still[r] {
			delete(c.since, r)
		}
	}
	if c.decide {
		return stragglerDecision{}, false
	}
	var best *telemetry.Straggler
	for i := range named {
		st := &named[i]
		if now.Sub(c.since[st.Rank]) < window {
			continue
		}
		if best == nil || moreConfirmed(*st, *best, c.since) {
			best = st
		}
	}
	if best == nil {
		return stragglerDecision{}, false
	}
	c.decide = true
	return stragglerDecision{Action: action, Straggler: *best, Named: now.Sub(c.since[best.Rank])}, true
}

// moreConfirmed orders confirmed stragglers: the one named longest, then
// the one that costs the job most, then the lower rank, so the choice
// never depends on the order the watch lists them in.
func moreConfirmed(a, b telemetry.Straggler, since map[int]time.Time) bool {
	if sa, sb := since[a.Rank], since[b.Rank]; !sa.Equal(sb) {
		return sa.Before(sb)
	}
	if a.Share != b.Share {
		return a.Share > b.Share
	}
	return a.Rank < b.Rank
}

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
