package relay

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

func TestBatching(t *testing.T) {
	rec := newRecorder()
	s := listen(t, "127.0.0.1:0", rec, nil)
	c := dial(t, ClientConfig{Addr: s.Addr(), Fingerprint: s.Fingerprint(), Node: "n", FlushEvery: 100 * time.Millisecond})

	// Many small sends within one flush period go out together.
	at := time.Now()
	for i := range 100 {
		c.Send(steps(i*10, 10, at))
	}
	waitFor(t, "1000 records", 5*time.Second, func() bool { return len(rec.records("n")) == 1000 })
	if b := rec.batchSizes("n"); len(b) > 2 {
		t.Errorf("100 sends in a flush period came in %d batches %v, want 1 (2 if a flush fell among them)", len(b), b)
	}

	// A large send is split into batches of at most sendBatch.
	c.Send(steps(1000, 20000, at))
	waitFor(t, "21000 records", 5*time.Second, func() bool { return len(rec.records("n")) == 21000 })
	b := rec.batchSizes("n")
	if i := slices.Index(b, sendBatch); i < 0 || !slices.Equal(b[i:], []int{sendBatch, sendBatch, 20000 - 2*sendBatch}) {
		t.Errorf("batch sizes: got %v, want them to end with %d, %d, %d", b, sendBatch, sendBatch, 20000-2*sendBatch)
	}
	for i, r := range rec.records("n") {
		if r.Step != uint64(i) {
			t.Fatalf("record %d has step %d: out of order", i, r.Step)
		}
	}
}

func TestDialErrors(t *testing.T) {
	// An address where nothing listens.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	ln.Close()
	s := listen(t, "127.0.0.1:0", newRecorder(), nil)

	for _, tc := range []struct {
		name    string
		cfg     ClientConfig
		timeout time.Duration
		want    error // nil: any error
		within  time.Duration
	}{
		{"leader down", ClientConfig{Addr: down, Fingerprint: s.Fingerprint(), Node: "n", Token: testToken}, 300 * time.Millisecond, context.DeadlineExceeded, time.Second},
		{"bad token", ClientConfig{Addr: s.Addr(), Fingerprint: s.Fingerprint(), Node: "n", Token: "wrong"}, 5 * time.Second, ErrUnauthorized, time.Second},
		{"no token", ClientConfig{Addr: s.Addr(), Fingerprint: s.Fingerprint(), Node: "n"}, 5 * time.Second, nil, 10 * time.Millisecond},
		{"bad address", ClientConfig{Addr: "leader", Fingerprint: s.Fingerprint(), Node: "n", Token: testToken}, 5 * time.Second, nil, 10 * time.Millisecond},
		{"bad node", ClientConfig{Addr: s.Addr(), Fingerprint: s.Fingerprint(), Node: "node\n1", Token: testToken}, 5 * time.Second, nil, 10 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), tc.timeout)
			defer cancel()
			start := time.Now()
			c, err := Dial(ctx, tc.cfg)
			took := time.Since(start)
			if err == nil {
				c.Close()
				t.Fatal("Dial succeeded, want an error")
			}
			t.Log(err)
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
			if took > tc.within {
				t.Errorf("Dial took %v, want at most %v", took, tc.within)
			}
		})
	}
}

