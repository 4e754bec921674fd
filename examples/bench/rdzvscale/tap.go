package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// The agents' store requests, counted (-detail): the clients' KV, Lease
// and Watcher are wrapped (see tapClients). That needs etcd's client types,
// which agent/rdzv keeps to itself everywhere else, so this is the one file
// of the benchmark that imports etcd: the rest dials and opens through
// agent/rdzv/store and agent/rdzv, and names the client etcdClient.

// etcdClient is what store.Dial returns and rdzv.Open takes; its Etcd is
// the etcd client that tapClients wraps.
type etcdClient = store.Client

// opStat is one kind of request in one phase: latencies, when the first
// and the last completed, bytes read, errors.
type opStat struct {
	lat         []time.Duration
	first, last time.Duration // completions, from the start of the phase
	bytes       int64
	errs        int
}

// opStats are one phase's requests, by kind; safe to use concurrently.
type opStats struct {
	mu    sync.Mutex
	start time.Time
	m     map[string]*opStat
}

func newOpStats() *opStats { return &opStats{m: map[string]*opStat{}, start: time.Now()} }

func (s *opStats) add(kind string, d time.Duration, bytes int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.m[kind]
	at := time.Since(s.start)
	if st == nil {
		st = &opStat{first: at}
		s.m[kind] = st
	}
	st.last = at
	st.lat = append(st.lat, d)
	st.bytes += int64(bytes)
	if err != nil {
		st.errs++
	}
}

// tap is shared by the wrappers of every client: cur is the current
// phase's stats (nil: not counting).
type tap struct {
	prefix string
	cur    atomic.Pointer[opStats]
}

func (t *tap) add(kind string, start time.Time, bytes int, err error) {
	if s := t.cur.Load(); s != nil {
		s.add(kind, time.Since(start), bytes, err)
	}
}

// rel names a key by its place in the job's prefix, its last part elided.
func (t *tap) rel(key []byte) string {
	k := string(key)
	if k == rdzv.HostKey {
		return "host"
	}
	k = strings.TrimPrefix(k, t.prefix)
	if i := strings.IndexByte(k, '/'); i >= 0 {
		return k[:i+1] + "…"
	}
	return k
}

// opKind names a request by what it does and to which key.
func (t *tap) opKind(op clientv3.Op) string {
	switch {
	case op.IsGet():
		s := "get " + t.rel(op.KeyBytes())
		if op.IsSortSet() {
			s += " sorted"
		}
		if op.Limit() > 0 {
			s += fmt.Sprintf(" limit %d", op.Limit())
		}
		if op.IsCountOnly() {
			s += " count"
		}
		return s
	case op.IsPut():
		return "put " + t.rel(op.KeyBytes())
	case op.IsDelete():
		return "delete " + t.rel(op.KeyBytes())
	}
	return "txn"
}

// kvTap counts the KV requests (Get, Put, Txn) of a client.
type kvTap struct {
	clientv3.KV
	t *tap
}

func (k kvTap) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	start := time.Now()
	resp, err := k.KV.Get(ctx, key, opts...)
	n := 0
	if resp != nil {
		for _, kv := range resp.Kvs {
			n += len(kv.Key) + len(kv.Value)
		}
	}
	k.t.add("Get: "+k.t.opKind(clientv3.OpGet(key, opts...)), start, n, err)
	return resp, err
}

func (k kvTap) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	start := time.Now()
	resp, err := k.KV.Put(ctx, key, val, opts...)
	k.t.add("Put: "+k.t.rel([]byte(key)), start, 0, err)
	return resp, err
}

func (k kvTap) Txn(ctx context.Context) clientv3.Txn {
	return &txnTap{txn: k.KV.Txn(ctx), t: k.t}
}

// txnTap names a transaction by its Then operations and counts its Commit.
type txnTap struct {
	txn  clientv3.Txn
	t    *tap
	then []string
}

func (x *txnTap) If(cs ...clientv3.Cmp) clientv3.Txn { x.txn = x.txn.If(cs...); return x }
func (x *txnTap) Else(ops ...clientv3.Op) clientv3.Txn {
	x.txn = x.txn.Else(ops...)
	return x
}
func (x *txnTap) Then(ops ...clientv3.Op) clientv3.Txn {
	x.txn = x.txn.Then(ops...)
	for _, op := range ops {
		x.then = append(x.then, x.t.opKind(op))
	}
	return x
}
func (x *txnTap) Commit() (*clientv3.TxnResponse, error) {
	start := time.Now()
	resp, err := x.txn.Commit()
	n := 0
	if resp != nil {
		for _, r := range resp.Responses {
			if rr := r.GetResponseRange(); rr != nil {
				for _, kv := range rr.Kvs {
					n += len(kv.Key) + len(kv.Value)
				}
			}
		}
	}
	x.t.add("Txn: "+strings.Join(x.then, ", "), start, n, err)
	return resp, err
}

// leaseTap counts lease grants and revocations.
type leaseTap struct {
	clientv3.Lease
	t *tap
}

func (l leaseTap) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	start := time.Now()
	resp, err := l.Lease.Grant(ctx, ttl)
	l.t.add("Lease: grant", start, 0, err)
	return resp, err
}

func (l leaseTap) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	start := time.Now()
	resp, err := l.Lease.Revoke(ctx, id)
	l.t.add("Lease: revoke", start, 0, err)
	return resp, err
}

// watchTap counts watches, and their events as they arrive.
type watchTap struct {
	clientv3.Watcher
	t *tap
}

func (w watchTap) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	what := w.t.rel([]byte(key))
	w.t.add("Watch: "+what, time.Now(), 0, nil)
	in := w.Watcher.Watch(ctx, key, opts...)
	// Forward the responses, noting when events arrive and their size.
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		for resp := range in {
			if len(resp.Events) > 0 {
				n := 0
				for _, ev := range resp.Events {
					n += len(ev.Kv.Key) + len(ev.Kv.Value)
				}
				w.t.add("Watch event: "+what, time.Now(), n, nil)
			}
			select {
			case out <- resp:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// tapClients wraps each client's KV, Lease and Watcher, so that their
// requests are counted in tp's current phase.
func tapClients(clis []*etcdClient, tp *tap) {
	for _, cli := range clis {
		c := cli.Etcd()
		c.KV = kvTap{KV: c.KV, t: tp}
		c.Lease = leaseTap{Lease: c.Lease, t: tp}
		c.Watcher = watchTap{Watcher: c.Watcher, t: tp}
	}
}
