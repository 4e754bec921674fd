package e2e

import (
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
	start := time.Now()
	t.Cleanup(func() {
		if took := time.Since(start); took > d {
			t.Logf("over budget: %s took %s of its %s", t.Name(), took.Round(time.Second), d)
		}
	})
}
