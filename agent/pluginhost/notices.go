package pluginhost

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// The notices of the collective watch's findings, built in one place so
// that a hang or a straggler reads the same to a notifier whether
// ddp-agent run or ddp-agent sidecar told it.

// HangDetails are a hang event's Details: the missing ranks, where it
// hung, and the report that was logged (stacks included).
func HangDetails(h telemetry.Hang, report string) map[string]string {
	missing := make([]string, len(h.Missing))
	for i, r := range h.Missing {
		missing[i] = strconv.Itoa(r)
	}
	return map[string]string{"missing": strings.Join(missing, ","), "step": strconv.FormatUint(h.Step, 10),
		"bucket": strconv.FormatUint(uint64(h.Bucket), 10), "report": report}
}

// StragglerNotice is the Message and Details of a straggler event for a
// rank newly named a persistent straggler.
func StragglerNotice(st telemetry.Straggler) (string, map[string]string) {
	msg := fmt.Sprintf("persistent straggler: rank %d held the others back by %s, %.1f%% of the step time; cause %s",
		st.Rank, st.Late.Round(time.Millisecond), 100*st.Share, st.Cause)
	return msg, map[string]string{"cause": string(st.Cause), "late": st.Late.String(), "share": strconv.FormatFloat(st.Share, 'f', 3, 64)}
}

// NamedStragglers picks, from the persistent stragglers the watch names
// at each look, the ranks newly named: those the notifiers are to be told
// of. A rank named again after it recovered is new again. Safe for
// concurrent use (the watch looks from two goroutines).
type NamedStragglers struct {
	mu    sync.Mutex
	ranks map[int]bool
}

// Fresh returns the stragglers of named not named at the last look.
func (n *NamedStragglers) Fresh(named []telemetry.Straggler) []telemetry.Straggler {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := make(map[int]bool, len(named))
	var fresh []telemetry.Straggler
	for _, st := range named {
		now[st.Rank] = true
		if !n.ranks[st.Rank] {
			fresh = append(fresh, st)
		}
	}
	n.ranks = now
	return fresh
}
