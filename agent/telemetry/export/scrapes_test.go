package export

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestScrapesWaitNext: nothing is waited for before the first scrape; after
// it, the wait ends with the next scrape begun after it started, or at the
// bound.
func TestScrapesWaitNext(t *testing.T) {
	s := newScrapes()
	release := make(chan struct{})
	srv := httptest.NewServer(s.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("slow") != "" {
			<-release
		}
	})))
	defer srv.Close()
	ctx := context.Background()
	start := time.Now()
	if s.waitNext(ctx, time.Minute) || time.Since(start) > time.Second {
		t.Fatal("waited although nothing ever scraped")
	}
	scrape := func(q string) {
		resp, err := http.Get(srv.URL + "/metrics" + q)
		if err != nil {
			t.Error(err)
			return
		}
		resp.Body.Close()
	}
	scrape("")
	if s.waitNext(ctx, 50*time.Millisecond) {
		t.Fatal("a scrape from before the wait counted")
	}
	// A scrape begun before the wait and answered during it read the old
	// state: it does not end the wait; the next one does.
	go scrape("?slow=1")
	for !func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.started == 2 }() {
		time.Sleep(time.Millisecond)
	}
	got := make(chan bool)
	go func() { got <- s.waitNext(ctx, time.Minute) }()
	time.Sleep(20 * time.Millisecond)
	close(release)
	select {
	case <-got:
		t.Fatal("the wait ended with a scrape begun before it")
	case <-time.After(50 * time.Millisecond):
	}
	scrape("")
	if !<-got {
		t.Fatal("the next scrape did not end the wait")
	}
}
