package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

const testToken = "job-token"

// recorder is the leader's Handler in tests: it keeps what arrives, and
// calls onRecords first when set (to make a slow leader).
type recorder struct {
	onRecords func()

	mu      sync.Mutex
	recs    map[string][]telemetry.Record
	batches map[string][]int // sizes of the Records calls, per node
	workers map[string][][]telemetry.Worker
	stacks  map[string][]map[int]string
}

var _ Handler = (*recorder)(nil)

func newRecorder() *recorder {
	return &recorder{recs: map[string][]telemetry.Record{}, batches: map[string][]int{},
		workers: map[string][][]telemetry.Worker{}, stacks: map[string][]map[int]string{}}
}

func (r *recorder) Records(node string, recs []telemetry.Record) {
	if r.onRecords != nil {
		r.onRecords()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs[node] = append(r.recs[node], recs...)
	r.batches[node] = append(r.batches[node], len(recs))
}

func (r *recorder) Workers(node string, ws []telemetry.Worker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.workers[node] = append(r.workers[node], ws)
}

func (r *recorder) Stacks(node string, st map[int]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stacks[node] = append(r.stacks[node], st)
}

func (r *recorder) records(node string) []telemetry.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.recs[node])
}

func (r *recorder) batchSizes(node string) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.batches[node])
}

func (r *recorder) lastWorkers(node string) []telemetry.Worker {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w := r.workers[node]; len(w) > 0 {
		return w[len(w)-1]
	}
	return nil
}

func (r *recorder) allStacks(node string) map[int]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	all := map[int]string{}
	for _, m := range r.stacks[node] {
		maps.Copy(all, m)
	}
	return all
}

// testLog is a logger into the test's log that falls silent when the test
// ends, and keeps what was logged for assertions.
type testLog struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
	buf  bytes.Buffer
}

func newTestLog(t *testing.T) (*slog.Logger, *testLog) {
	w := &testLog{t: t}
	t.Cleanup(func() { // registered first: runs last
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})), w
}

func (w *testLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSpace(string(p)))
		w.buf.Write(p)
	}
	return len(p), nil
}