// TestLeaderGoneAndBack: with the leader gone, Send keeps returning at
// once and drops are counted; a new leader on the same address gets the
// records again, and the workers.
func TestLeaderGoneAndBack(t *testing.T) {
	log, _ := newTestLog(t)
	rec1 := newRecorder()
	s1 := listen(t, "127.0.0.1:0", rec1, log)
	addr := s1.Addr()
	c := dial(t, ClientConfig{Addr: addr, Fingerprint: s1.Fingerprint(), Node: "n", Log: log, FlushEvery: 10 * time.Millisecond, MaxBuffered: 1000})
	ws := []telemetry.Worker{{Rank: 4, LocalRank: 0, Host: "b", PID: 11, GPU: "GPU-a", GPUIndex: 0}, {Rank: 5, LocalRank: 1, Host: "b", PID: 12, GPUIndex: -1}}
	c.SendWorkers(ws)
	c.Send(steps(0, 10, time.Now()))
	waitFor(t, "the first records", 5*time.Second, func() bool { return len(rec1.records("n")) == 10 && rec1.lastWorkers("n") != nil })

	s1.Close()
	const outage = 5000
	var worst time.Duration
	for i := range outage / 100 {
		start := time.Now()
		c.Send(steps(100+i*100, 100, time.Now()))
		worst = max(worst, time.Since(start))
		time.Sleep(time.Millisecond)
	}
	if worst > 50*time.Millisecond {
		t.Errorf("Send took up to %v with the leader gone, want it never to wait", worst)
	}
	if d := c.Dropped(); d < outage-2*1000 { // at most the buffer and one batch kept
		t.Errorf("dropped: got %d, want at least %d", d, outage-2*1000)
	}

	rec2 := newRecorder()
	relisten(t, s1, rec2, log)
	c.Send(steps(100000, 10, time.Now()))
	waitFor(t, "records after the leader came back", 10*time.Second, func() bool {
		recs := rec2.records("n")
		return len(recs) > 0 && recs[len(recs)-1].Step == 100009
	})
	waitFor(t, "the workers again", 5*time.Second, func() bool { return slices.Equal(rec2.lastWorkers("n"), ws) })
	var during int
	for _, r := range rec2.records("n") {
		if r.Step < 100000 {
			during++
		}
	}
	// The first 10 records reached the old leader, but its close can cut
	// the answer to them: the client then counts them dropped, as it must
	// for a batch sent and not answered (resending could duplicate it).
	// Every record of the outage is delivered or dropped, once.
	if got := uint64(during) + c.Dropped(); got != outage && got != outage+10 {
		t.Errorf("records of the outage: %d delivered + %d dropped = %d, want %d (or %d with the first batch's answer cut)",
			during, c.Dropped(), got, outage, outage+10)
	}
}

// TestWorkersResentAfterRestart: with no records flowing, the hangs poll
// finds the restarted leader, which gets the workers again.
func TestWorkersResentAfterRestart(t *testing.T) {
	log, _ := newTestLog(t)
	rec1 := newRecorder()
	s1 := listen(t, "127.0.0.1:0", rec1, log)
	addr := s1.Addr()
	c := dial(t, ClientConfig{Addr: addr, Fingerprint: s1.Fingerprint(), Node: "n", Log: log})
	v1 := []telemetry.Worker{{Rank: 2, LocalRank: 0, Host: "c", PID: 1, GPUIndex: -1}}
	c.SendWorkers(v1)
	waitFor(t, "the workers", 5*time.Second, func() bool { return slices.Equal(rec1.lastWorkers("n"), v1) })
	v2 := append(slices.Clone(v1), telemetry.Worker{Rank: 3, LocalRank: 1, Host: "c", PID: 2, GPUIndex: -1})
	c.SendWorkers(v2)
	waitFor(t, "the changed workers", 5*time.Second, func() bool { return slices.Equal(rec1.lastWorkers("n"), v2) })

	s1.Close()
	rec2 := newRecorder()
	relisten(t, s1, rec2, nil)
	waitFor(t, "the workers at the new leader", 10*time.Second, func() bool { return slices.Equal(rec2.lastWorkers("n"), v2) })
	rec1.mu.Lock()
	defer rec1.mu.Unlock()
	if n := len(rec1.workers["n"]); n != 2 {
		t.Errorf("the first leader got the workers %d times, want 2 (once per SendWorkers)", n)
	}
}

