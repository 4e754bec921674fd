package agent

import (
	"log/slog"
	"testing"
	"time"
)

// TestHangTimeoutAuto: with --hang-timeout auto the timeout is 60 s until
// the steps are known to take longer than a tenth of it; then 10 × the
// median step time. Gaps in the step numbers (a restart, a lost record)
// make no interval.
func TestHangTimeoutAuto(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name  string
		step  time.Duration
		steps []uint64
		want  time.Duration
	}{
		{"short steps", 2 * time.Second, []uint64{0, 1, 2, 3, 4, 5, 6}, time.Minute},
		{"long steps", 30 * time.Second, []uint64{0, 1, 2, 3, 4, 5, 6}, 5 * time.Minute},
		{"too few steps", 30 * time.Second, []uint64{0, 1, 2, 3}, time.Minute},
		{"gaps", 30 * time.Second, []uint64{0, 2, 4, 6, 8, 10, 12}, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStallWatch(slog.New(slog.DiscardHandler), time.Minute)
			s.hangAuto = true
			for _, st := range tc.steps {
				s.steps.observe(st, base.Add(time.Duration(st)*tc.step))
			}
			if got := s.timeout(); got != tc.want {
				t.Errorf("timeout %v, want %v", got, tc.want)
			}
			s.hangAuto = false
			if got := s.timeout(); got != time.Minute {
				t.Errorf("without auto: %v, want the flag's 1m", got)
			}
		})
	}
}
