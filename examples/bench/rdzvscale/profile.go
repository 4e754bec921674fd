package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// startLockProfiles samples contended locks and blocking (waits of 100 µs
// and more; shorter ones are scheduling noise here).
func startLockProfiles() {
	runtime.SetMutexProfileFraction(10)
	runtime.SetBlockProfileRate(int(100 * time.Microsecond))
}

// writeLockProfiles writes the mutex and block profiles to prefix.mutex
// and prefix.block.
func writeLockProfiles(prefix string) {
	for _, name := range []string{"mutex", "block"} {
		f, err := os.Create(prefix + "." + name)
		if err != nil {
			fmt.Fprintln(os.Stderr, "rdzvscale:", err)
			return
		}
		_ = pprof.Lookup(name).WriteTo(f, 0)
		f.Close()
	}
}

// cpuProbe spins GOMAXPROCS threads for d and returns how many cores they
// got. On a shared or oversubscribed VM it is well below GOMAXPROCS, and
// every figure of the run is slower for it.
func cpuProbe(d time.Duration) float64 {
	n := runtime.GOMAXPROCS(0)
	c0, t0 := selfCPU(), time.Now()
	var wg sync.WaitGroup
	var sink atomic.Int64
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := int64(0)
			for time.Since(t0) < d {
				for j := range int64(10000) {
					x += j
				}
			}
			sink.Add(x)
		}()
	}
	wg.Wait()
	return float64(selfCPU()-c0) / float64(time.Since(t0))
}

// selfCPU is this process's CPU time (user + system) so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
