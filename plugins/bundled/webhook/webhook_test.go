package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

// got is one POST an endpoint received.
type got struct {
	at     time.Time
	header http.Header
	body   []byte
}

// endpoint is an httptest server that answers each POST with respond
// (given the try's number, from 0) and records it.
type endpoint struct {
	*httptest.Server
	mu    sync.Mutex
	posts []got
}

func newEndpoint(t *testing.T, respond func(n int, w http.ResponseWriter, r *http.Request)) *endpoint {
	e := &endpoint{}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		e.mu.Lock()
		n := len(e.posts)
		e.posts = append(e.posts, got{at: time.Now(), header: r.Header.Clone(), body: body})
		e.mu.Unlock()
		respond(n, w, r)
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *endpoint) received() []got {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]got(nil), e.posts...)
}

func configured(t *testing.T, cfg plugins.Config) *Notifier {
	t.Helper()
	n := New().(*Notifier)
	if err := n.Configure(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	return n
}

func notify(n *Notifier, within time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	start := time.Now()
	err := n.Notify(ctx, notifier.Event{Kind: notifier.WorkerFailed, Job: "j", Node: "n", Rank: 1, Message: "m"})
	return time.Since(start), err
}

var workerFailed = notifier.Event{
	Kind: notifier.WorkerFailed, Time: time.Date(2026, 11, 26, 3, 4, 5, 123456789, time.UTC),
	Job: "run-7", Node: "gpu-node-3", Generation: 2, Attempt: 1, Rank: 1,
	Message: "rank 1 (local 1, pid 4242) exited with code 1\nTraceback ...",
	Details: map[string]string{"exit_code": "1", "cause": "exit"},
}

// The body decodes strictly into the documented schema, with exactly its
// keys (rank absent when the event has none), and the signature verifies
// as the docs tell a receiver to check it.
func TestBodyAndSignature(t *testing.T) {
	const secret = "s3cret"
	e := newEndpoint(t, func(int, http.ResponseWriter, *http.Request) {})
	n := configured(t, plugins.Config{"url": e.URL + "/hook", "secret": secret, "header": "Authorization: Bearer tok"})
	noRank := workerFailed
	noRank.Kind, noRank.Rank, noRank.Details = notifier.JobStarted, -1, nil
	for _, ev := range []notifier.Event{workerFailed, noRank} {
		if err := n.Notify(context.Background(), ev); err != nil {
			t.Fatal(err)
		}
	}
	posts := e.received()
	if len(posts) != 2 {
		t.Fatalf("%d POSTs, want 2", len(posts))
	}
	for _, p := range posts {
		ts := p.header.Get("X-DDP-Agent-Timestamp")
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte(ts + "." + string(p.body)))
		if want := "sha256=" + hex.EncodeToString(m.Sum(nil)); p.header.Get("X-DDP-Agent-Signature") != want {
			t.Errorf("signature %q, want %q", p.header.Get("X-DDP-Agent-Signature"), want)
		}
		if sec, err := strconv.ParseInt(ts, 10, 64); err != nil || time.Since(time.Unix(sec, 0)).Abs() > time.Minute {
			t.Errorf("timestamp %q is not now's Unix seconds", ts)
		}
		if p.header.Get("Content-Type") != "application/json" || p.header.Get("Authorization") != "Bearer tok" || len(p.header.Get("X-DDP-Agent-Delivery")) != 32 {
			t.Errorf("headers %v", p.header)
		}
	}

	type schema struct {
		Schema     string            `json:"schema"`
		Kind       string            `json:"kind"`
		Time       string            `json:"time"`
		Job        string            `json:"job"`
		Node       string            `json:"node"`
		Generation uint64            `json:"generation"`
		Attempt    int               `json:"attempt"`
		Rank       *int              `json:"rank"`
		Message    string            `json:"message"`
		Details    map[string]string `json:"details"`
		Text       string            `json:"text"`
	}
	dec := json.NewDecoder(bytes.NewReader(posts[0].body))
	dec.DisallowUnknownFields()
	var s schema
	if err := dec.Decode(&s); err != nil {
		t.Fatalf("strict decode: %v\n%s", err, posts[0].body)
	}
	one := 1
	want := schema{
		Schema: "ddp-agent.event/v1", Kind: "worker_failed", Time: "2026-11-26T03:04:05.123456789Z",
		Job: "run-7", Node: "gpu-node-3", Generation: 2, Attempt: 1, Rank: &one, Message: workerFailed.Message,
		Details: map[string]string{"exit_code": "1", "cause": "exit"},
		Text:    ":rotating_light: job run-7 on node gpu-node-3: worker_failed rank 1: rank 1 (local 1, pid 4242) exited with code 1",
	}
	if b1, b2 := mustJSON(t, s), mustJSON(t, want); b1 != b2 {
		t.Errorf("body\n got %s\nwant %s", b1, b2)
	}
	if keys := keysOf(t, posts[0].body); keys != "attempt details generation job kind message node rank schema text time" {
		t.Errorf("keys %q", keys)
	}
	if keys := keysOf(t, posts[1].body); keys != "attempt details generation job kind message node schema text time" {
		t.Errorf("keys without a rank: %q", keys)
	}
	if !bytes.Contains(posts[1].body, []byte(`"details":{}`)) {
		t.Errorf("no details: want {}, got %s", posts[1].body)
	}
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func keysOf(t *testing.T, body []byte) string {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return strings.Join(keys, " ")
}

func TestRetriesOn500ThenSucceeds(t *testing.T) {
	e := newEndpoint(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 0 {
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	n := configured(t, plugins.Config{"url": e.URL})
	if _, err := notify(n, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	p := e.received()
	if len(p) != 2 {
		t.Fatalf("%d POSTs, want 2", len(p))
	}
	if gap := p[1].at.Sub(p[0].at); gap < defaultBackoffBase/2 {
		t.Errorf("retried after %s, want a backoff of at least %s", gap, defaultBackoffBase/2)
	}
	if !bytes.Equal(p[0].body, p[1].body) || p[0].header.Get("X-DDP-Agent-Delivery") != p[1].header.Get("X-DDP-Agent-Delivery") {
		t.Error("a retry changed the body or the delivery id")
	}
}

func TestGivesUpAfterRetries(t *testing.T) {
	e := newEndpoint(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "database down", http.StatusInternalServerError)
	})
	n := configured(t, plugins.Config{"url": e.URL + "/services/SECRETPATH", "retries": "2"})
	n.backoffBase = 10 * time.Millisecond
	_, err := notify(n, 10*time.Second)
	if err == nil || !strings.Contains(err.Error(), `gave up after 3 tries: POST: 500 Internal Server Error: "database down\n"`) {
		t.Fatalf("err = %v", err)
	}
	if strings.Contains(err.Error(), "SECRETPATH") {
		t.Errorf("the error quotes the URL's path: %v", err)
	}
	if got := len(e.received()); got != 3 {
		t.Errorf("%d POSTs, want 1 + retries = 3", got)
	}
}

func TestClientErrorNotRetried(t *testing.T) {
	e := newEndpoint(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(strings.Repeat("a", maxErrorBody) + "TAIL"))
	})
	n := configured(t, plugins.Config{"url": e.URL})
	_, err := notify(n, 10*time.Second)
	if err == nil || !strings.Contains(err.Error(), "400 Bad Request: \""+strings.Repeat("a", maxErrorBody)+"\"") || strings.Contains(err.Error(), "TAIL") {
		t.Fatalf("err = %v; want the status and the body's first %d bytes", err, maxErrorBody)
	}
	if got := len(e.received()); got != 1 {
		t.Errorf("%d POSTs, want 1: a 400 is not retried", got)
	}
}

