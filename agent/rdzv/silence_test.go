package rdzv

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

func TestSilence(t *testing.T) {
	s := &silence{answered: time.Now(), limit: 10 * time.Second, endpoint: "e:1"}
	boom := errors.New("boom")
	if err := s.tooLong(boom); err != nil {
		t.Errorf("just answered: %v", err)
	}
	var lost *StoreLostError
	if err := s.tooLong(fmt.Errorf("read: %w", store.ErrUnreachable)); !errors.As(err, &lost) || !errors.Is(err, store.ErrUnreachable) {
		t.Errorf("unreachable client: got %v, want a StoreLostError wrapping it", err)
	}
	s.answered = time.Now().Add(-11 * time.Second)
	if err := s.tooLong(boom); !errors.As(err, &lost) || lost.For < 10*time.Second {
		t.Errorf("silent 11 s: got %v", err)
	}
	// What is left of the silence bounds a request, but never below a second.
	ctx, cancel := s.bound(t.Context())
	defer cancel()
	if dl, _ := ctx.Deadline(); time.Until(dl) > time.Second+100*time.Millisecond {
		t.Errorf("bound after the silence ran out: %v, want a second", time.Until(dl))
	}
}
