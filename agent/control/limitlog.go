package control

import (
	"log/slog"
	"sync"
	"time"
)

// limitLogEvery is how often the agent logs the refusals of one limit for
// one rank: a worker that retries in a loop would otherwise write a line per
// request.
const limitLogEvery = 30 * time.Second

// limitLog writes the agent's warning when a limit refuses a worker: one
// line for the first refusal of a rank by a limit, then at most one per
// limitLogEvery, with how many it left out in between. It is safe for
// concurrent use.
type limitLog struct {
	log   *slog.Logger
	every time.Duration

	mu     sync.Mutex
	states map[limitLogKey]limitLogState // bounded: the ranks times the limits
}

type limitLogKey struct {
	rank  int
	limit string
}

// limitLogState is what limitLog remembers of one rank and limit.
type limitLogState struct {
	logged     time.Time // when the last line was written; zero: never
	suppressed int       // refusals since then, not logged
}

func newLimitLog(log *slog.Logger, every time.Duration) *limitLog {
	return &limitLog{log: log, every: every, states: make(map[limitLogKey]limitLogState)}
}

// refused records that e refused a request or connection of rank (from
// pid), and logs it unless a line for the same rank and limit was written
// less than every ago.
func (l *limitLog) refused(now time.Time, rank, pid int, e *limitError) {
	k := limitLogKey{rank, e.limit}
	l.mu.Lock()
	st, write, left := nextLimitLog(l.states[k], now, l.every)
	l.states[k] = st
	l.mu.Unlock()
	if write {
		l.log.Warn("worker over a control socket limit, refused", "rank", rank, "pid", pid,
			"limit", e.limit, "max", e.max, "requested", e.got, "not_logged_before", left, "err", e.text)
	}
}

// nextLimitLog decides whether one more refusal is logged at now, given the
// state of its rank and limit; left is how many refusals the line is the
// first after.
func nextLimitLog(st limitLogState, now time.Time, every time.Duration) (next limitLogState, write bool, left int) {
	if !st.logged.IsZero() && now.Sub(st.logged) < every {
		st.suppressed++
		return st, false, 0
	}
	return limitLogState{logged: now}, true, st.suppressed
}
