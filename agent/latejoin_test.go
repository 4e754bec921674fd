package agent

import (
	"context"
	"testing"
	"time"
)

// TestOthersDoneIdle: the watch of a joining node reports the job done
// without it only once the other nodes are done and its workers, given
// the grace, neither ended nor failed; a worker's failure (failing closed)
// during the grace or before leaves the report to that failure's fault.
// Each case waits for its event, not a duration: the grace is an hour
// where it must not pass.
func TestOthersDoneIdle(t *testing.T) {
	for _, tc := range []struct {
		name  string
		grace time.Duration
		// setup runs before the watch; done answers its polls.
		setup func(cancel func(), failing chan struct{})
		done  func(poll int, failing chan struct{}) bool
		want  bool
	}{
		{
			name:  "others done, workers idle",
			grace: 20 * time.Millisecond,
			done:  func(poll int, _ chan struct{}) bool { return poll >= 3 },
			want:  true,
		},
		{
			name:  "a worker fails in the grace",
			grace: time.Hour,
			done: func(poll int, failing chan struct{}) bool {
				if poll == 2 {
					close(failing)
				}
				return poll >= 2
			},
		},
		{
			name:  "a worker failed before the others were done",
			grace: time.Hour,
			setup: func(_ func(), failing chan struct{}) { close(failing) },
			done:  func(int, chan struct{}) bool { return true },
		},
		{
			name:  "the attempt's wait ends",
			grace: time.Hour,
			setup: func(cancel func(), _ chan struct{}) { cancel() },
			done:  func(int, chan struct{}) bool { return true },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			failing := make(chan struct{})
			if tc.setup != nil {
				tc.setup(cancel, failing)
			}
			polls := 0
			othersDone := func(context.Context) bool { polls++; return tc.done(polls, failing) }
			start := time.Now()
			if got := othersDoneIdle(ctx, time.Millisecond, tc.grace, othersDone, failing); got != tc.want {
				t.Fatalf("got %v after %d polls, want %v", got, polls, tc.want)
			}
			if took := time.Since(start); tc.want && took < tc.grace {
				t.Errorf("reported after %v, before the %v grace", took, tc.grace)
			}
		})
	}
}
