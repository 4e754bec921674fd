package e2e

import (
	"syscall"
	"testing"
	"time"
)

// budget states how long test t should take on the 2-core CI machine under
// -race. A test that runs past it is not failed (its time moves with the
// machine's load, and failing on a duration is what makes a suite cry
// wolf); it logs "over budget", which `make test`'s report
// (scripts/testtime) lists at the end, so growth shows the day it happens.
func budget(t *testing.T, d time.Duration) {
	t.Helper()
	start, cpu0 := time.Now(), childrenCPU()
	t.Cleanup(func() {
		took := time.Since(start)
		// The CPU of the processes the test started (agents, workers), when
		// they ran alone: a test that mostly waits can share the machine.
		t.Logf("e2e time: %s wall, %s CPU of its processes", took.Round(100*time.Millisecond), (childrenCPU() - cpu0).Round(100*time.Millisecond))
		if took > d {
			t.Logf("over budget: %s took %s of its %s", t.Name(), took.Round(time.Second), d)
		}
	})
}

// childrenCPU is the user and system time of this process's reaped
// descendants (agents reap their workers).
func childrenCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
