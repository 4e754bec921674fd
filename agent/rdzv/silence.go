package rdzv

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// silence is how long the store has answered nothing, as Next sees it:
// past Config.StoreTimeout, Next gives up with *StoreLostError instead of
// retrying until the join timeout. A lost lease says nothing about the
// store (this agent may have been the one frozen), so the count starts
// when Next does; a store that is gone is known sooner from the client,
// whose requests fail with store.ErrUnreachable once no member has been
// connected for the store timeout.
type silence struct {
	// answered is when the store last answered; a request to a store that
	// is gone can itself take opTimeout to fail, so the silence counts
	// from the last answer, not from the first error.
	answered time.Time
	limit    time.Duration
	endpoint string
}

func (e *Membership) newSilence() *silence {
	s := &silence{answered: time.Now(), limit: e.cfg.StoreTimeout, endpoint: e.cfg.Endpoint}
	e.mu.Lock()
	if !e.unanswered.IsZero() {
		// The failure's report to the store went unanswered: the
		// silence began when it was sent, after this agent last ran,
		// not now. Counted from now, an agent that lost two of three
		// members waited the store's timeout twice, and exited 32-38 s
		// after the loss.
		s.answered = e.unanswered
	}
	e.mu.Unlock()
	if s.limit <= 0 {
		s.limit = DefaultStoreTimeout
	}
	return s
}

// markStoreLost records that the store was given up as lost: the agent's
// exit then writes nothing more to it (Leave, the handover).
func (e *Membership) markStoreLost() {
	e.mu.Lock()
	e.storeLost = true
	e.mu.Unlock()
}

// heard records an answer.
func (s *silence) heard() { s.answered = time.Now() }

// bound bounds a request that finds out whether the store is there by
// what is left of the silence allowed (at least a second), so a dead store
// fails the agent when that runs out rather than a request timeout later,
// and by a fifth of the allowance: the client spreads requests over the
// members, and one sent to a member that froze (SIGSTOP, a partitioned
// host) hangs until gRPC's keepalive gives up on it, 10 s at the least.
// Bounded, it fails in time for the next try to reach a live member; a
// whole allowance spent on it made the agent give up on a store that
// still had its quorum.
func (s *silence) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	left := max(time.Until(s.answered.Add(s.limit)), time.Second)
	return context.WithTimeout(ctx, min(left, max(s.limit/5, time.Second)))
}

// noteAnswer records how a request sent at asked fared: err is nil or
// the store's answer (a refusal, a failed compare), or it is the store's
// silence (a deadline, no member to reach).
func (e *Membership) noteAnswer(asked time.Time, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case err == nil:
		e.unanswered = time.Time{}
	case unanswered(err) && e.unanswered.IsZero():
		e.unanswered = asked
	}
}

// unanswered reports whether err says the store gave no answer.
func unanswered(err error) bool {
	for _, silent := range []error{context.DeadlineExceeded, store.ErrUnreachable, rpctypes.ErrNoLeader,
		rpctypes.ErrTimeout, rpctypes.ErrTimeoutDueToLeaderFail, rpctypes.ErrTimeoutDueToConnectionLost} {
		if errors.Is(err, silent) {
			return true
		}
	}
	c := status.Code(err)
	return c == codes.Unavailable || c == codes.DeadlineExceeded
}

// tooLong returns *StoreLostError when the store, which just failed a
// request with err, has been silent too long; nil while it may yet answer.
func (s *silence) tooLong(err error) error {
	d := time.Since(s.answered)
	if d >= s.limit || errors.Is(err, store.ErrUnreachable) {
		return &StoreLostError{Endpoint: s.endpoint, For: max(d, s.limit), Err: err}
	}
	return nil
}
