package relay

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
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
	s, err := Listen(addr, testToken, h, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// relisten starts a leader on old's address with old's certificate: the
// same leader, restarted (its epoch is new).
func relisten(t *testing.T, old *Server, h Handler, log *slog.Logger) *Server {
	t.Helper()
	var s *Server
	var err error
	for range 50 { // its old connections may linger a moment
		if s, err = listenAs(old.Addr(), testToken, h, log, &old.id); err == nil {
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
