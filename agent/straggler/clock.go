package straggler

import (
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// lookGap is the longest time between two looks of the watch (it looks
// every second or two) over which a rank still counts as named without a
// gap: a watch that did not look cannot vouch for what happened meanwhile.
const lookGap = 10 * time.Second

// decision is what to do about a confirmed straggler.
type decision struct {
	Action    Action
	Straggler telemetry.Straggler
	Named     time.Duration // how long it has been named without a gap
}

// clock confirms persistent stragglers within one attempt. It is
// pure: the caller passes each look's time, and it reads no clock.
type clock struct {
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
func (c *clock) look(gen uint64, now time.Time, named []telemetry.Straggler, action Action, window time.Duration) (decision, bool) {
	if gen != c.gen || c.since == nil {
		*c = clock{gen: gen, since: map[int]time.Time{}}
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
		return decision{}, false
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
		return decision{}, false
	}
	c.decide = true
	return decision{Action: action, Straggler: *best, Named: now.Sub(c.since[best.Rank])}, true
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
