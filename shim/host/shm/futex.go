package shm

import (
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
