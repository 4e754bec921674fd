package store

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrValueTooLarge is returned by KV.Set when the store refuses a value for
// its size (etcd's default request limit is 1.5 MiB).
var ErrValueTooLarge = errors.New("value too large for the rendezvous store")

// KV is the control socket's key-value store (control.KV) backed by etcd,
// so that workers on every node see the same keys. It has the semantics of
// control.MemKV and is safe for concurrent use.
type KV struct {
	cli    *clientv3.Client
	prefix string

	// compact: DeletePrefix also frees the space of what it deleted the
	// time before (see there); set for a store the job's agents host.
	compact bool
	mu      sync.Mutex
	dropRev int64 // the revision of the last DeletePrefix; 0 none
}

// NewKV returns a KV that stores every key at prefix+key of cli's store.
func NewKV(cli *Client, prefix string) *KV {
	return &KV{cli: cli.etcd, prefix: prefix}
}

// NewHostedKV is NewKV for a store the job's agents host, which the KV
// keeps bounded: see DeletePrefix.
func NewHostedKV(cli *Client, prefix string) *KV {
	kv := NewKV(cli, prefix)
	kv.compact = true
	return kv
}

// Set stores value under key.
func (kv *KV) Set(ctx context.Context, key string, value []byte) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("kv set %q: %w", key, err)
	}
	if _, err := kv.cli.Put(ctx, kv.prefix+key, string(value)); err != nil {
		if tooLarge(err) {
			return fmt.Errorf("kv set %q (%d bytes): %w: %v", key, len(value), ErrValueTooLarge, err)
		}
		return wrapErr(ctx, "kv set", key, err)
	}
	return nil
}

// Get returns the value under key, blocking until it is set or ctx is done.
// It waits with a watch that starts right after the revision of its first
// read, so a Set in between is not missed and nothing polls.
func (kv *KV) Get(ctx context.Context, key string) ([]byte, error) {
	k := kv.prefix + key
	for {
		resp, err := kv.cli.Get(ctx, k)
		if err != nil {
			return nil, wrapErr(ctx, "kv get", key, err)
		}
		if len(resp.Kvs) > 0 {
			return resp.Kvs[0].Value, nil
		}
		v, found, err := kv.watch(ctx, k, resp.Header.Revision+1)
		if err != nil {
			return nil, wrapErr(ctx, "kv get", key, err)
		}
		if found {
			return v, nil
		}
		// The watch ended without an answer for a reason a fresh read
		// fixes (compaction, a member that lost its leader): read again.
	}
}

// watch waits for a put of k at or after rev. found is false when the watch
// ended in a way the caller should recover from by reading again.
func (kv *KV) watch(ctx context.Context, k string, rev int64) (v []byte, found bool, err error) {
	// The child context is what stops the watch (and its goroutines in the
	// client) when we return, whichever way we return.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Requiring a leader makes a member cut off from the cluster end the
	// watch instead of leaving it silent forever; the retry then reaches a
	// member that has one.
	wch := kv.cli.Watch(clientv3.WithRequireLeader(wctx), k,
		clientv3.WithRev(rev), clientv3.WithFilterDelete())
	for wresp := range wch {
		if err := wresp.Err(); err != nil {
			if errors.Is(err, rpctypes.ErrCompacted) || errors.Is(err, rpctypes.ErrNoLeader) {
				return nil, false, nil
			}
			return nil, false, err
		}
		for _, ev := range wresp.Events {
			if ev.Type == mvccpb.Event_PUT {
				return ev.Kv.Value, true, nil
			}
		}
	}
	// The client closes the channel when wctx is done or the client is
	// closed.
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	return nil, false, errors.New("watch closed (client closed?)")
}

// DeletePrefix removes every key that starts with prefix. Gets waiting for
// such keys keep waiting.
//
// A deleted key's space comes back only once etcd compacts its history,
// and auto-compaction keeps revisions by count, whatever their size: a
// job whose workers wrote megabytes each generation filled a 2 GiB store
// in a few generations, and etcd then refuses every write. So a hosted
// KV compacts, at each DeletePrefix, up to the previous one: one
// generation late, which keeps the history of the round now running
// (departedSince reads how members left it) and costs the store twice
// one generation's keys.
func (kv *KV) DeletePrefix(ctx context.Context, prefix string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("kv delete prefix %q: %w", prefix, err)
	}
	resp, err := kv.cli.Delete(ctx, kv.prefix+prefix, clientv3.WithPrefix())
	if err != nil {
		return wrapErr(ctx, "kv delete prefix", prefix, err)
	}
	if !kv.compact {
		return nil
	}
	kv.mu.Lock()
	rev := kv.dropRev
	kv.dropRev = max(kv.dropRev, resp.Header.Revision)
	kv.mu.Unlock()
	if rev == 0 {
		return nil
	}
	// Physical: return once the space is free, not merely scheduled.
	_, err = kv.cli.Compact(ctx, rev, clientv3.WithCompactPhysical())
	if err != nil && !errors.Is(err, rpctypes.ErrCompacted) { // another agent compacted as far or further
		return wrapErr(ctx, "kv compact after deleting", prefix, err)
	}
	return nil
}

// wrapErr adds the operation and key to err, and makes sure an error caused
// by ctx wraps ctx.Err(): the control server maps context.DeadlineExceeded
// to a Timeout reply, and some client errors only describe the deadline.
func wrapErr(ctx context.Context, op, key string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
		return fmt.Errorf("%s %q: %w (%v)", op, key, ctxErr, err)
	}
	return fmt.Errorf("%s %q: %w", op, key, err)
}

// tooLarge reports whether err is a refusal for size, by the server (its
// request limit) or by the client (its send limit, 2 MiB by default).
func tooLarge(err error) bool {
	if errors.Is(err, rpctypes.ErrRequestTooLarge) {
		return true
	}
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.ResourceExhausted
}
