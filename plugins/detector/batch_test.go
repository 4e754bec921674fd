package detector

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	detectorv1 "github.com/ddp-agent/ddp-agent/plugins/detector/proto"
)

// A lone verdict goes at once; a storm goes in a few messages, every
// verdict in order; a failed send fails the adds after it.
func TestBatcher(t *testing.T) {
	var mu sync.Mutex
	var batches [][]*detectorv1.Finding
	fail := false
	b := newBatcher(func(m *detectorv1.Findings) error {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			return errors.New("stream broken")
		}
		batches = append(batches, m.Findings)
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { b.run(ctx, errWatchEnded); close(done) }()

	start := time.Now()
	if err := b.add(&detectorv1.Finding{Message: "lone"}); err != nil {
		t.Fatal(err)
	}
	for {
		mu.Lock()
		n := len(batches)
		mu.Unlock()
		if n == 1 {
			break
		}
		if time.Since(start) > time.Second {
			t.Fatal("a lone verdict was not sent")
		}
		time.Sleep(time.Millisecond)
	}
	if d := time.Since(start); d > batchWindow*5 {
		t.Errorf("a lone verdict took %v", d)
	}
	time.Sleep(2 * batchWindow)
	for i := 0; i < 1000; i++ {
		if err := b.add(&detectorv1.Finding{Message: "storm", Subject: string(rune('a' + i%26))}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(5 * batchWindow)
	mu.Lock()
	total, msgs := 0, len(batches)-1
	for _, bt := range batches[1:] {
		for _, f := range bt {
			if f.Subject != string(rune('a'+total%26)) {
				t.Fatalf("verdict %d out of order", total)
			}
			total++
		}
	}
	fail = true
	mu.Unlock()
	if total != 1000 || msgs > 10 {
		t.Errorf("%d verdicts in %d messages, want 1000 in a few", total, msgs)
	}
	time.Sleep(2 * batchWindow)
	_ = b.add(&detectorv1.Finding{Message: "after"})
	<-done
	if err := b.add(&detectorv1.Finding{Message: "later"}); err == nil {
		t.Error("an add after a failed send succeeded")
	}
}
