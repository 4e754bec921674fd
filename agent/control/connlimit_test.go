package control

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/agentconn"
	"github.com/ddp-agent/ddp-agent/wire"
)

// dialErr dials with hello and returns Dial's error (closing a client that
// got through).
func dialErr(t *testing.T, s *Server, hello wire.Hello) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := agentconn.Dial(ctx, s.Path(), hello)
	if err == nil {
		c.Close()
	}
	return err
}

// TestConnLimitPerProcess: with the default limits, one process gets 16
// connections; the 17th is refused with an Error that says why and closed,
// and once one closes there is room again.
func TestConnLimitPerProcess(t *testing.T) {
	leakCheck(t)
	warns := newWarnCounter(t)
	s := startServer(t, Config{Logger: slog.New(warns)})
	var clients []*agentconn.Client
	for range DefaultMaxConnsPerProcess {
		c, _ := dial(t, s, selfHello(0))
		clients = append(clients, c)
	}
	for range 3 {
		err := dialErr(t, s, selfHello(0))
		wantLimit(t, "connection 17", err, "MaxConnsPerProcess", "16 per process")
	}
	if got := s.Conns(); got != DefaultMaxConnsPerProcess {
		t.Errorf("Conns: got %d, want %d", got, DefaultMaxConnsPerProcess)
	}
	// The refusal reaches the client before the server logs it.
	waitFor(t, "the limit's warning", func() bool { return warns.count(limitWarning) >= 1 })
	if n := warns.count(limitWarning); n != 1 {
		t.Errorf("limit warnings: got %d, want 1", n)
	}
	// The refused connections took nothing: the accepted ones still work.
	if err := clients[0].KVSet(context.Background(), "k", []byte("v")); err != nil {
		t.Errorf("KVSet on an accepted connection: %v", err)
	}
	clients[0].Close()
	waitFor(t, "the closed connection to be uncounted", func() bool {
		return dialErr(t, s, selfHello(0)) == nil
	})
}

// TestConnLimitPerRank: the rank's limit counts the connections of all its
// processes (here, one).
func TestConnLimitPerRank(t *testing.T) {
	leakCheck(t)
	s := startServer(t, Config{MaxConnsPerRank: 2})
	dial(t, s, selfHello(0))
	dial(t, s, selfHello(0))
	wantLimit(t, "third connection of the rank", dialErr(t, s, selfHello(0)), "MaxConnsPerRank", "rank 3", "2 per rank")
}

// TestConnLimitCountsHandshakes: a connection that never says Hello holds
// its place until the handshake deadline, so a worker cannot get around the
// limit with half-open connections; a rejected Hello frees its place.
func TestConnLimitCountsHandshakes(t *testing.T) {
	leakCheck(t)
	s := startServer(t, Config{MaxConnsPerProcess: 1, HandshakeTimeout: 300 * time.Millisecond})
	rawConn(t, s, false)
	waitFor(t, "the silent connection to be counted", func() bool {
		s.connsPer.mu.Lock()
		defer s.connsPer.mu.Unlock()
		return s.connsPer.byPID[os.Getpid()] == 1
	})
	wantLimit(t, "a second connection", dialErr(t, s, selfHello(0)), "MaxConnsPerProcess")
	waitFor(t, "the silent connection to time out", func() bool {
		return dialErr(t, s, selfHello(0)) == nil
	})
	// Uncounted before unregistered: Conns 0 means there is room.
	waitFor(t, "the client to be gone", func() bool { return s.Conns() == 0 })
	if err := dialErr(t, s, selfHello(7)); !errors.Is(err, wire.ErrStaleGeneration) {
		t.Fatalf("stale Hello: got %v, want %v", err, wire.ErrStaleGeneration)
	}
	waitFor(t, "room after the stale Hello", func() bool { return dialErr(t, s, selfHello(0)) == nil })
}

func TestCheckConn(t *testing.T) {
	cfg := Config{MaxConnsPerProcess: 2, MaxConnsPerRank: 3}
	tests := []struct {
		name             string
		perProcess, rank int
		want             string
	}{
		{"first", 0, 0, ""},
		{"last of the process", 1, 2, ""},
		{"process full", 2, 2, "MaxConnsPerProcess"},
		{"rank full", 0, 3, "MaxConnsPerRank"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := checkConn(42, testRank, tc.perProcess, tc.rank, cfg)
			if (got == nil) != (tc.want == "") || got != nil && got.limit != tc.want {
				t.Errorf("got %v, want limit %q", got, tc.want)
			}
		})
	}
	cc := newConnCounter()
	for range 2 {
		if err := cc.acquire(1, 0, cfg); err != nil {
			t.Fatal(err)
		}
	}
	if err := cc.acquire(1, 0, cfg); err == nil || err.limit != "MaxConnsPerProcess" {
		t.Errorf("third of pid 1: got %v, want MaxConnsPerProcess", err)
	}
	cc.release(1, 0)
	cc.release(1, 0)
	if len(cc.byPID) != 0 || len(cc.byRank) != 0 {
		t.Errorf("after releasing all: got %v %v, want empty maps", cc.byPID, cc.byRank)
	}
}
