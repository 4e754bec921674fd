package watch

import (
	"fmt"
	"time"
)

// silentAfter is how long a follower may send nothing (no records, no
// worker states, which it sends every stateEvery) before the leader stops
// taking the absence of its ranks' records for a hang: its agent or
// sidecar is gone, or never reached this one, and the ranks may well be
// training (under a sidecar, whose death does not stop them).
const silentAfter = 2 * stateEvery

// heard is what the leader has heard from the other nodes this attempt:
// which node each remote rank runs on, and when each node last sent.
type heard struct {
	nodeOf map[int]string
	last   map[string]time.Time
}

func (h *heard) reset() { h.nodeOf, h.last = map[int]string{}, map[string]time.Time{} }

func (h *heard) from(node string, now time.Time, ranks ...int) {
	if h.last == nil {
		h.reset()
	}
	h.last[node] = now
	for _, r := range ranks {
		h.nodeOf[r] = node
	}
}

// unjudged returns the missing ranks a leader cannot judge hung, and why:
// those of no node that reported this attempt, and those of a node silent
// for silentAfter. Ranks in [localFrom, localTo) are this node's: always
// judged. Pure, for tests.
func (h *heard) unjudged(missing []int, localFrom, localTo int, now time.Time) ([]int, string) {
	var out []int
	why := ""
	for _, r := range missing {
		if r >= localFrom && r < localTo {
			continue
		}
		node, ok := h.nodeOf[r]
		switch {
		case !ok:
			out = append(out, r)
			why = "their node's agent or sidecar never reported to this one this attempt"
		case now.Sub(h.last[node]) > silentAfter:
			out = append(out, r)
			if why == "" {
				why = fmt.Sprintf("node %s has sent nothing for %s", node, seconds(now.Sub(h.last[node])))
			}
		}
	}
	return out, why
}

// oneNode is the node every one of missing runs on, when that is a single
// node other than this one (ranks in [localFrom, localTo)); "" otherwise,
// or when a rank's node is not known. Pure, for tests.
func (h *heard) oneNode(missing []int, localFrom, localTo int) string {
	node := ""
	for _, r := range missing {
		n, ok := h.nodeOf[r]
		if r >= localFrom && r < localTo || !ok || node != "" && n != node {
			return ""
		}
		node = n
	}
	return node
}