// TestCloseBounded: Close returns within about a second whatever the
// leader does, and counts what it could not deliver.
func TestCloseBounded(t *testing.T) {
	t.Run("slow leader", func(t *testing.T) {
		release := make(chan struct{})
		var entered atomic.Bool
		rec := newRecorder()
		rec.onRecords = func() { entered.Store(true); <-release }
		s := listen(t, "127.0.0.1:0", rec, nil)
		t.Cleanup(func() { close(release) }) // before the server's Close (cleanups run last first)
		c, err := Dial(t.Context(), ClientConfig{Addr: s.Addr(), Fingerprint: s.Fingerprint(), Node: "n", Token: testToken, FlushEvery: 10 * time.Millisecond, MaxBuffered: 100})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Send(steps(0, 10, time.Now()))
		waitFor(t, "the leader to get stuck", 5*time.Second, entered.Load)

		// The leader does not answer: Send still returns at once, and drops.
		var worst time.Duration
		for i := range 30 {
			start := time.Now()
			c.Send(steps(10+i*10, 10, time.Now()))
			worst = max(worst, time.Since(start))
		}
		if worst > 50*time.Millisecond {
			t.Errorf("Send took up to %v with the leader stuck", worst)
		}
		if d := c.Dropped(); d != 200 {
			t.Errorf("dropped: got %d, want 200 (300 sent, 100 buffered)", d)
		}

		start := time.Now()
		c.Close()
		if took := time.Since(start); took > 1500*time.Millisecond {
			t.Errorf("Close took %v, want about 1 s at most", took)
		}
		if d := c.Dropped(); d != 310 {
			t.Errorf("dropped after Close: got %d, want 310 (all: none was answered)", d)
		}
		c.Send(steps(0, 5, time.Now()))
		if d := c.Dropped(); d != 315 {
			t.Errorf("dropped after a Send after Close: got %d, want 315", d)
		}
		if _, ok := <-c.Hangs(); ok {
			t.Error("Hangs is not closed after Close")
		}
		c.Close() // again: nothing

		// The server, too, gives up on the stuck handler.
		start = time.Now()
		s.Close()
		if took := time.Since(start); took > closeWait+500*time.Millisecond {
			t.Errorf("Server.Close took %v with a stuck handler, want at most about %v", took, closeWait)
		}
	})
	t.Run("leader gone", func(t *testing.T) {
		s := listen(t, "127.0.0.1:0", newRecorder(), nil)
		c, err := Dial(t.Context(), ClientConfig{Addr: s.Addr(), Fingerprint: s.Fingerprint(), Node: "n", Token: testToken})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		c.Send(steps(0, 10, time.Now()))
		start := time.Now()
		c.Close()
		if took := time.Since(start); took > 1200*time.Millisecond {
			t.Errorf("Close took %v, want at most about 1 s", took)
		}
		if d := c.Dropped(); d != 10 {
			t.Errorf("dropped: got %d, want 10", d)
		}
	})
	t.Run("flushes", func(t *testing.T) {
		rec := newRecorder()
		s := listen(t, "127.0.0.1:0", rec, nil)
		c, err := Dial(t.Context(), ClientConfig{Addr: s.Addr(), Fingerprint: s.Fingerprint(), Node: "n", Token: testToken, FlushEvery: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		c.Send(steps(0, 10, time.Now()))
		c.Close()
		if n := len(rec.records("n")); n != 10 || c.Dropped() != 0 {
			t.Errorf("after Close the leader has %d records and %d were dropped, want 10 and 0", n, c.Dropped())
		}
	})
	t.Run("server with polls waiting", func(t *testing.T) {
		s, err := Listen("127.0.0.1:0", testToken, newRecorder(), nil)
		if err != nil {
			t.Fatal(err)
		}
		c := dial(t, ClientConfig{Addr: s.Addr(), Fingerprint: s.Fingerprint(), Node: "n"})
		_ = c
		time.Sleep(50 * time.Millisecond) // the poll is waiting
		start := time.Now()
		if err := s.Close(); err != nil {
			t.Error(err)
		}
		if took := time.Since(start); took > 500*time.Millisecond {
			t.Errorf("Server.Close took %v with a poll waiting, want it to answer the poll at once", took)
		}
		if err := s.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		s.RequestStacks(telemetry.Hang{}) // after Close: nothing
	})
}
