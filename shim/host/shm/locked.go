package shm

import "context"

// lockedKey marks a context whose caller runs on a locked thread.
type lockedKey struct{}

// OnLockedThread marks ctx as that of a caller whose goroutine is locked to
// its OS thread, as a goroutine serving a call from C (cgo) is: await then
// spins without runtime.Gosched, which costs such a goroutine a hand-off of
// its P to another thread and a wake-up back, two futex calls, every time
// (most of a small all-reduce's time when await yielded every 64 loads; a
// perf profile showed it). Others yield, so that ranks sharing a process
// and its Ps (the tests) let each other run.
func OnLockedThread(ctx context.Context) context.Context {
	return context.WithValue(ctx, lockedKey{}, true)
}

func onLockedThread(ctx context.Context) bool {
	v, _ := ctx.Value(lockedKey{}).(bool)
	return v
}
