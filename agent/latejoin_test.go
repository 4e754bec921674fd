package agent

import (
	"context"
	"testing"
	"time"
)

// TestOthersDoneIdle: the watch of a joining node reports the job done
// without it only once the other nodes are done and its workers, given
// the grace (and dying more where one had raised by then), neither ended
// nor failed; a worker's failure (failing closed) during the grace or
// before leaves the report to that failure's fault. Each case waits for
// its event, not a duration: the grace is an hour where it must not pass.
func TestOthersDoneIdle(t *testing.T) {
	for _, tc := range []struct {
		name         string
		grace, dying time.Duration
		// setup runs before the watch; done answers its polls; raising,
		// when set, is asked at the grace's end.
		setup   func(cancel func(), failing chan struct{})
		done    func(poll int, failing chan struct{}) bool
		raising func(failing chan struct{}) bool
		want    bool
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
			name:    "a worker raised in the grace, and exits in the time it has to",
			grace:   20 * time.Millisecond,
			dying:   time.Hour,
			done:    func(poll int, _ chan struct{}) bool { return poll >= 2 },
			raising: func(failing chan struct{}) bool { close(failing); return true },
		},
		{
			name:    "a worker raised in the grace, and does not exit",
			grace:   20 * time.Millisecond,
			dying:   20 * time.Millisecond,
			done:    func(poll int, _ chan struct{}) bool { return poll >= 2 },
			raising: func(chan struct{}) bool { return true },
			want:    true,
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
			raised := 0
			w := idleWatch{poll: time.Millisecond, grace: tc.grace, dying: tc.dying,
				othersDone: func(context.Context) bool { polls++; return tc.done(polls, failing) },
				raising: func() bool {
					raised++
					return tc.raising != nil && tc.raising(failing)
				},
			}
			start := time.Now()
			if got := w.idle(ctx, failing); got != tc.want {
				t.Fatalf("got %v after %d polls, want %v", got, polls, tc.want)
			}
			took := time.Since(start)
			switch {
			case tc.want && took < tc.grace+tc.dying && tc.raising != nil:
				t.Errorf("reported after %v, before the %v grace and the %v a raised worker has", took, tc.grace, tc.dying)
			case tc.want && took < tc.grace:
				t.Errorf("reported after %v, before the %v grace", took, tc.grace)
			case raised > 1:
				t.Errorf("asked whether a worker raised %d times, want once at most", raised)
			}
		})
	}
}
