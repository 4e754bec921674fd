package telemetry

import (
	"testing"
	"time"
)

// TestReformLine: a re-formation's one line says what failed, where every
// rank resumed, whose state they took, and each phase's time.
func TestReformLine(t *testing.T) {
	rf := Reform{Gen: 0, N: 2, Rank: 1, Step: 12, Resume: 11, Source: 3, Error: "RuntimeError: boom",
		Phases: []ReformPhase{{"abort", 300 * time.Microsecond}, {"rendezvous", 40 * time.Millisecond}, {"first_step", 60 * time.Millisecond}}}
	want := "re-formation 2 of generation 0: step 12 failed (RuntimeError: boom); every rank resumed at step 11 with rank 3's state, " +
		"100.3 ms after the fault (abort 0.3 ms, rendezvous 40.0 ms, first_step 60.0 ms)"
	if got := rf.String(); got != want {
		t.Errorf("String() =\n%s\nwant\n%s", got, want)
	}
	if rf.Lost() != 2 {
		t.Errorf("Lost() = %d, want 2 (steps 11 and 12 again)", rf.Lost())
	}
	if (Reform{Step: 12, Resume: 13}).Lost() != 0 {
		t.Errorf("a step every other rank completed is not lost")
	}
}
