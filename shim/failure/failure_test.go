package failure

import (
	"errors"
	"fmt"
	"testing"
)

// TestPeerError: a PeerError wraps its kind, and one transport nested in
// another (the hierarchy's shared memory under the ring) renames the peer
// by wrapping again: errors.As finds the outer, translated one.
func TestPeerError(t *testing.T) {
	inner := Peer(1, PeerAborted, fmt.Errorf("%w: rank 1 raised the abort flag", ErrPeer))
	outer := Peer(5, inner.Kind, fmt.Errorf("within the host: %w", inner))
	err := fmt.Errorf("all-reduce on rank 4: %w", outer)

	var pe *PeerError
	if !errors.As(err, &pe) || pe.Rank != 5 || pe.Kind != PeerAborted {
		t.Fatalf("got %+v, want rank 5 aborted", pe)
	}
	if !errors.Is(err, ErrPeer) || errors.Is(err, ErrAborted) {
		t.Errorf("%v: want ErrPeer and not ErrAborted", err)
	}
	if got, want := err.Error(), "all-reduce on rank 4: within the host: peer failed: rank 1 raised the abort flag"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
