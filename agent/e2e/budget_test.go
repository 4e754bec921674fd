package e2e

import (
	"os"
	"strings"
	"sync"
	"sync/atomic"
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
	start, cpu0 := time.Now(), testCPU(t)
	t.Cleanup(func() {
		took := time.Since(start)
		// The CPU of the processes the test started (agents, launchers and,
		// through them, workers and plugins): a test that mostly waits can
		// run alongside others.
		t.Logf("e2e time: %s wall, %s CPU of its processes", took.Round(100*time.Millisecond), (testCPU(t) - cpu0).Round(100*time.Millisecond))
		if took > d {
			t.Logf("over budget: %s took %s of its %s", t.Name(), took.Round(time.Second), d)
		}
	})
}

// budgetAlongside is budget for a test that runs alongside the other such
// tests (t.Parallel), once the package's other tests are done: it spends
// most of its time waiting (steps that sleep, timeouts, a straggler's
// confirmation) and asserts no duration tight enough for a loaded machine
// to break. The tests with tight bounds, or that load the machine, stay
// out of it. -parallel bounds how many run at once (make test: 3).
func budgetAlongside(t *testing.T, d time.Duration) {
	t.Helper()
	if os.Getenv("E2E_SERIAL") == "" {
		t.Parallel()
	}
	budget(t, d)
}

// cpuByTest is the CPU time of each top-level test's reaped processes, a
// process's own and that of the descendants it reaped (an agent reaps its
// workers): with tests running alongside each other, the rusage of this
// whole process would mix them.
var cpuByTest sync.Map // top-level test name → *atomic.Int64 (ns)

// addCPU counts the CPU of a process of test t that has been waited for.
func addCPU(t *testing.T, ps *os.ProcessState) {
	if ps == nil {
		return
	}
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok {
		return
	}
	v, _ := cpuByTest.LoadOrStore(topTest(t), new(atomic.Int64))
	v.(*atomic.Int64).Add(ru.Utime.Nano() + ru.Stime.Nano())
}

// testCPU is the CPU counted so far for t's top-level test.
func testCPU(t *testing.T) time.Duration {
	v, ok := cpuByTest.Load(topTest(t))
	if !ok {
		return 0
	}
	return time.Duration(v.(*atomic.Int64).Load())
}

func topTest(t *testing.T) string {
	name, _, _ := strings.Cut(t.Name(), "/")
	return name
}
