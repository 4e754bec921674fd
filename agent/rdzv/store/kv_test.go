package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/control"
)

var _ control.KV = (*KV)(nil)

// kvFixture is one server shared by the KV tests: starting etcd is the slow
// part, and each test uses its own prefix.
type kvFixture struct {
	srv *Server
}

func newKV(t *testing.T, f *kvFixture, prefix string) *KV {
	t.Helper()
	cli := dial(t, ClientConfig{Endpoints: []string{f.srv.Endpoint()}})
	return NewKV(NewClient(cli), prefix)
}

func TestKV(t *testing.T) {
	f := &kvFixture{srv: startServer(t, ServerConfig{})}
	t.Run("GetBlocksUntilSet", func(t *testing.T) { testKVGetBlocksUntilSet(t, f) })
	t.Run("GetDeadline", func(t *testing.T) { testKVGetDeadline(t, f) })
	t.Run("GetCanceled", func(t *testing.T) { testKVGetCanceled(t, f) })
	t.Run("Prefix", func(t *testing.T) { testKVPrefix(t, f) })
	t.Run("DeletePrefix", func(t *testing.T) { testKVDeletePrefix(t, f) })
	t.Run("Overwrite", func(t *testing.T) { testKVOverwrite(t, f) })
	t.Run("Concurrent", func(t *testing.T) { testKVConcurrent(t, f) })
	t.Run("TooLarge", func(t *testing.T) { testKVTooLarge(t, f) })
	t.Run("SetCanceled", func(t *testing.T) { testKVSetCanceled(t, f) })
}

