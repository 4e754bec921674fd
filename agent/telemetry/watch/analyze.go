package watch

import (
	"fmt"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// analyze feeds global-rank records of at to its analysis, logs the
// stalls among the collectives they complete and exports those.
func (s *Watch) analyze(at *attempt, recs []telemetry.Record) {
	done := at.add(recs)
	if len(done) == 0 {
		return
	}
	for _, c := range done {
		if c.Stall != nil {
			s.reportStall(at, c)
		}
	}
	if s.exp != nil {
		s.exp.Collectives(done)
	}
}

// reportStall logs the paragraph a person can act on, and keeps its line
// for this node's report.
func (s *Watch) reportStall(at *attempt, c telemetry.Collective) {
	st := c.Stall
	unit := "GPU-seconds"
	if at.worker(st.Straggler).GPU == "" {
		unit = "seconds"
	}
	waiters := fmt.Sprintf("%d ranks", st.Waiters)
	if st.Waiters == 1 {
		waiters = "1 rank"
	}
	msg := fmt.Sprintf("step %d bucket %d: rank %s arrived %s after the others; %s waited %.1f %s",
		c.Step, c.Bucket, at.describe(st.Straggler), seconds(st.Late), waiters, st.Waited.Seconds(), unit)
	s.log.Warn("stall: "+msg, "generation", c.Gen, "step", c.Step, "bucket", c.Bucket, "straggler", st.Straggler,
		"late", st.Late.Round(time.Millisecond), "waited", st.Waited.Round(time.Millisecond),
		"duration", c.Duration().Round(time.Millisecond), "threshold", st.Threshold.Round(time.Millisecond))
	s.mu.Lock()
	s.stalls = append(s.stalls, msg)
	if len(s.stalls) > telemetry.MaxStallLines {
		s.stalls = s.stalls[len(s.stalls)-telemetry.MaxStallLines:]
	}
	s.dirty = true
	s.mu.Unlock()
}
