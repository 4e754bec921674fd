package host

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// TestPeerErrorNamesThePeer: a collective that fails because a peer left
// says which peer and how, over TCP and over shared memory: the shim
// notes it for the agent, which must not take the survivor for the root
// cause. A peer that closes is "closed"; one that aborts (its connections
// drop without a goodbye, or its abort flag goes up) is "lost" or
// "aborted".
func TestPeerErrorNamesThePeer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		shm   bool
		leave func(*Comm)
		kinds []failure.PeerKind
	}{
		{"tcp close", false, func(c *Comm) { c.Close() }, []failure.PeerKind{failure.PeerClosed}},
		{"shm close", true, func(c *Comm) { c.Close() }, []failure.PeerKind{failure.PeerClosed}},
		{"tcp abort", false, func(c *Comm) { c.Abort(errors.New("test")) }, []failure.PeerKind{failure.PeerLost}},
		{"shm abort", true, func(c *Comm) { c.Abort(errors.New("test")) }, []failure.PeerKind{failure.PeerLost, failure.PeerAborted}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := connectWith(t, 2, Config{SHM: tc.shm, Timeout: 20 * time.Second}, nil)
			tc.leave(comms[1])
			err := comms[0].AllReduce(t.Context(), make([]byte, 4096), reduce.Float32, reduce.Sum)
			var pe *failure.PeerError
			if !errors.As(err, &pe) {
				t.Fatalf("got %v, want a failure.PeerError", err)
			}
			if pe.Rank != 1 || !slices.Contains(tc.kinds, pe.Kind) {
				t.Errorf("failure.PeerError rank %d kind %q, want rank 1 kind in %q (%v)", pe.Rank, pe.Kind, tc.kinds, err)
			}
			if !errors.Is(err, failure.ErrPeer) {
				t.Errorf("%v does not wrap failure.ErrPeer", err)
			}
		})
	}
	t.Run("timeout", func(t *testing.T) {
		comms := connectWith(t, 2, Config{Timeout: 200 * time.Millisecond}, nil)
		err := comms[0].AllReduce(t.Context(), make([]byte, 4096), reduce.Float32, reduce.Sum) // rank 1 never comes
		var pe *failure.PeerError
		if !errors.Is(err, failure.ErrTimeout) || errors.As(err, &pe) {
			t.Errorf("got %v, want failure.ErrTimeout and no failure.PeerError: a timeout names nobody", err)
		}
	})
}
