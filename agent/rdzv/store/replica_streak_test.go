package store

import (
	"errors"
	"testing"
	"time"
)

// TestFailStreak: a warning once failures have lasted streakWarn, once per
// streak, and word when they end; a short streak is not told.
func TestFailStreak(t *testing.T) {
	t0 := time.Unix(1000, 0)
	boom := errors.New("boom")
	var f failStreak
	for _, tc := range []struct {
		err  error
		at   time.Duration
		want streakNews
	}{
		{boom, 0, streakNone},
		{boom, streakWarn - time.Millisecond, streakNone},
		{nil, streakWarn, streakNone}, // short: nothing to tell
		{boom, 6 * time.Second, streakNone},
		{boom, 6*time.Second + streakWarn, streakLong},
		{boom, 20 * time.Second, streakNone}, // once per streak
		{nil, 21 * time.Second, streakOver},
		{nil, 22 * time.Second, streakNone},
	} {
		if got := f.see(tc.err, t0.Add(tc.at)); got != tc.want {
			t.Fatalf("at %v (err %v): %v, want %v", tc.at, tc.err, got, tc.want)
		}
	}
	if d := f.For(t0.Add(30 * time.Second)); d != 0 {
		t.Errorf("For outside a streak = %v, want 0", d)
	}
}