// A slow endpoint costs the timeout option per try, and no more than
// Notify's deadline in all.
func TestSlowEndpoint(t *testing.T) {
	e := newEndpoint(t, func(_ int, _ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	})
	n := configured(t, plugins.Config{"url": e.URL, "timeout": "200ms", "retries": "0"})
	took, err := notify(n, 10*time.Second)
	if err == nil || !strings.Contains(err.Error(), "no answer within the timeout, 200ms") || took > time.Second {
		t.Fatalf("err = %v after %s; want a timeout after about 200ms", err, took)
	}

	n = configured(t, plugins.Config{"url": e.URL, "timeout": "300ms", "retries": "5"})
	took, err = notify(n, 500*time.Millisecond)
	if err == nil || took > 900*time.Millisecond {
		t.Fatalf("err = %v after %s; want an error by the 500ms deadline", err, took)
	}
}

func TestRetryAfterHonored(t *testing.T) {
	e := newEndpoint(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 0 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	})
	n := configured(t, plugins.Config{"url": e.URL})
	if _, err := notify(n, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	p := e.received()
	if len(p) != 2 {
		t.Fatalf("%d POSTs, want 2", len(p))
	}
	if gap := p[1].at.Sub(p[0].at); gap < time.Second {
		t.Errorf("retried after %s, want Retry-After's 1s", gap)
	}
}

// A Retry-After past the deadline is not waited for.
func TestRetryAfterPastDeadline(t *testing.T) {
	e := newEndpoint(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	n := configured(t, plugins.Config{"url": e.URL})
	took, err := notify(n, 2*time.Second)
	if err == nil || !strings.Contains(err.Error(), "503 Service Unavailable") || !strings.Contains(err.Error(), "in 30s, would be past the deadline") || took > time.Second {
		t.Fatalf("err = %v after %s", err, took)
	}
	if got := len(e.received()); got != 1 {
		t.Errorf("%d POSTs, want 1", got)
	}
}

// A refused connection is a network error: retried, then given up on,
// without quoting the URL.
func TestNetworkErrorRetried(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	n := configured(t, plugins.Config{"url": "http://" + addr + "/SECRETPATH", "retries": "1"})
	n.backoffBase = 10 * time.Millisecond
	_, err = notify(n, 10*time.Second)
	if err == nil || !strings.Contains(err.Error(), "gave up after 2 tries: POST: dial tcp") || strings.Contains(err.Error(), "SECRETPATH") {
		t.Fatalf("err = %v", err)
	}
}

func TestNotifyBeforeConfigure(t *testing.T) {
	if err := New().Notify(context.Background(), workerFailed); err == nil {
		t.Fatal("Notify before Configure: no error")
	}
}
