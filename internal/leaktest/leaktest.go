// Package leaktest finds goroutines a test binary left running, for the
// TestMain of packages whose tests start background goroutines.
package leaktest

import (
	"fmt"
	"runtime"
	"strings"
	"time"
)

// Check waits up to wait for every goroutine whose stack mentions pkg (a
// package's import path, such as "shim/host") or one of also (more
// import paths, such as "net/http") to end, other than the one running
// pkg's TestMain, and returns an error listing those still running.
func Check(pkg string, wait time.Duration, also ...string) error {
	name := pkg[strings.LastIndexByte(pkg, '/')+1:]
	var leaked []string
	for end := time.Now().Add(wait); ; time.Sleep(20 * time.Millisecond) {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		leaked = leaked[:0]
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, name+".TestMain") || strings.Contains(g, "leaktest.Check") {
				continue
			}
			for _, p := range append([]string{pkg}, also...) {
				if strings.Contains(g, p+".") {
					leaked = append(leaked, g)
					break
				}
			}
		}
		if len(leaked) == 0 {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("%d goroutines leaked:\n%s", len(leaked), strings.Join(leaked, "\n\n"))
		}
	}
}

// CheckCount waits up to wait for the number of goroutines to fall back
// to before (runtime.NumGoroutine at the start of TestMain), and returns
// an error with every goroutine's stack if it does not: for packages whose
// leaks would be in other packages' code (an SDK's, the runtime's).
func CheckCount(before int, wait time.Duration) error {
	for deadline := time.Now().Add(wait); runtime.NumGoroutine() > before && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<16)
		return fmt.Errorf("leaked goroutines: %d > %d\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
	return nil
}
