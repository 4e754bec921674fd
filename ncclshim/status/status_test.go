package status

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ddp-agent/ddp-agent/ncclshim/host"
)

func TestOf(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, OK},
		{"coded", fmt.Errorf("x: %w", Errorf(Unavailable, "no agent")), Unavailable},
		{"closed", fmt.Errorf("x: %w", ErrClosed), Closed},
		{"aborted by a cause", AbortedBy(errors.New("peer gone")), Aborted},
		{"aborted by close", AbortedBy(ErrClosed), Closed},
		{"host timeout", fmt.Errorf("x: %w", host.ErrTimeout), Timeout},
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
