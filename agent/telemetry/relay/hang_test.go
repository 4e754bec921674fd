package relay

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

func recvHang(t *testing.T, ch <-chan telemetry.Hang, d time.Duration) telemetry.Hang {
	t.Helper()
	select {
	case h, ok := <-ch:
		if !ok {
			t.Fatal("Hangs closed")
		}
		return h
	case <-time.After(d):
		t.Fatalf("no hang request within %v", d)
	}
	panic("unreachable")
}

func noHang(t *testing.T, ch <-chan telemetry.Hang, d time.Duration) {
	t.Helper()
	select {
	case h := <-ch:
		t.Fatalf("got hang request %v again", h.Key)
	case <-time.After(d):
	}
}

// TestHangRequestOnce: a hang request reaches every follower once, also
// one that polls only later; a follower on a skewed clock gets Since on
// its clock.
func TestHangRequestOnce(t *testing.T) {
	s := listen(t, "127.0.0.1:0", newRecorder(), nil)
	const skew = 1500 * time.Millisecond
	c1 := dial(t, ClientConfig{Addr: s.Addr(), Fingerprint: s.Fingerprint(), Node: "node-1"})
	c2 := dial(t, ClientConfig{Addr: s.Addr(), Fingerprint: s.Fingerprint(), Node: "node-2", Now: func() time.Time { return time.Now().Add(skew) }})
	time.Sleep(50 * time.Millisecond) // let the polls wait at the leader

	h := telemetry.Hang{Key: telemetry.Key{Gen: 2, Step: 41, Bucket: 3}, Since: time.Now().Add(-30 * time.Second),
		Waiting: []int{0, 1, 2, 3}, Missing: []int{5, 6}}
	s.RequestStacks(h)
	s.RequestStacks(h) // the same key: nothing more
	for _, tc := range []struct {
		name string
		c    *Client
		skew time.Duration
	}{{"node-1", c1, 0}, {"node-2", c2, skew}} {
		got := recvHang(t, tc.c.Hangs(), 5*time.Second)
		if got.Key != h.Key || !slices.Equal(got.Waiting, h.Waiting) || !slices.Equal(got.Missing, h.Missing) {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, h)
		}
		if d := got.Since.Sub(h.Since.Add(tc.skew)); abs64(d) > 5*time.Millisecond {
			t.Errorf("%s: since %v off its clock", tc.name, d)
		}
	}
	noHang(t, c1.Hangs(), 300*time.Millisecond)
	noHang(t, c2.Hangs(), 0)

	h2 := h
	h2.Bucket = 4
	s.RequestStacks(h2)
	for _, c := range []*Client{c1, c2} {
		if got := recvHang(t, c.Hangs(), 5*time.Second); got.Key != h2.Key {
			t.Errorf("got %v, want %v", got.Key, h2.Key)
		}
	}
	// A follower that comes later gets the outstanding requests, in order.
	c3 := dial(t, ClientConfig{Addr: s.Addr(), Fingerprint: s.Fingerprint(), Node: "node-3"})
	for _, want := range []telemetry.Key{h.Key, h2.Key} {
		if got := recvHang(t, c3.Hangs(), 5*time.Second); got.Key != want {
			t.Errorf("late follower: got %v, want %v", got.Key, want)
		}
	}
	s.RequestStacks(h)
	for _, c := range []*Client{c1, c2, c3} {
		noHang(t, c.Hangs(), 100*time.Millisecond)
	}
}

func TestStacksRoundTrip(t *testing.T) {
	rec := newRecorder()
	s := listen(t, "127.0.0.1:0", rec, nil)
	c := dial(t, ClientConfig{Addr: s.Addr(), Fingerprint: s.Fingerprint(), Node: "node-1"})
	stack := "Thread 0x00007f (most recent call first):\n  File \"train.py\", line 42 in step\n"
	long := strings.Repeat("  File \"x.py\", line 1 in f\n", 10000) // 270 KB
	c.SendStacks(map[int]string{5: stack, 6: long, -1: "not a rank"})
	waitFor(t, "the stacks", 5*time.Second, func() bool { return len(rec.allStacks("node-1")) == 2 })
	got := rec.allStacks("node-1")
	if got[5] != stack {
		t.Errorf("rank 5: got %q, want %q", got[5], stack)
	}
	if len(got[6]) > MaxStack || !strings.HasPrefix(long, strings.TrimSuffix(got[6], "\n[stack truncated by ddp-agent]\n")) {
		t.Errorf("rank 6: got %d bytes, want the first %d of the stack and a note", len(got[6]), MaxStack)
	}
	// Stacks sent while the leader is away arrive once it is back.
	s.Close()
	c.SendStacks(map[int]string{7: "late"})
	time.Sleep(100 * time.Millisecond)
	rec2 := newRecorder()
	relisten(t, s, rec2, nil)
	waitFor(t, "the stack sent while the leader was away", 10*time.Second, func() bool { return rec2.allStacks("node-1")[7] == "late" })
}
