package rdzv

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

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

// TestSilenceStartsAtTheUnansweredFail: a failure's report that the store
// left unanswered starts the count of its silence; an answer since clears
// it; a refusal (an answer) does not start it.
func TestSilenceStartsAtTheUnansweredFail(t *testing.T) {
	e := &Membership{cfg: Config{StoreTimeout: 10 * time.Second}}
	asked := time.Now().Add(-7 * time.Second)
	e.noteAnswer(asked, fmt.Errorf("rendezvous store: %w", context.DeadlineExceeded))
	if s := e.newSilence(); !s.answered.Equal(asked) {
		t.Errorf("silence counted from %v, want the unanswered request's %v", s.answered, asked)
	}
	e.noteAnswer(time.Now(), nil)
	if s := e.newSilence(); time.Since(s.answered) > time.Second {
		t.Errorf("after an answer, silence counted from %v, want now", s.answered)
	}
	e.noteAnswer(asked, fmt.Errorf("rendezvous store: %w", rpctypes.ErrNoSpace))
	if s := e.newSilence(); time.Since(s.answered) > time.Second {
		t.Errorf("a refusal started the silence at %v", s.answered)
	}
}
