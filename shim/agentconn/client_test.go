package agentconn

import (
	"context"
	"errors"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/wire"
)

// TestDial: the Hello goes out as request 1 with every field, and the
// agent's Welcome comes back as it was sent.
func TestDial(t *testing.T) {
	a := startAgent(t, welcome)
	hello := wire.Hello{Rank: 5, LocalRank: 1, PID: 4242, Generation: 7, Transports: []string{"host"}}
	c, w, err := Dial(t.Context(), a.path, hello)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := <-a.hello
	if got.id != 1 || !reflect.DeepEqual(got.m, hello) {
		t.Errorf("agent got request %d %+v, want 1 %+v", got.id, got.m, hello)
	}
	want := wire.Welcome{JobID: "job-1", Generation: 7, WorldSize: 2, Rank: 5, Config: map[string]string{"k": "v"}}
	if !reflect.DeepEqual(w, want) {
		t.Errorf("got %+v, want %+v", w, want)
	}
}

// TestDialFails: every way the handshake can fail returns an error, with
// the agent's refusal as a *wire.RemoteError, and leaves nothing open.
func TestDialFails(t *testing.T) {
	tests := []struct {
		name   string
		answer func(wire.Hello) wire.Message
		want   error
	}{
		{"denied", func(wire.Hello) wire.Message {
			return wire.Error{Code: wire.CodeDenied, Message: "pid 1 is not a worker"}
		}, wire.ErrDenied},
		{"stale generation", func(wire.Hello) wire.Message {
			return wire.Error{Code: wire.CodeStaleGeneration, Message: "generation 3 < 4"}
		}, wire.ErrStaleGeneration},
		{"not a welcome", func(wire.Hello) wire.Message { return wire.OK{} }, wire.ErrMalformed},
		{"silent agent", nil, context.DeadlineExceeded},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := startAgent(t, tc.answer)
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			c, _, err := Dial(ctx, a.path, wire.Hello{Rank: 1})
			if err == nil {
				c.Close()
				t.Fatal("got a client, want an error")
			}
			// The socket's deadline is ctx's, and may fire before ctx
			// says it is done: either error says the handshake ran out of time.
			timedOut := tc.want == context.DeadlineExceeded && errors.Is(err, os.ErrDeadlineExceeded)
			if !errors.Is(err, tc.want) && !timedOut {
				t.Errorf("got %v, want %v", err, tc.want)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("returned after %v, want within the handshake's deadline", d)
			}
			var re *wire.RemoteError
			if errors.Is(tc.want, wire.ErrDenied) && (!errors.As(err, &re) || !strings.Contains(err.Error(), "pid 1 is not a worker")) {
				t.Errorf("got %v, want a *wire.RemoteError with the agent's message", err)
			}
			// The client hung up: the agent sees its end close.
			waitClosed(t, a.closed, "the agent's connection")
		})
	}
	t.Run("no agent", func(t *testing.T) {
		_, _, err := Dial(t.Context(), t.TempDir()+"/none.sock", wire.Hello{})
		if err == nil || !strings.Contains(err.Error(), "dial control socket") {
			t.Errorf("got %v, want the dial's error", err)
		}
	})
}

// TestKV: KVSet and KVGet as requests and replies, the KVGet's timeout as
// the agent receives it, and the agent's errors.
func TestKV(t *testing.T) {
	a := startAgent(t, welcome)
	c := dial(t, a)

	errc := make(chan error, 1)
	go func() { errc <- c.KVSet(t.Context(), "ddpshim/x/0", []byte("blob")) }()
	r := a.next()
	if want := (wire.KVSet{Key: "ddpshim/x/0", Value: []byte("blob")}); !reflect.DeepEqual(r.m, want) {
		t.Errorf("agent got %+v, want %+v", r.m, want)
	}
	a.reply(r.id, wire.OK{})
	if err := <-errc; err != nil {
		t.Errorf("KVSet: %v", err)
	}

	gets := []struct {
		name    string
		timeout time.Duration
		wantMS  uint32
		answer  wire.Message
		want    error // nil: the value comes back
	}{
		{"value", 1500 * time.Millisecond, 1500, wire.KVValue{Value: []byte("v")}, nil},
		{"agent's default", 0, 0, wire.KVValue{Value: []byte("v")}, nil},
		{"under a millisecond", time.Microsecond, 1, wire.KVValue{Value: []byte("v")}, nil},
		{"capped", time.Hour, uint32(wire.MaxKVGetTimeout.Milliseconds()), wire.KVValue{Value: []byte("v")}, nil},
		{"agent timeout", time.Second, 1000, wire.Error{Code: wire.CodeTimeout, Message: "no key"}, wire.ErrTimeout},
		{"limit", time.Second, 1000, wire.Error{Code: wire.CodeLimit, Message: "quota"}, wire.ErrLimit},
		{"wrong reply", time.Second, 1000, wire.OK{}, wire.ErrMalformed},
	}
	for _, tc := range gets {
		t.Run(tc.name, func(t *testing.T) {
			type result struct {
				v   []byte
				err error
			}
			res := make(chan result, 1)
			go func() {
				v, err := c.KVGet(t.Context(), "k", tc.timeout)
				res <- result{v, err}
			}()
			r := a.next()
			if want := (wire.KVGet{Key: "k", TimeoutMillis: tc.wantMS}); !reflect.DeepEqual(r.m, want) {
				t.Errorf("agent got %+v, want %+v", r.m, want)
			}
			a.reply(r.id, tc.answer)
			got := <-res
			switch {
			case tc.want == nil && (got.err != nil || string(got.v) != "v"):
				t.Errorf("got %q, %v; want \"v\"", got.v, got.err)
			case tc.want != nil && !errors.Is(got.err, tc.want):
				t.Errorf("got %v, want %v", got.err, tc.want)
			}
		})
	}
}

