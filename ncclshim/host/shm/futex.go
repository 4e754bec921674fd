package shm

import (
	"runtime"
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

// yield is await's pause while it spins. It is not runtime.Gosched on every
// call: the shim's collectives mostly run on a thread that a cgo call has
// locked, where Gosched hands the P to another thread and wakes this one
// back, a pair of futex calls each time (most of a small all-reduce's time
// when await called it every 64 loads). Nor sched_yield(2): an executor
// goroutine that yields its core to a caller polling ddpshim_work_test
// gets it back a time slice later. So it only spins, and every 1024th call
// (well after spinFor, unless the counter's cache line bounces fast) lets
// the Go scheduler run other goroutines, for ranks that share a process and
// its Ps (the tests).
func yield(i int) {
	if i%(64*1024) == 0 {
		runtime.Gosched()
	}
}
