package sidecar

import (
	"context"
	"sync"
)

// relayKV is the store the watch's relay plan uses, for one job: the
// sidecars of a job share none, so the leader's endpoint travels through
// the workers instead. The leading sidecar's watch Sets it and the
// sidecar hands it to rank 0's hook in its Welcome; the hook publishes it
// in torch's store; the other nodes' hooks read it there and send it in
// their Hello, which Sets it on their sidecar, whose watch Gets it.
type relayKV struct {
	mu    sync.Mutex
	vals  map[string][]byte
	ready chan struct{} // closed and replaced at each Set
	last  string        // the last value set, for the Welcome
}

func newRelayKV() *relayKV { return &relayKV{vals: map[string][]byte{}, ready: make(chan struct{})} }

func (k *relayKV) Set(_ context.Context, key string, value []byte) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.vals[key] = value
	k.last = string(value)
	close(k.ready)
	k.ready = make(chan struct{})
	return nil
}

func (k *relayKV) Get(ctx context.Context, key string) ([]byte, error) {
	for {
		k.mu.Lock()
		v, ok := k.vals[key]
		ready := k.ready
		k.mu.Unlock()
		if ok {
			return v, nil
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// published is the last endpoint set.
func (k *relayKV) published() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.last
}
