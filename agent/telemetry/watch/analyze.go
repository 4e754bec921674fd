package watch

import (
	"fmt"
	"strings"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/wire"
)

// analyze feeds global-rank records of at to its analyzer.
func (s *Watch) analyze(at *attempt, recs []telemetry.Record) {
	if at.an == nil {
		return
	}
	var done []telemetry.Collective
	for _, r := range recs {
		if r.Gen != at.gen {
			continue
		}
		r.Rank -= at.base
		if r.IsMark() {
			if r.Bucket == wire.MarkForward {
				at.an.Mark(r.Gen, r.Rank, r.Step, r.Arrive)
			}
			continue
		}
		done = append(done, at.an.Add(r)...)
	}
	if len(done) == 0 {
		return
	}
	s.mu.Lock()
	s.progress = time.Now()
	s.mu.Unlock()
	for i := range done { // back to global ranks for reports and spans
		c := &done[i]
		for j := range c.Records {
			c.Records[j].Rank += at.base
		}
		if c.Bucket == 0 && len(c.Records) > 0 {
			first := c.Records[0].Arrive
			for _, r := range c.Records {
				if r.Arrive.Before(first) {
					first = r.Arrive
				}
			}
			s.mu.Lock()
			s.steps.observe(c.Step, first)
			s.mu.Unlock()
		}
		if c.Stall != nil {
			c.Stall.Straggler += at.base
			s.reportStall(*c)
		}
	}
	if s.exp != nil {
		s.exp.Collectives(done)
	}
}

// reportStall logs the paragraph a person can act on.
func (s *Watch) reportStall(c telemetry.Collective) {
	st := c.Stall
	unit := "GPU-seconds"
	if s.Worker(st.Straggler).GPU == "" {
		unit = "seconds"
	}
	msg := fmt.Sprintf("step %d bucket %d: rank %s arrived %s after the others; %d ranks waited %.1f %s",
		c.Step, c.Bucket, s.describe(st.Straggler), seconds(st.Late), st.Waiters, st.Waited.Seconds(), unit)
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

// describe is "5 (node-b, GPU 1, pid 4411)".
func (s *Watch) describe(rank int) string {
	w := s.Worker(rank)
	parts := []string{}
	if w.Host != "" {
		parts = append(parts, w.Host)
	}
	if w.GPU != "" {
		parts = append(parts, fmt.Sprintf("GPU %d", w.GPUIndex))
	}
	if w.PID != 0 {
		parts = append(parts, fmt.Sprintf("pid %d", w.PID))
	}
	if len(parts) == 0 {
		return fmt.Sprint(rank)
	}
	return fmt.Sprintf("%d (%s)", rank, strings.Join(parts, ", "))
}
