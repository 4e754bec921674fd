package main

import (
	"sync"

	"github.com/ddp-agent/ddp-agent/shim/comm"
	"github.com/ddp-agent/ddp-agent/shim/status"
)

// table maps the integer handles the C ABI hands out to communicators and
// works; no Go pointer crosses into C. Handles are never reused, so a stale
// one is recognized.
type table struct {
	mu     sync.Mutex
	next   int64
	comms  map[int64]*comm.Comm
	works  map[int64]*comm.Work
	closed map[int64]bool // comm handles already closed
}

func newTable() *table {
	return &table{next: 1, comms: map[int64]*comm.Comm{}, works: map[int64]*comm.Work{}, closed: map[int64]bool{}}
}

func (t *table) addComm(c *comm.Comm) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.next
	t.next++
	t.comms[h] = c
	return h
}

func (t *table) addWork(w *comm.Work) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.next
	t.next++
	t.works[h] = w
	return h
}

func (t *table) comm(h int64) (*comm.Comm, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c, ok := t.comms[h]; ok {
		return c, nil
	}
	if t.closed[h] {
		return nil, status.Errorf(status.Closed, "communicator %d is closed", h)
	}
	return nil, status.Errorf(status.Invalid, "no communicator with handle %d", h)
}

// takeComm removes a communicator from the table, for closing.
func (t *table) takeComm(h int64) (*comm.Comm, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, ok := t.comms[h]
	if !ok {
		if t.closed[h] {
			return nil, status.Errorf(status.Closed, "communicator %d is already closed", h)
		}
		return nil, status.Errorf(status.Invalid, "no communicator with handle %d", h)
	}
	delete(t.comms, h)
	t.closed[h] = true
	return c, nil
}

func (t *table) work(h int64) (*comm.Work, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if w, ok := t.works[h]; ok {
		return w, nil
	}
	return nil, status.Errorf(status.Invalid, "no work with handle %d (freed, or never returned by ddpshim_allreduce or ddpshim_broadcast)", h)
}

func (t *table) freeWork(h int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.works[h]; !ok {
		return status.Errorf(status.Invalid, "no work with handle %d (freed twice?)", h)
	}
	delete(t.works, h)
	return nil
}
