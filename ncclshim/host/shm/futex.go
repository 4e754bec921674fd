package shm

import (
	"context"
	"syscall"
	"time"
	"unsafe"
)

// Futex operations, without FUTEX_PRIVATE_FLAG: the words live in memory
// shared between processes.
const (
	futexWaitOp = 0
	futexWakeOp = 1
)

// futexWait sleeps while *addr == val, for at most d; wake-ups, timeouts,
// signals and a changed value all just return (the caller re-checks).
func futexWait(addr *uint32, val uint32, d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitOp, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every sleeper on addr.
func futexWake(addr *uint32) {
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakeOp, 1<<31-1, 0, 0, 0)
}

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
