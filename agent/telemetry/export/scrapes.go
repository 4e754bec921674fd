package export

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// scrapes follows the reads of /metrics, so that the end of a job can
// wait for a scraper to read its last state: a job ended by its first
// hang was gone before Prometheus came back, and an alert on
// ddp_hangs_total could never fire for it.
type scrapes struct {
	mu      sync.Mutex
	started int           // scrapes begun
	done    int           // the highest begun scrape that has been answered
	changed chan struct{} // closed when done moves
}

func newScrapes() *scrapes { return &scrapes{changed: make(chan struct{})} }

// wrap counts h's requests.
func (s *scrapes) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.started++
		id := s.started
		s.mu.Unlock()
		h.ServeHTTP(w, r)
		s.mu.Lock()
		if id > s.done {
			s.done = id
			close(s.changed)
			s.changed = make(chan struct{})
		}
		s.mu.Unlock()
	})
}

// any reports whether a scrape ever began.
func (s *scrapes) any() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started > 0
}

// waitNext waits, at most max, for a scrape begun after the call to be
// answered. Nothing is waited for when nothing ever scraped: no scraper
// is coming. It reports whether such a scrape came.
func (s *scrapes) waitNext(ctx context.Context, max time.Duration) bool {
	s.mu.Lock()
	after := s.started
	s.mu.Unlock()
	if after == 0 {
		return false
	}
	timer := time.NewTimer(max)
	defer timer.Stop()
	for {
		s.mu.Lock()
		done, changed := s.done, s.changed
		s.mu.Unlock()
		if done > after {
			return true
		}
		select {
		case <-changed:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}
