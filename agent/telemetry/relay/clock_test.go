package relay

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// TestRecordsOnLeaderClock: a follower whose clock is off by skew sends
// records stamped on its clock; the leader gets them on the true clock.
func TestRecordsOnLeaderClock(t *testing.T) {
	for _, tc := range []struct {
		name string
		skew time.Duration
	}{
		{"ahead 2.5s", 2500 * time.Millisecond},
		{"behind 1s", -time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log, logs := newTestLog(t)
			rec := newRecorder()
			s := listen(t, "127.0.0.1:0", rec, log)
			c := dial(t, ClientConfig{Addr: s.Addr(), Fingerprint: s.Fingerprint(), Node: "node-1", Log: log, FlushEvery: 20 * time.Millisecond,
				Now: func() time.Time { return time.Now().Add(tc.skew) }})
			if got, want := c.Offset(), -tc.skew; abs64(got-want) > 5*time.Millisecond {
				t.Fatalf("offset: got %v, want %v ± 5ms", got, want)
			}
			if !strings.Contains(logs.String(), "level=INFO msg=\"relay: clock offset to the leader\"") {
				t.Error("an offset over 10 ms is not logged at info")
			}

			truth := time.Now()
			var sent, want []telemetry.Record
			for i := range 20 {
				r := telemetry.Record{Gen: 3, Step: uint64(i), Bucket: uint32(i % 4), Rank: 8 + i%8, Bytes: 4096, DType: 2,
					Arrive: truth.Add(time.Duration(i) * time.Millisecond)}
				r.Start = r.Arrive.Add(500 * time.Microsecond)
				r.End = r.Start.Add(3 * time.Millisecond)
				if i == 19 { // in flight: End stays zero
					r.Status, r.End = telemetry.StatusInFlight, time.Time{}
				}
				want = append(want, r)
				r.Arrive, r.Start, r.End = shift(r.Arrive, tc.skew), shift(r.Start, tc.skew), shift(r.End, tc.skew)
				sent = append(sent, r)
			}
			c.Send(sent)
			waitFor(t, "the records", 5*time.Second, func() bool { return len(rec.records("node-1")) == len(want) })
			for i, got := range rec.records("node-1") {
				w := want[i]
				for _, p := range []struct {
					name      string
					got, want time.Time
				}{{"arrive", got.Arrive, w.Arrive}, {"start", got.Start, w.Start}, {"end", got.End, w.End}} {
					if p.want.IsZero() {
						if !p.got.IsZero() {
							t.Errorf("record %d %s: got %v, want the zero time", i, p.name, p.got)
						}
					} else if d := p.got.Sub(p.want); abs64(d) > 5*time.Millisecond {
						t.Errorf("record %d %s: %v off the truth, want within 5ms", i, p.name, d)
					}
				}
				got.Arrive, got.Start, got.End, w.Arrive, w.Start, w.End = time.Time{}, time.Time{}, time.Time{}, time.Time{}, time.Time{}, time.Time{}
				if got != w {
					t.Errorf("record %d: got %+v, want %+v", i, got, w)
				}
			}
			if c.Dropped() != 0 {
				t.Errorf("dropped: got %d, want 0", c.Dropped())
			}
		})
	}
}

// TestSyncKeepsSmallestRoundTrip: of the 8 time requests, the one with the
// smallest round trip sets the offset. Here the first 7 seem 80 ms slower
// on the way back (this clock reads late after them), which would put the
// leader's clock 40 ms behind.
func TestSyncKeepsSmallestRoundTrip(t *testing.T) {
	s := listen(t, "127.0.0.1:0", newRecorder(), nil)
	var calls atomic.Int64
	now := func() time.Time {
		n := calls.Add(1)
		if n <= 2*(samples-1) && n%2 == 0 { // t1 of the first 7 samples
			return time.Now().Add(80 * time.Millisecond)
		}
		return time.Now()
	}
	c := dial(t, ClientConfig{Addr: s.Addr(), Fingerprint: s.Fingerprint(), Node: "n", Now: now})
	if got := calls.Load(); got != 2*samples {
		t.Errorf("clock read %d times, want %d", got, 2*samples)
	}
	// A slow sample would say -40 ms. The fast one's own error is half
	// its round trip: 7.5 ms once on a loaded CI machine, so the bound
	// is half way, not the 5 ms a quiet loopback gives.
	if off := c.Offset(); abs64(off) > 20*time.Millisecond {
		t.Errorf("offset: got %v, want 0 ± 20ms (from the fast sample, not -40ms from a slow one)", off)
	}
}

// TestClockResync: the offset follows this node's clock every SyncEvery.
func TestClockResync(t *testing.T) {
	s := listen(t, "127.0.0.1:0", newRecorder(), nil)
	var skew atomic.Int64
	c := dial(t, ClientConfig{Addr: s.Addr(), Fingerprint: s.Fingerprint(), Node: "n", SyncEvery: 30 * time.Millisecond,
		Now: func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }})
	if off := c.Offset(); abs64(off) > 5*time.Millisecond {
		t.Fatalf("offset: got %v, want 0 ± 5ms", off)
	}
	skew.Store(int64(300 * time.Millisecond))
	waitFor(t, "the offset to follow a clock step of 300ms", 5*time.Second, func() bool {
		return abs64(c.Offset()+300*time.Millisecond) < 5*time.Millisecond
	})
}

func TestTimeEndpoint(t *testing.T) {
	s := listen(t, "127.0.0.1:0", newRecorder(), nil)
	before := time.Now()
	code, body := do(t, httpClient(t, s), s.Addr(), rawReq{method: "GET", path: pathTime, token: testToken, node: "-"})
	after := time.Now()
	var ns int64
	if _, err := fmt.Sscanf(body, `{"unix_nano":%d}`, &ns); code != http.StatusOK || err != nil {
		t.Fatalf("got %d %q (%v), want 200 {\"unix_nano\":n}", code, body, err)
	}
	if got := time.Unix(0, ns); got.Before(before.Add(-time.Millisecond)) || got.After(after.Add(time.Millisecond)) {
		t.Errorf("leader time %v outside the request [%v, %v]", got, before, after)
	}
}
