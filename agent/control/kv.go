package control

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
)

// KV is the key-value store behind the KVSet and KVGet requests. The server
// calls it from many goroutines at once, so implementations must be safe for
// concurrent use. Errors caused by ctx must wrap ctx.Err(): the server maps
// context.DeadlineExceeded to a Timeout reply.
type KV interface {
	// Set stores value under key.
	Set(ctx context.Context, key string, value []byte) error
	// Get blocks until key exists or ctx is done.
	Get(ctx context.Context, key string) ([]byte, error)
}

// MemKVLimit bounds the bytes (keys and values) a MemKV holds, so workers
// that misbehave cannot grow the agent without limit.
const MemKVLimit = 256 << 20

// ErrKVFull is returned by MemKV.Set when the value would exceed MemKVLimit.
var ErrKVFull = errors.New("kv store full")

// MemKV is an in-memory KV. Get waits on a per-key channel that Set closes,
// so there is no polling. It is safe for concurrent use.
type MemKV struct {
	mu    sync.Mutex
	vals  map[string][]byte
	size  int // bytes of keys and values held
	limit int // MemKVLimit; smaller in tests
	waits map[string]*kvWaiters
}

type kvWaiters struct {
	ch chan struct{} // closed by Set
	n  int           // goroutines waiting on ch
}

// NewMemKV returns an empty MemKV.
func NewMemKV() *MemKV {
	return &MemKV{vals: make(map[string][]byte), limit: MemKVLimit, waits: make(map[string]*kvWaiters)}
}

// Set stores a copy of value under key and wakes the Gets waiting for it. It
// does not block.
func (kv *MemKV) Set(ctx context.Context, key string, value []byte) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("kv set %q: %w", key, err)
	}
	kv.mu.Lock()
	defer kv.mu.Unlock()
	grow := len(key) + len(value)
	if old, ok := kv.vals[key]; ok {
		grow -= len(key) + len(old)
	}
	if kv.size+grow > kv.limit {
		return fmt.Errorf("kv set %q (%d bytes): %w (limit %d bytes)", key, len(value), ErrKVFull, kv.limit)
	}
	kv.size += grow
	kv.vals[key] = bytes.Clone(value)
	if w := kv.waits[key]; w != nil {
		close(w.ch)
		delete(kv.waits, key)
	}
	return nil
}

// Get returns a copy of the value under key, blocking until it is set or ctx
// is done.
func (kv *MemKV) Get(ctx context.Context, key string) ([]byte, error) {
	kv.mu.Lock()
	if v, ok := kv.vals[key]; ok {
		kv.mu.Unlock()
		return bytes.Clone(v), nil
	}
	w := kv.waits[key]
	if w == nil {
		w = &kvWaiters{ch: make(chan struct{})}
		kv.waits[key] = w
	}
	w.n++
	kv.mu.Unlock()

	select {
	case <-w.ch:
		kv.mu.Lock()
		defer kv.mu.Unlock()
		return bytes.Clone(kv.vals[key]), nil
	case <-ctx.Done():
		kv.mu.Lock()
		defer kv.mu.Unlock()
		if w.n--; w.n == 0 && kv.waits[key] == w {
			delete(kv.waits, key)
		}
		return nil, fmt.Errorf("kv get %q: %w", key, ctx.Err())
	}
}

// DeletePrefix removes every key that starts with prefix. Gets waiting for
// such keys keep waiting.
func (kv *MemKV) DeletePrefix(ctx context.Context, prefix string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("kv delete prefix %q: %w", prefix, err)
	}
	kv.mu.Lock()
	defer kv.mu.Unlock()
	for k, v := range kv.vals {
		if strings.HasPrefix(k, prefix) {
			kv.size -= len(k) + len(v)
			delete(kv.vals, k)
		}
	}
	return nil
}
