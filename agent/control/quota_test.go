package control

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/ddp-agent/ddp-agent/wire"
)

// warnCounter is a slog handler that counts the records of each message and
// passes them on to the test's log.
type warnCounter struct {
	slog.Handler
	mu   *sync.Mutex
	msgs map[string]int
}

func newWarnCounter(t *testing.T) warnCounter {
	return warnCounter{Handler: testLogger(t).Handler(), mu: new(sync.Mutex), msgs: make(map[string]int)}
}

func (h warnCounter) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	h.msgs[r.Message]++
	h.mu.Unlock()
	return h.Handler.Handle(ctx, r)
}

func (h warnCounter) WithAttrs(as []slog.Attr) slog.Handler {
	h.Handler = h.Handler.WithAttrs(as)
	return h
}

func (h warnCounter) WithGroup(name string) slog.Handler {
	h.Handler = h.Handler.WithGroup(name)
	return h
}

func (h warnCounter) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.msgs[msg]
}

const limitWarning = "worker over a control socket limit, refused"

// wantLimit fails t unless err is a CodeLimit refusal whose message has
// every one of parts.
func wantLimit(t *testing.T, what string, err error, parts ...string) {
	t.Helper()
	var re *wire.RemoteError
	if !errors.As(err, &re) || re.Code != wire.CodeLimit || !errors.Is(err, wire.ErrLimit) {
		t.Errorf("%s: got %v, want a RemoteError with code %v", what, err, wire.CodeLimit)
		return
	}
	for _, p := range parts {
		if !strings.Contains(re.Message, p) {
			t.Errorf("%s: message %q does not name %q", what, re.Message, p)
		}
	}
}

