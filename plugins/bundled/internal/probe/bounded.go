// Package probe runs a detector's checks: on a schedule (Loop), each one
// bounded in time (Bounded), so that a check that hangs in the kernel (a
// wedged driver's sysfs file, a dead NFS server) turns into a finding
// instead of a silent detector that the agent must restart.
package probe

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrHung is wrapped by Run's error when fn overran its timeout, or an
// earlier call of it is still stuck.
var ErrHung = errors.New("hung")

// Bounded runs one kind of check (one port, one path) so that its caller
// waits at most a timeout. A goroutine stuck in a system call cannot be
// stopped, so Bounded starts no second one while the first is stuck: a
// hung NFS mount costs one goroutine, not one per interval. The zero
// value is ready to use.
type Bounded[T any] struct {
	mu      sync.Mutex
	pending chan T    // the result of a call that overran, nil when none
	since   time.Time // when that call started
}

// Run calls fn in a goroutine of its own and returns its result, or an
// error wrapping ErrHung when it takes longer than timeout or an earlier
// fn has not returned yet, or ctx's error when ctx ends first.
func (b *Bounded[T]) Run(ctx context.Context, timeout time.Duration, fn func() T) (T, error) {
	var zero T
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pending != nil {
		select {
		case <-b.pending: // it came back; its result is stale
			b.pending = nil
		default:
			return zero, fmt.Errorf("still %w, started %s ago", ErrHung, time.Since(b.since).Round(time.Second))
		}
	}
	done := make(chan T, 1) // buffered: a late fn does not block on a reader that left
	start := time.Now()
	go func() { done <- fn() }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case r := <-done:
		return r, nil
	case <-timer.C:
		b.pending, b.since = done, start
		return zero, fmt.Errorf("%w: no answer within %s", ErrHung, timeout)
	case <-ctx.Done():
		b.pending, b.since = done, start
		return zero, ctx.Err()
	}
}
