package store

import "time"

// failStreak tells a replica manager when its failures are worth a
// warning. One failed look is routine (a member lost a moment ago, a
// learner that another agent added first); a manager that fails look after
// look for streakWarn cannot replace a lost member, and the store runs
// short without anyone being told why.
type failStreak struct {
	since  time.Time // the first failure of the streak; zero: the last step succeeded
	warned bool
}

// streakWarn is how long failures must last before they are told.
const streakWarn = 5 * time.Second

type streakNews int

const (
	streakNone streakNews = iota
	streakLong            // failing for streakWarn: warn, once per streak
	streakOver            // a warned streak ended
)

// see records one step's outcome at now and says what is worth telling.
func (f *failStreak) see(err error, now time.Time) streakNews {
	if err == nil {
		warned := f.warned
		*f = failStreak{}
		if warned {
			return streakOver
		}
		return streakNone
	}
	if f.since.IsZero() {
		f.since = now
	}
	if !f.warned && now.Sub(f.since) >= streakWarn {
		f.warned = true
		return streakLong
	}
	return streakNone
}

// For is how long the streak has lasted at now; 0 outside one.
func (f *failStreak) For(now time.Time) time.Duration {
	if f.since.IsZero() {
		return 0
	}
	return now.Sub(f.since)
}