// TestRepliesByID: replies reach their callers by request id, whatever
// order the agent answers in; a reply nobody waits for is dropped.
func TestRepliesByID(t *testing.T) {
	a := startAgent(t, welcome)
	c := dial(t, a)
	const n = 4
	var wg sync.WaitGroup
	got := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := c.KVGet(t.Context(), string(rune('a'+i)), time.Second)
			got[i], errs[i] = string(v), err
		}()
	}
	reqs := make([]request, n)
	for i := range n {
		reqs[i] = a.next()
	}
	a.reply(1<<30, wire.OK{}) // an id nobody asked with
	for i := n - 1; i >= 0; i-- {
		key := reqs[i].m.(wire.KVGet).Key
		a.reply(reqs[i].id, wire.KVValue{Value: []byte("value of " + key)})
	}
	wg.Wait()
	for i := range n {
		if want := "value of " + string(rune('a'+i)); errs[i] != nil || got[i] != want {
			t.Errorf("call %d: got %q, %v; want %q", i, got[i], errs[i], want)
		}
	}
}

// TestCancelledCall: a call whose ctx ends returns ctx's error at once;
// the agent's late reply is dropped, and the connection stays usable.
func TestCancelledCall(t *testing.T) {
	a := startAgent(t, welcome)
	c := dial(t, a)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := c.KVGet(ctx, "slow", time.Minute)
		errc <- err
	}()
	late := a.next()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
	a.reply(late.id, wire.KVValue{Value: []byte("late")})

	go func() { errc <- c.KVSet(t.Context(), "k", nil) }()
	r := a.next()
	a.reply(r.id, wire.OK{})
	if err := <-errc; err != nil {
		t.Errorf("next call: %v", err)
	}
}

// TestSendEvents: events go out unanswered, as request 0.
func TestSendEvents(t *testing.T) {
	a := startAgent(t, welcome)
	c := dial(t, a)
	ev := wire.Events{Dropped: 2, Events: []wire.CollectiveEvent{{Step: 9, Bucket: 1, Bytes: 4096, TArrive: 1, TStart: 2, TEnd: 3}}}
	if err := c.SendEvents(ev); err != nil {
		t.Fatal(err)
	}
	r := a.next()
	if r.id != 0 || !reflect.DeepEqual(r.m, ev) {
		t.Errorf("agent got request %d %+v, want 0 %+v", r.id, r.m, ev)
	}
}

// TestAbort: the agent's Abort closes Aborted with its reason and Told
// set; the connection still carries calls (the shim decides what to do).
func TestAbort(t *testing.T) {
	a := startAgent(t, welcome)
	c := dial(t, a)
	if c.AbortReason() != "" || c.Told() {
		t.Fatalf("before Abort: reason %q told %v", c.AbortReason(), c.Told())
	}
	a.reply(0, wire.Abort{Reason: "rank 3 failed"})
	waitClosed(t, c.Aborted(), "Aborted")
	if got := c.AbortReason(); got != "rank 3 failed" || !c.Told() {
		t.Errorf("got reason %q told %v, want %q told", got, c.Told(), "rank 3 failed")
	}
	a.reply(0, wire.Abort{Reason: "again"}) // a second Abort changes nothing
	errc := make(chan error, 1)
	go func() { errc <- c.KVSet(t.Context(), "k", nil) }()
	r := a.next()
	a.reply(r.id, wire.OK{})
	if err := <-errc; err != nil {
		t.Errorf("call after Abort: %v", err)
	}
	if got := c.AbortReason(); got != "rank 3 failed" {
		t.Errorf("after a second Abort: reason %q, want the first", got)
	}
}

// TestConnectionLost: an agent that goes away fails the calls in flight
// and later ones with ErrClosed, and closes Aborted without Told: a lost
// sidecar is not an order to stop.
func TestConnectionLost(t *testing.T) {
	a := startAgent(t, welcome)
	c := dial(t, a)
	errc := make(chan error, 1)
	go func() {
		_, err := c.KVGet(t.Context(), "k", time.Minute)
		errc <- err
	}()
	a.next()
	a.hangUp()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Errorf("call in flight: got %v, want ErrClosed", err)
	}
	waitClosed(t, c.Aborted(), "Aborted")
	if c.Told() || !strings.HasPrefix(c.AbortReason(), "control connection lost") {
		t.Errorf("got reason %q told %v, want a lost connection, not told", c.AbortReason(), c.Told())
	}
	if err := c.KVSet(t.Context(), "k", nil); !errors.Is(err, ErrClosed) {
		t.Errorf("later call: got %v, want ErrClosed", err)
	}
	if err := c.SendEvents(wire.Events{}); !errors.Is(err, ErrClosed) {
		t.Errorf("later events: got %v, want ErrClosed", err)
	}
}

// TestClose: Close fails the calls in flight with ErrClosed, closes
// Aborted as the client's own doing, hangs up on the agent and is
// idempotent.
func TestClose(t *testing.T) {
	a := startAgent(t, welcome)
	c := dial(t, a)
	errc := make(chan error, 1)
	go func() {
		_, err := c.KVGet(t.Context(), "k", time.Minute)
		errc <- err
	}()
	a.next()
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Errorf("call in flight: got %v, want ErrClosed", err)
	}
	waitClosed(t, c.Aborted(), "Aborted")
	if c.Told() || c.AbortReason() != "control client closed" {
		t.Errorf("got reason %q told %v, want the client's close", c.AbortReason(), c.Told())
	}
	waitClosed(t, a.closed, "the agent's connection")
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := c.KVSet(t.Context(), "k", nil); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: got %v, want ErrClosed", err)
	}
}
