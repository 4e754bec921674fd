package pluginhost

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

// The events told from outside the agent's loop (a detector's finding,
// a plugin's failure, any event that comes without them) carry the
// generation and attempt current when they are told; one that names the
// current generation alone (a reformed) the current attempt; an event
// that has its own keeps them.
func TestEventsCarryTheCurrentAttempt(t *testing.T) {
	dir := t.TempDir()
	pager, notes := helperPlugin(t, dir, "pager", "notifier:record")
	// One finding that asks for a restart (a health_finding), then a
	// crash (a plugin_failed), at every start.
	check, _ := helperPlugin(t, dir, "check", "detector:crash")
	var gen atomic.Uint64
	var attempt atomic.Int64
	gen.Store(3)
	attempt.Store(2)
	specs, err := ParseSpecs([]string{pager, check + ",action=restart"}, "")
	if err != nil {
		t.Fatal(err)
	}
	h, err := Start(Config{Specs: specs, FirstBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		Attempt: func() (uint64, int) { return gen.Load(), int(attempt.Load()) }}, newRecorder().logger())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(0)
	delivered := func(want string) func() bool {
		return func() bool { return slices.Contains(noteLines(notes, "attempt "), want) }
	}
	eventually(t, "a health_finding of attempt 2 of generation 3", delivered("attempt health_finding 3 2"))
	eventually(t, "a plugin_failed of attempt 2 of generation 3", delivered("attempt plugin_failed 3 2"))

	gen.Store(4)
	attempt.Store(5) // the loop started another attempt
	h.Notify(notifier.Event{Kind: notifier.Straggler, Rank: 1})
	eventually(t, "a straggler of the new attempt", delivered("attempt straggler 4 5"))
	eventually(t, "a plugin_failed of the new attempt", delivered("attempt plugin_failed 4 5"))
	h.Notify(notifier.Event{Kind: notifier.Restarted, Rank: -1, Generation: 7, Attempt: 1})
	eventually(t, "an event's own generation and attempt", delivered("attempt restarted 7 1"))
	h.Notify(notifier.Event{Kind: notifier.JobFailed, Rank: -1, Attempt: 1}) // generation 0's second attempt
	eventually(t, "an event's own attempt in generation 0", delivered("attempt job_failed 0 1"))
	h.Notify(notifier.Event{Kind: notifier.Reformed, Rank: 0, Generation: 4}) // as observe tells one
	eventually(t, "the current attempt of an event of the current generation", delivered("attempt reformed 4 5"))
	h.Notify(notifier.Event{Kind: notifier.Hang, Rank: -1, Generation: 2})
	eventually(t, "no attempt for an earlier generation", delivered("attempt hang 2 0"))
}
