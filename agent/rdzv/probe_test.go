package rdzv

import (
	"context"
	"testing"
)

// TestCheckPeers: with every other agent's liveness port accepting,
// CheckPeers finds no one gone; where the node list cannot be read it
// cannot tell; an agent whose port refuses (its process gone) is gone,
// on a real store.
func TestCheckPeers(t *testing.T) {
	cli := testStore(t)
	a := open(t, cli(), testConfig(t, 1, 2))
	b := open(t, cli(), testConfig(t, 1, 2))
	if got := a.CheckPeers(t.Context()); got != PeersAnswered {
		t.Fatalf("both agents up: got %v, want PeersAnswered", got)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if got := a.CheckPeers(ctx); got != PeersUnknown {
		t.Fatalf("node list unread: got %v, want PeersUnknown", got)
	}
	b.probe.Close() // its probe port refuses, as after SIGKILL, while its lease runs on
	if got := a.CheckPeers(t.Context()); got != PeerGone {
		t.Fatalf("the other agent gone: got %v, want PeerGone", got)
	}
	// Its lease revoked, its node key went with it: nobody left to probe.
	if got := a.CheckPeers(t.Context()); got != PeersAnswered {
		t.Fatalf("after the revoke: got %v, want PeersAnswered", got)
	}
}