func (w *testLog) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func listen(t *testing.T, addr string, h Handler, log *slog.Logger) *Server {
	t.Helper()
	var s *Server
	var err error
	for range 50 { // the same address again: its old connections may linger a moment
		if s, err = Listen(addr, testToken, h, log); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func dial(t *testing.T, cfg ClientConfig) *Client {
	t.Helper()
	if cfg.Token == "" {
		cfg.Token = testToken
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}

// steps makes n records of rank 0 with steps from, from+1, ...
func steps(from, n int, at time.Time) []telemetry.Record {
	recs := make([]telemetry.Record, n)
	for i := range recs {
		recs[i] = telemetry.Record{Gen: 1, Step: uint64(from + i), Bucket: 0, Rank: 0, Bytes: 1 << 20, DType: 7,
			Arrive: at, Start: at.Add(time.Millisecond), End: at.Add(2 * time.Millisecond)}
	}
	return recs
}

func abs64(d time.Duration) time.Duration { return max(d, -d) }

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
			c := dial(t, ClientConfig{Addr: s.Addr(), Node: "node-1", Log: log, FlushEvery: 20 * time.Millisecond,
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
	c := dial(t, ClientConfig{Addr: s.Addr(), Node: "n", Now: now})
	if got := calls.Load(); got != 2*samples {
		t.Errorf("clock read %d times, want %d", got, 2*samples)
	}
	if off := c.Offset(); abs64(off) > 5*time.Millisecond {
		t.Errorf("offset: got %v, want 0 ± 5ms (from the fast sample)", off)
	}
}

// TestClockResync: the offset follows this node's clock every SyncEvery.
func TestClockResync(t *testing.T) {
	s := listen(t, "127.0.0.1:0", newRecorder(), nil)
	var skew atomic.Int64
	c := dial(t, ClientConfig{Addr: s.Addr(), Node: "n", SyncEvery: 30 * time.Millisecond,
		Now: func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }})
	if off := c.Offset(); abs64(off) > 5*time.Millisecond {
		t.Fatalf("offset: got %v, want 0 ± 5ms", off)
	}
	skew.Store(int64(300 * time.Millisecond))
	waitFor(t, "the offset to follow a clock step of 300ms", 5*time.Second, func() bool {
		return abs64(c.Offset()+300*time.Millisecond) < 5*time.Millisecond
	})
}

func TestBatching(t *testing.T) {
	rec := newRecorder()
	s := listen(t, "127.0.0.1:0", rec, nil)
	c := dial(t, ClientConfig{Addr: s.Addr(), Node: "n", FlushEvery: 100 * time.Millisecond})

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
		{"leader down", ClientConfig{Addr: down, Node: "n", Token: testToken}, 300 * time.Millisecond, context.DeadlineExceeded, time.Second},
		{"bad token", ClientConfig{Addr: s.Addr(), Node: "n", Token: "wrong"}, 5 * time.Second, ErrForbidden, time.Second},
		{"no token", ClientConfig{Addr: s.Addr(), Node: "n"}, 5 * time.Second, nil, 10 * time.Millisecond},
		{"bad address", ClientConfig{Addr: "leader", Node: "n", Token: testToken}, 5 * time.Second, nil, 10 * time.Millisecond},
		{"bad node", ClientConfig{Addr: s.Addr(), Node: "node\n1", Token: testToken}, 5 * time.Second, nil, 10 * time.Millisecond},
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
	c := dial(t, ClientConfig{Addr: addr, Node: "n", Log: log, FlushEvery: 10 * time.Millisecond, MaxBuffered: 1000})
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
	listen(t, addr, rec2, log)
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
	if got := uint64(during) + c.Dropped(); got != outage {
		t.Errorf("records of the outage: %d delivered + %d dropped = %d, want %d", during, c.Dropped(), got, outage)
	}
}

// TestWorkersResentAfterRestart: with no records flowing, the hangs poll
// finds the restarted leader, which gets the workers again.
func TestWorkersResentAfterRestart(t *testing.T) {
	log, _ := newTestLog(t)
	rec1 := newRecorder()
	s1 := listen(t, "127.0.0.1:0", rec1, log)
	addr := s1.Addr()
	c := dial(t, ClientConfig{Addr: addr, Node: "n", Log: log})
	v1 := []telemetry.Worker{{Rank: 2, LocalRank: 0, Host: "c", PID: 1, GPUIndex: -1}}
	c.SendWorkers(v1)
	waitFor(t, "the workers", 5*time.Second, func() bool { return slices.Equal(rec1.lastWorkers("n"), v1) })
	v2 := append(slices.Clone(v1), telemetry.Worker{Rank: 3, LocalRank: 1, Host: "c", PID: 2, GPUIndex: -1})
	c.SendWorkers(v2)
	waitFor(t, "the changed workers", 5*time.Second, func() bool { return slices.Equal(rec1.lastWorkers("n"), v2) })

	s1.Close()
	rec2 := newRecorder()
	listen(t, addr, rec2, nil)
	waitFor(t, "the workers at the new leader", 10*time.Second, func() bool { return slices.Equal(rec2.lastWorkers("n"), v2) })
	rec1.mu.Lock()
	defer rec1.mu.Unlock()
	if n := len(rec1.workers["n"]); n != 2 {
		t.Errorf("the first leader got the workers %d times, want 2 (once per SendWorkers)", n)
	}
}

// httpClient is a client for raw requests, closed with the test.
func httpClient(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

type rawReq struct {
	method, path string
	token, node  string // "-": no header
	body         []byte
}

func do(t *testing.T, hc *http.Client, addr string, r rawReq) (int, string) {
	t.Helper()
	var body io.Reader
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(t.Context(), r.method, "http://"+addr+r.path, body)
	if err != nil {
		t.Fatal(err)
	}
	if r.token != "-" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
	if r.node != "-" {
		req.Header.Set(hdrNode, r.node)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

func TestForbidden(t *testing.T) {
	rec := newRecorder()
	s := listen(t, "127.0.0.1:0", rec, nil)
	hc := httpClient(t)
	good := appendRecords(nil, steps(0, 1, time.Now()), 0)
	for _, tc := range []struct {
		name string
		req  rawReq
	}{
		{"no token on time", rawReq{method: "GET", path: pathTime, token: "-", node: "n"}},
		{"wrong token on records", rawReq{method: "POST", path: pathRecs, token: "job-tokem", node: "n", body: good}},
		{"prefix of the token", rawReq{method: "POST", path: pathRecs, token: "job-", node: "n", body: good}},
		{"token and more", rawReq{method: "POST", path: pathRecs, token: testToken + "x", node: "n", body: good}},
		{"empty token on workers", rawReq{method: "POST", path: pathWork, token: "", node: "n", body: []byte(`{"workers":[]}`)}},
		{"wrong token on hangs", rawReq{method: "GET", path: pathHangs, token: "x", node: "n"}},
		{"wrong token on a path that does not exist", rawReq{method: "GET", path: "/v2/nothing", token: "x", node: "n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, msg := do(t, hc, s.Addr(), tc.req); code != http.StatusForbidden {
				t.Errorf("got %d %q, want 403", code, msg)
			}
		})
	}
	// The scheme is Bearer.
	req, _ := http.NewRequestWithContext(t.Context(), "GET", "http://"+s.Addr()+pathTime, nil)
	req.SetBasicAuth("ddp", testToken)
	if resp, err := hc.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("basic auth: got %v %v, want 403", resp.StatusCode, err)
	} else {
		resp.Body.Close()
	}
	if code, _ := do(t, hc, s.Addr(), rawReq{method: "POST", path: pathRecs, token: testToken, node: "n", body: good}); code != http.StatusNoContent {
		t.Errorf("with the token: got %d, want 204", code)
	}
	if n := len(rec.records("n")); n != 1 {
		t.Errorf("the handler got %d records, want only the one sent with the token", n)
	}
}

// TestMalformed: every bad request gets 400 (413 when too large) and
// reaches no Handler; the server answers good ones in between.
func TestMalformed(t *testing.T) {
	rec := newRecorder()
	s := listen(t, "127.0.0.1:0", rec, nil)
	hc := httpClient(t)
	post := func(path, node string, body []byte) rawReq {
		return rawReq{method: "POST", path: path, token: testToken, node: node, body: body}
	}
	type tc struct {
		name string
		req  rawReq
		want int
	}
	var cases []tc
	for name, b := range malformedRecords() {
		cases = append(cases, tc{"records " + name, post(pathRecs, "n", b), http.StatusBadRequest})
	}
	good := appendRecords(nil, steps(0, 1, time.Now()), 0)
	cases = append(cases, []tc{
		{"records too large", post(pathRecs, "n", make([]byte, recordsHeader+(MaxBatch+1)*recordSize)), http.StatusRequestEntityTooLarge},
		{"records without a node", post(pathRecs, "-", good), http.StatusBadRequest},
		{"records from a node of 300 bytes", post(pathRecs, strings.Repeat("n", 300), good), http.StatusBadRequest},
		{"workers not JSON", post(pathWork, "n", []byte("workers: 1")), http.StatusBadRequest},
		{"workers cut short", post(pathWork, "n", []byte(`{"workers":[{"rank":1`)), http.StatusBadRequest},
		{"workers with trailing data", post(pathWork, "n", []byte(`{"workers":[]} {}`)), http.StatusBadRequest},
		{"workers with a negative rank", post(pathWork, "n", []byte(`{"workers":[{"rank":-1}]}`)), http.StatusBadRequest},
		{"workers with a rank too large", post(pathWork, "n", []byte(`{"workers":[{"rank":1e12}]}`)), http.StatusBadRequest},
		{"workers with a string rank", post(pathWork, "n", []byte(`{"workers":[{"rank":"1"}]}`)), http.StatusBadRequest},
		{"workers with a long host", post(pathWork, "n", []byte(`{"workers":[{"rank":1,"host":"`+strings.Repeat("h", maxText+1)+`"}]}`)), http.StatusBadRequest},
		{"workers too large", post(pathWork, "n", make([]byte, MaxBody+1)), http.StatusRequestEntityTooLarge},
		{"stacks with a bad rank", post(pathStacks, "n", []byte(`{"stacks":{"rank3":"x"}}`)), http.StatusBadRequest},
		{"stacks with a negative rank", post(pathStacks, "n", []byte(`{"stacks":{"-3":"x"}}`)), http.StatusBadRequest},
		{"stacks too long", post(pathStacks, "n", []byte(`{"stacks":{"3":"`+strings.Repeat("x", MaxStack+1)+`"}}`)), http.StatusBadRequest},
		{"stacks an array", post(pathStacks, "n", []byte(`{"stacks":["x"]}`)), http.StatusBadRequest},
		{"hangs after not a number", rawReq{method: "GET", path: pathHangs + "?after=x", token: testToken, node: "n"}, http.StatusBadRequest},
		{"hangs wait not a duration", rawReq{method: "GET", path: pathHangs + "?wait=soon", token: testToken, node: "n"}, http.StatusBadRequest},
		{"hangs negative wait", rawReq{method: "GET", path: pathHangs + "?wait=-1s", token: testToken, node: "n"}, http.StatusBadRequest},
		{"time by POST", post(pathTime, "n", nil), http.StatusMethodNotAllowed},
		{"unknown path", rawReq{method: "GET", path: "/v1/nothing", token: testToken, node: "n"}, http.StatusNotFound},
	}...)
	slices.SortFunc(cases, func(a, b tc) int { return strings.Compare(a.name, b.name) })
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if code, msg := do(t, hc, s.Addr(), c.req); code != c.want {
				t.Errorf("got %d %q, want %d", code, msg, c.want)
			} else {
				t.Logf("%d %s", code, msg)
			}
			// The server carries on.
			ok := appendRecords(nil, steps(i, 1, time.Now()), 0)
			if code, msg := do(t, hc, s.Addr(), post(pathRecs, "n", ok)); code != http.StatusNoContent {
				t.Fatalf("a good batch after it: got %d %q, want 204", code, msg)
			}
		})
	}
	if n := len(rec.records("n")); n != len(cases) {
		t.Errorf("the handler got %d records, want %d (the good ones)", n, len(cases))
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.workers) != 0 || len(rec.stacks) != 0 {
		t.Errorf("the handler got workers %v and stacks %v from malformed requests", rec.workers, rec.stacks)
	}
}

func TestTimeEndpoint(t *testing.T) {
	s := listen(t, "127.0.0.1:0", newRecorder(), nil)
	before := time.Now()
	code, body := do(t, httpClient(t), s.Addr(), rawReq{method: "GET", path: pathTime, token: testToken, node: "-"})
	after := time.Now()
	var ns int64
	if _, err := fmt.Sscanf(body, `{"unix_nano":%d}`, &ns); code != http.StatusOK || err != nil {
		t.Fatalf("got %d %q (%v), want 200 {\"unix_nano\":n}", code, body, err)
	}
	if got := time.Unix(0, ns); got.Before(before.Add(-time.Millisecond)) || got.After(after.Add(time.Millisecond)) {
		t.Errorf("leader time %v outside the request [%v, %v]", got, before, after)
	}
}

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
	c1 := dial(t, ClientConfig{Addr: s.Addr(), Node: "node-1"})
	c2 := dial(t, ClientConfig{Addr: s.Addr(), Node: "node-2", Now: func() time.Time { return time.Now().Add(skew) }})
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
	c3 := dial(t, ClientConfig{Addr: s.Addr(), Node: "node-3"})
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
	c := dial(t, ClientConfig{Addr: s.Addr(), Node: "node-1"})
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
	addr := s.Addr()
	s.Close()
	c.SendStacks(map[int]string{7: "late"})
	time.Sleep(100 * time.Millisecond)
	rec2 := newRecorder()
	listen(t, addr, rec2, nil)
	waitFor(t, "the stack sent while the leader was away", 10*time.Second, func() bool { return rec2.allStacks("node-1")[7] == "late" })
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
		c, err := Dial(t.Context(), ClientConfig{Addr: s.Addr(), Node: "n", Token: testToken, FlushEvery: 10 * time.Millisecond, MaxBuffered: 100})
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
		c, err := Dial(t.Context(), ClientConfig{Addr: s.Addr(), Node: "n", Token: testToken})
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
		c, err := Dial(t.Context(), ClientConfig{Addr: s.Addr(), Node: "n", Token: testToken, FlushEvery: time.Hour})
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
		c := dial(t, ClientConfig{Addr: s.Addr(), Node: "n"})
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

func TestListenErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		addr  string
		token string
		h     Handler
	}{
		{"empty token", "127.0.0.1:0", "", newRecorder()},
		{"nil handler", "127.0.0.1:0", testToken, nil},
		{"bad address", "127.0.0.1:99999", testToken, newRecorder()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if s, err := Listen(tc.addr, tc.token, tc.h, nil); err == nil {
				s.Close()
				t.Fatal("Listen succeeded, want an error")
			}
		})
	}
}
