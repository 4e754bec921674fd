package control

import "sync"

// connCounter counts the connections open from each process and each rank,
// against Config.MaxConnsPerProcess and MaxConnsPerRank, so that a worker
// that dials in a loop runs into a refusal instead of the agent's file
// descriptors and goroutines. It is safe for concurrent use.
type connCounter struct {
	mu     sync.Mutex
	byPID  map[int]int
	byRank map[int]int
}

func newConnCounter() *connCounter {
	return &connCounter{byPID: make(map[int]int), byRank: make(map[int]int)}
}

// acquire counts one more connection of pid and rank, or returns the limit
// that refuses it (and counts nothing). release must be called once when
// an acquired connection ends.
func (cc *connCounter) acquire(pid, rank int, cfg Config) *limitError {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if err := checkConn(pid, rank, cc.byPID[pid], cc.byRank[rank], cfg); err != nil {
		return err
	}
	cc.byPID[pid]++
	cc.byRank[rank]++
	return nil
}

// release uncounts a connection that acquire counted.
func (cc *connCounter) release(pid, rank int) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	decrement(cc.byPID, pid)
	decrement(cc.byRank, rank)
}

// decrement lowers m[k] and deletes it at zero, so that the maps hold only
// the processes and ranks with connections open.
func decrement(m map[int]int, k int) {
	if m[k] <= 1 {
		delete(m, k)
		return
	}
	m[k]--
}