func testKVGetBlocksUntilSet(t *testing.T, f *kvFixture) {
	kv := newKV(t, f, "/blocks/")
	got := make(chan []byte, 1)
	errc := make(chan error, 1)
	go func() {
		v, err := kv.Get(t.Context(), "k")
		if err != nil {
			errc <- err
			return
		}
		got <- v
	}()
	select {
	case v := <-got:
		t.Fatalf("Get returned %q before Set", v)
	case err := <-errc:
		t.Fatalf("Get: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	// Another client sets it, as another node would.
	other := newKV(t, f, "/blocks/")
	if err := other.Set(t.Context(), "k", []byte("hello")); err != nil {
		t.Fatalf("Set: %v", err)
	}
	select {
	case v := <-got:
		if string(v) != "hello" {
			t.Fatalf("Get = %q, want hello", v)
		}
	case err := <-errc:
		t.Fatalf("Get: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("Get still blocked 5s after Set")
	}
	// Now the key exists, Get returns at once.
	if v, err := kv.Get(t.Context(), "k"); err != nil || string(v) != "hello" {
		t.Fatalf("Get = %q, %v", v, err)
	}
}

func testKVGetDeadline(t *testing.T, f *kvFixture) {
	kv := newKV(t, f, "/deadline/")
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	begin := time.Now()
	_, err := kv.Get(ctx, "never")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get: %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(begin); d > 2*time.Second {
		t.Errorf("Get returned %v after its deadline", d)
	}
	t.Logf("Get: %v", err)
}

func testKVGetCanceled(t *testing.T, f *kvFixture) {
	kv := newKV(t, f, "/canceled/")
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := kv.Get(ctx, "never")
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Get: %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Get still blocked 5s after cancel")
	}
}

func testKVPrefix(t *testing.T, f *kvFixture) {
	kv := newKV(t, f, "/job1/")
	if err := kv.Set(t.Context(), "rank0", []byte("addr")); err != nil {
		t.Fatal(err)
	}
	resp, err := kv.cli.Get(t.Context(), "/job1/rank0")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "addr" {
		t.Fatalf("raw Get /job1/rank0 = %v, want addr", resp.Kvs)
	}
	// Another prefix does not see it.
	other := NewKV(NewClient(kv.cli), "/job2/")
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, err := other.Get(ctx, "rank0"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get under another prefix: %v, want a timeout", err)
	}
}

func testKVDeletePrefix(t *testing.T, f *kvFixture) {
	kv := newKV(t, f, "/del/")
	ctx := t.Context()
	for _, k := range []string{"gen1/a", "gen1/b", "gen2/a"} {
		if err := kv.Set(ctx, k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	if err := kv.DeletePrefix(ctx, "gen1/"); err != nil {
		t.Fatalf("DeletePrefix: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := kv.Get(short, "gen1/a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get of a deleted key: %v, want a timeout", err)
	}
	if v, err := kv.Get(ctx, "gen2/a"); err != nil || string(v) != "gen2/a" {
		t.Fatalf("Get gen2/a = %q, %v", v, err)
	}

	// A Get waiting on a deleted key keeps waiting and sees the next Set.
	got := make(chan []byte, 1)
	go func() {
		v, _ := kv.Get(ctx, "gen1/b")
		got <- v
	}()
	time.Sleep(50 * time.Millisecond)
	if err := kv.DeletePrefix(ctx, "gen1/"); err != nil {
		t.Fatal(err)
	}
	if err := kv.Set(ctx, "gen1/b", []byte("again")); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-got:
		if string(v) != "again" {
			t.Fatalf("Get = %q, want again", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Get still blocked 5s after Set")
	}
}

func testKVOverwrite(t *testing.T, f *kvFixture) {
	kv := newKV(t, f, "/over/")
	ctx := t.Context()
	for _, v := range []string{"one", "two"} {
		if err := kv.Set(ctx, "k", []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := kv.Get(ctx, "k"); err != nil || string(v) != "two" {
		t.Fatalf("Get = %q, %v, want two", v, err)
	}
	// An empty value is a value: Get must not wait for it.
	if err := kv.Set(ctx, "empty", nil); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if v, err := kv.Get(short, "empty"); err != nil || len(v) != 0 {
		t.Fatalf("Get empty = %q, %v", v, err)
	}
}

func testKVConcurrent(t *testing.T, f *kvFixture) {
	// Two clients, as two nodes: getters on one, setters on the other, with
	// the getters mostly starting first so most Gets wait on a watch.
	getKV := newKV(t, f, "/conc/")
	setKV := newKV(t, f, "/conc/")
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	const workers, keys = 8, 25
	var wg sync.WaitGroup
	errc := make(chan error, 2*workers*keys)
	for w := range workers {
		wg.Go(func() {
			for i := range keys {
				k := fmt.Sprintf("w%d/k%d", w, i)
				v, err := getKV.Get(ctx, k)
				if err != nil {
					errc <- err
					return
				}
				if want := []byte(k); !bytes.Equal(v, want) {
					errc <- fmt.Errorf("Get %s = %q", k, v)
				}
			}
		})
		wg.Go(func() {
			for i := range keys {
				k := fmt.Sprintf("w%d/k%d", w, i)
				if err := setKV.Set(ctx, k, []byte(k)); err != nil {
					errc <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

func testKVTooLarge(t *testing.T, f *kvFixture) {
	kv := newKV(t, f, "/large/")
	ctx := t.Context()
	// Just under the server's 1.5 MiB request limit works.
	if err := kv.Set(ctx, "ok", make([]byte, 1<<20)); err != nil {
		t.Fatalf("Set of 1 MiB: %v", err)
	}
	// Over the server's limit, and over the client's 2 MiB send limit.
	for _, n := range []int{1600 << 10, 3 << 20} {
		err := kv.Set(ctx, "big", make([]byte, n))
		if !errors.Is(err, ErrValueTooLarge) {
			t.Fatalf("Set of %d bytes: %v, want ErrValueTooLarge", n, err)
		}
		t.Logf("Set of %d bytes: %v", n, err)
	}
}

func testKVSetCanceled(t *testing.T, f *kvFixture) {
	kv := newKV(t, f, "/setcanceled/")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := kv.Set(ctx, "k", []byte("v")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Set: %v, want context.Canceled", err)
	}
	if err := kv.DeletePrefix(ctx, ""); !errors.Is(err, context.Canceled) {
		t.Fatalf("DeletePrefix: %v, want context.Canceled", err)
	}
}
