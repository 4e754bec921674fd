package probe

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

func TestBoundedReturnsResult(t *testing.T) {
	var b Bounded[int]
	got, err := b.Run(context.Background(), time.Second, func() int { return 7 })
	if err != nil || got != 7 {
		t.Fatalf("Run = %d, %v; want 7, nil", got, err)
	}
}

// A stuck fn costs its timeout once; while it stays stuck Run answers at
// once without starting another; once it returns, Run runs fn again.
func TestBoundedHung(t *testing.T) {
	var b Bounded[int]
	release := make(chan struct{})
	var started atomic.Int32
	stuck := func() int { started.Add(1); <-release; return 1 }

	t0 := time.Now()
	if _, err := b.Run(context.Background(), 50*time.Millisecond, stuck); !errors.Is(err, ErrHung) {
		t.Fatalf("first Run: err = %v, want ErrHung", err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Fatalf("first Run took %s with a 50ms timeout", d)
	}
	t1 := time.Now()
	_, err := b.Run(context.Background(), time.Hour, stuck)
	if !errors.Is(err, ErrHung) || time.Since(t1) > time.Second {
		t.Fatalf("second Run: err = %v after %s, want ErrHung at once", err, time.Since(t1))
	}
	if n := started.Load(); n != 1 {
		t.Fatalf("fn started %d times while stuck, want 1", n)
	}
	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := b.Run(context.Background(), time.Second, func() int { return 2 })
		if err == nil {
			if got != 2 {
				t.Fatalf("Run after release = %d, want 2 (not the stale result)", got)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Run still failing after the stuck fn returned: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestBoundedContext(t *testing.T) {
	var b Bounded[int]
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	release := make(chan struct{})
	defer close(release)
	if _, err := b.Run(ctx, time.Hour, func() int { <-release; return 0 }); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestLoop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var checks atomic.Int32
	check := func(context.Context) []detector.Finding {
		checks.Add(1)
		return []detector.Finding{{Subject: "a"}, {Subject: "b"}}
	}
	var got []string
	err := Loop(ctx, 10*time.Millisecond, check, func(f detector.Finding) error {
		got = append(got, f.Subject)
		if len(got) == 6 {
			cancel()
		}
		return nil
	})
	if err != nil || len(got) != 6 || checks.Load() != 3 {
		t.Fatalf("Loop = %v after %d checks with findings %q; want nil, 3 checks, 6 findings", err, checks.Load(), got)
	}

	gone := errors.New("agent gone")
	err = Loop(context.Background(), time.Hour, check, func(detector.Finding) error { return gone })
	if !errors.Is(err, gone) {
		t.Fatalf("Loop with a failing emit = %v, want it to wrap %v", err, gone)
	}
}
