// Package straggler carries out --straggler-action: it confirms the
// persistent stragglers the collective watch names (a rank named without a
// gap for the confirmation window, by a pure clock), and then logs, asks
// for a restart, or drains this node when the job can go on without it. A
// follower reads the stragglers the leader published, since only the
// leader sees every rank. It knows nothing of the agent: the fault queue,
// the run's end, the job's status and the background goroutines are
// functions the agent passes in Config.
package straggler

import (
	"cmp"
	"fmt"
	"strconv"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// Action is what the agent does about a persistent straggler
// once it has been named without a gap for the confirmation window
// (--straggler-action).
type Action string

// The actions.
const (
	// ActionLog logs the confirmation and does nothing more: a slow
	// job is still a job, and the person who reads the log decides.
	ActionLog Action = "log"
	// ActionRestart restarts the job (a fault, counted against
	// --max-restarts): what slows a rank down is often state of the
	// process (a fragmented allocator, a leaked thread) that a fresh
	// one does not have.
	ActionRestart Action = "restart"
	// ActionDrain makes the node that runs the straggler leave the
	// job, as a GPU finding that drains it does, when the job can go on
	// without it: the slowness is the node's, and a scheduler replaces it.
	ActionDrain Action = "drain"
)

// Actions are the valid actions, for usage messages.
var Actions = []Action{ActionLog, ActionRestart, ActionDrain}

// Valid reports whether a is one of Actions.
func (a Action) Valid() bool {
	switch a {
	case ActionLog, ActionRestart, ActionDrain:
		return true
	}
	return false
}

// DefaultConfirm is the confirmation window when none is set:
// the analyzer names a straggler from its last 40 steps, so a minute is
// many windows of evidence, and a hiccup (a checkpoint, an evaluation)
// that makes a rank look slow for a few seconds never triggers a restart.
const DefaultConfirm = 60 * time.Second

// Error is a persistent straggler confirmed for the window, which
// --straggler-action restart or drain acts on: the Err of the agent's
// straggler fault, and the cause of the run's end on a drain.
type Error struct {
	Straggler telemetry.Straggler
	Confirm   time.Duration // the confirmation window it was named throughout
	Action    Action
}

func (e *Error) Error() string {
	msg := e.Finding()
	if e.Action == ActionDrain {
		msg += "; --straggler-action drain: this node leaves the job"
	}
	return msg
}

// Finding is "persistent straggler rank 1 confirmed for 60s (cause
// compute: ...)", the fault's reason without what is done about it.
func (e *Error) Finding() string { return "persistent straggler " + e.what() }

// what is "rank 1 confirmed for 60s (cause compute: forward and backward
// take 120ms longer)", the fault's reason without what is done about it.
func (e *Error) what() string {
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
