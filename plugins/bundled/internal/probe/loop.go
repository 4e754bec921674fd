package probe

import (
	"context"
	"fmt"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

// Loop runs check at once and then every interval until ctx ends, passing
// each of its findings, the healthy ones too (they are the heartbeat), to
// emit. It returns nil when ctx ends, or emit's error: the agent is gone.
//
// A check that takes d delays the next verdict by at most d, because a
// tick missed while checking is taken at once: verdicts are never more than
// interval + the longest check apart, which is what a detector's
// Schedule.Every promises.
func Loop(ctx context.Context, interval time.Duration, check func(context.Context) []detector.Finding, emit func(detector.Finding) error) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		for _, f := range check(ctx) {
			if ctx.Err() != nil {
				return nil
			}
			if err := emit(f); err != nil {
				return fmt.Errorf("emit %s finding on %s: %w", f.Severity, f.Subject, err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}
