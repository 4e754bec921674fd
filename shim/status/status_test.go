package status

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ddp-agent/ddp-agent/shim/failure"
)

func TestOf(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, OK},
		{"coded", fmt.Errorf("x: %w", Errorf(Unavailable, "no agent")), Unavailable},
		{"closed", fmt.Errorf("x: %w", failure.ErrClosed), Closed},
		{"aborted by a cause", AbortedBy(errors.New("peer gone")), Aborted},
		{"aborted by close", AbortedBy(failure.ErrClosed), Closed},
		{"host timeout", fmt.Errorf("x: %w", failure.ErrTimeout), Timeout},
		{"mismatch", fmt.Errorf("x: %w", failure.ErrMismatch), Mismatch},
		{"peer", failure.Peer(1, failure.PeerLost, fmt.Errorf("x: %w", failure.ErrPeer)), Peer},
		{"peer after an abort", fmt.Errorf("%w: failed earlier: %w", failure.ErrAborted, failure.ErrPeer), Peer},
		{"aborted", fmt.Errorf("x: %w", failure.ErrAborted), Aborted},
		{"closed while aborting", fmt.Errorf("%w: %w", failure.ErrAborted, failure.ErrClosed), Closed},
		{"invalid", fmt.Errorf("x: %w", failure.ErrInvalid), Invalid},
		{"cancelled", context.Canceled, Aborted},
		{"deadline", context.DeadlineExceeded, Timeout},
		{"other", errors.New("x"), Internal},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Of(tc.err); got != tc.want {
				t.Errorf("got %d, want %d", got, tc.want)
			}
		})
	}
}