// TestKVQuota: a worker that writes past its quota gets a CodeLimit error
// naming the quota, is logged once, keeps its connection, and the bytes the
// agent holds for it stay within the quota; writes exactly up to the
// limits are accepted.
func TestKVQuota(t *testing.T) {
	leakCheck(t)
	const (
		maxValue = 16 << 10
		perKey   = 2 + maxValue // keys "k0".."k3"
		quota    = 4 * perKey
	)
	kv := NewMemKV()
	warns := newWarnCounter(t)
	s := startServer(t, Config{KV: kv, MaxKVValue: maxValue, KVBytesPerRank: quota, Logger: slog.New(warns)})
	c, _ := dial(t, s, selfHello(0))
	ctx := context.Background()
	value := make([]byte, maxValue)

	err := c.KVSet(ctx, "big", make([]byte, maxValue+1))
	wantLimit(t, "value one byte over MaxKVValue", err, "MaxKVValue", strconv.Itoa(maxValue+1), strconv.Itoa(maxValue))
	if got := s.quota.usage(0, testRank); got != 0 {
		t.Errorf("usage after a refused value: got %d, want 0", got)
	}
	for i := range 4 { // the fourth brings the rank exactly to its quota
		if err := c.KVSet(ctx, "k"+strconv.Itoa(i), value); err != nil {
			t.Fatalf("KVSet %d (%d of %d bytes): %v", i, (i+1)*perKey, quota, err)
		}
	}
	for range 50 {
		err = c.KVSet(ctx, "x", nil)
		wantLimit(t, "one byte over the quota", err, "KVBytesPerRank", "rank "+strconv.Itoa(testRank), strconv.Itoa(quota))
	}
	if got := s.quota.usage(0, testRank); got != quota {
		t.Errorf("usage: got %d, want %d", got, quota)
	}
	kv.mu.Lock()
	held := kv.size
	kv.mu.Unlock()
	if scoped := quota + 4*len("job/0/"); held > scoped {
		t.Errorf("store holds %d bytes, want at most %d", held, scoped)
	}
	if n := warns.count(limitWarning); n != 2 { // one per limit, not one per request
		t.Errorf("limit warnings: got %d, want 2 (one for MaxKVValue, one for KVBytesPerRank)", n)
	}

	// The connection is still usable, and a new generation has a new quota.
	if v, err := c.KVGet(ctx, "k3", 0); err != nil || len(v) != maxValue {
		t.Errorf("KVGet after refusals: got %d bytes, %v; want %d bytes", len(v), err, maxValue)
	}
	if err := s.DropGeneration(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.KVSet(ctx, "k0", value); err != nil {
		t.Errorf("KVSet after DropGeneration: %v, want nil", err)
	}
}

// TestKVQuotaDefaults: a value of exactly DefaultMaxKVValue is accepted, one
// byte more is refused.
func TestKVQuotaDefaults(t *testing.T) {
	leakCheck(t)
	s := startServer(t, Config{})
	c, _ := dial(t, s, selfHello(0))
	if err := c.KVSet(context.Background(), "v", make([]byte, DefaultMaxKVValue)); err != nil {
		t.Errorf("value of DefaultMaxKVValue bytes: %v, want nil", err)
	}
	err := c.KVSet(context.Background(), "v", make([]byte, DefaultMaxKVValue+1))
	wantLimit(t, "value of DefaultMaxKVValue+1 bytes", err, strconv.Itoa(DefaultMaxKVValue))
}

// TestKVQuotaRefund: a write the store refused does not count against the
// quota.
func TestKVQuotaRefund(t *testing.T) {
	leakCheck(t)
	kv := NewMemKV()
	kv.limit = 100
	s := startServer(t, Config{KV: kv})
	c, _ := dial(t, s, selfHello(0))
	var re *wire.RemoteError
	if err := c.KVSet(context.Background(), "k", make([]byte, 200)); !errors.As(err, &re) || re.Code != wire.CodeInternal {
		t.Fatalf("KVSet into a full store: got %v, want code %v", err, wire.CodeInternal)
	}
	if got := s.quota.usage(0, testRank); got != 0 {
		t.Errorf("usage after the store refused: got %d, want 0", got)
	}
}

// TestKVQuotaConcurrent: many connections of one rank writing at once are
// charged together: what is admitted never exceeds the quota.
func TestKVQuotaConcurrent(t *testing.T) {
	leakCheck(t)
	const quota = 10 * (3 + 1000) // ten of the writes below
	s := startServer(t, Config{KVBytesPerRank: quota})
	var wg sync.WaitGroup
	var mu sync.Mutex
	accepted := 0
	for i := range 4 {
		c, _ := dial(t, s, selfHello(0))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 10 {
				err := c.KVSet(context.Background(), strconv.Itoa(i)+"-"+strconv.Itoa(j), make([]byte, 1000))
				if err == nil {
					mu.Lock()
					accepted++
					mu.Unlock()
				} else if !errors.Is(err, wire.ErrLimit) {
					t.Errorf("KVSet: got %v, want nil or %v", err, wire.ErrLimit)
				}
			}
		}()
	}
	wg.Wait()
	if accepted != 10 || s.quota.usage(0, testRank) != quota {
		t.Errorf("accepted %d writes, usage %d; want 10 and %d", accepted, s.quota.usage(0, testRank), quota)
	}
}

func TestCheckKVSet(t *testing.T) {
	cfg := Config{MaxKVValue: 10, KVBytesPerRank: 100}
	tests := []struct {
		name     string
		key      string
		valueLen int
		used     int64
		want     string // the limit, "" for none
	}{
		{"empty", "k", 0, 0, ""},
		{"value at limit", "k", 10, 0, ""},
		{"value over limit", "k", 11, 0, "MaxKVValue"},
		{"quota reached exactly", "k", 9, 90, ""},
		{"quota one over", "kk", 9, 90, "KVBytesPerRank"},
		{"key counts", strings.Repeat("k", 101), 0, 0, "KVBytesPerRank"},
		{"value checked first", "k", 11, 100, "MaxKVValue"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := checkKVSet(tc.key, tc.valueLen, tc.used, testRank, cfg)
			if (got == nil) != (tc.want == "") || got != nil && got.limit != tc.want {
				t.Errorf("got %v, want limit %q", got, tc.want)
			}
		})
	}
}
