package watch

import (
	"slices"
	"time"
)

// stepClock estimates the step time from when bucket 0's all-reduce
// begins (its first arrival) in consecutive steps.
type stepClock struct {
	last      uint64
	lastStart time.Time
	intervals []time.Duration // the most recent, at most stepWindow
}

const stepWindow = 20

func (c *stepClock) observe(step uint64, start time.Time) {
	if !c.lastStart.IsZero() && step == c.last+1 && start.After(c.lastStart) {
		c.intervals = append(c.intervals, start.Sub(c.lastStart))
		if len(c.intervals) > stepWindow {
			c.intervals = c.intervals[1:]
		}
	}
	if c.lastStart.IsZero() || step > c.last {
		c.last, c.lastStart = step, start
	}
}

// median is the median step time, 0 before five steps.
func (c *stepClock) median() time.Duration {
	if len(c.intervals) < 5 {
		return 0
	}
	s := slices.Clone(c.intervals)
	slices.Sort(s)
	return s[len(s)/2]
}
