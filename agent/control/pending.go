package control

import (
	"fmt"
	"sync"
)

// pendingConns counts a sidecar's connections that have not said Hello
// yet. A sidecar admits by the Hello, so its per-process and per-rank
// counts (connCounter) start only after it: before, ~20,700 idle
// connections of one user exhausted its 20,000 file descriptors, and a
// real worker timed out until they dropped. Each pending connection lasts
// at most Config.HandshakeTimeout; this bounds how many there are at
// once, per process (by the socket's pid, when the server can see it)
// and in all. Safe for concurrent use.
type pendingConns struct {
	mu    sync.Mutex
	total int
	byPID map[int]int
}

func newPendingConns() *pendingConns { return &pendingConns{byPID: make(map[int]int)} }

// acquire counts one more pending connection from pid (0: a process in a
// pid namespace the server cannot see, counted in the total only), or
// returns the limit that refuses it. release must follow once an
// acquired connection's Hello was read or given up.
func (p *pendingConns) acquire(pid int, cfg Config) *limitError {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := checkPending(pid, p.byPID[pid], p.total, cfg); err != nil {
		return err
	}
	p.total++
	if pid != 0 {
		p.byPID[pid]++
	}
	return nil
}

func (p *pendingConns) release(pid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.total--
	if pid != 0 {
		decrement(p.byPID, pid)
	}
}

// checkPending decides whether one more connection may wait for its Hello,
// from pid with perProcess waiting already, total in all.
func checkPending(pid, perProcess, total int, cfg Config) *limitError {
	if pid != 0 && perProcess >= cfg.MaxConnsPerProcess {
		return &limitError{limit: "MaxConnsPerProcess", max: int64(cfg.MaxConnsPerProcess), got: int64(perProcess + 1),
			text: fmt.Sprintf("too many control connections: pid %d has %d open without a Hello, the agent's limit is %d per process (MaxConnsPerProcess)",
				pid, perProcess, cfg.MaxConnsPerProcess)}
	}
	if total >= cfg.MaxPendingConns {
		return &limitError{limit: "MaxPendingConns", max: int64(cfg.MaxPendingConns), got: int64(total + 1),
			text: fmt.Sprintf("too many control connections: %d open without a Hello, the agent's limit is %d (MaxPendingConns)",
				total, cfg.MaxPendingConns)}
	}
	return nil
}
