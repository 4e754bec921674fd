package rdzv

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"
)

func TestJoinTimeout(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 2, 2)
	cfg.JoinTimeout = 700 * time.Millisecond
	a := open(t, dial(), cfg)
	begin := time.Now()
	_, err := a.Next(t.Context())
	var jt *JoinTimeoutError
	if !errors.As(err, &jt) || jt.Joined != 1 || jt.Min != 2 {
		t.Fatalf("Next: %v", err)
	}
	if d := time.Since(begin); d > 3*time.Second {
		t.Fatalf("join timeout of 700ms took %v", d)
	}
	t.Log(err)
}

// TestManyAgents forms one round of many agents sharing one client, as
// the scale benchmark does with more.
func TestManyAgents(t *testing.T) {
	dial := testStore(t)
	cli := dial()
	const n = 64
	cfg := testConfig(t, n, n)
	cfg.Logger = slog.New(slog.DiscardHandler)
	es := make([]*Membership, n)
	for i := range es {
		c := cfg
		c.Host = fmt.Sprintf("h%d", i)
		es[i] = open(t, cli, c)
	}
	begin := time.Now()
	rounds := nextAll(t, es...)
	t.Logf("%d agents formed a round in %v", n, time.Since(begin))
	checkRounds(t, rounds)
}
