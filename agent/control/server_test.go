package control

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/agentconn"
	"github.com/ddp-agent/ddp-agent/wire"
)

func TestHelloWelcome(t *testing.T) {
	leakCheck(t)
	s := startServer(t, Config{})
	s.SetGeneration(5, 16, map[string]string{"master": "10.0.0.1:29500"})
	_, w := dial(t, s, selfHello(5))
	want := wire.Welcome{JobID: "job", Generation: 5, WorldSize: 16, Rank: testRank, Config: map[string]string{"master": "10.0.0.1:29500"}}
	if !reflect.DeepEqual(w, want) {
		t.Errorf("got %+v, want %+v", w, want)
	}
	if got := s.Conns(); got != 1 {
		t.Errorf("Conns: got %d, want 1", got)
	}
}

func TestKVAcrossClients(t *testing.T) {
	leakCheck(t)
	kv := NewMemKV()
	s := startServer(t, Config{KV: kv})
	c1, _ := dial(t, s, selfHello(0))
	c2, _ := dial(t, s, selfHello(0))

	type result struct {
		v   []byte
		err error
	}
	got := make(chan result, 1)
	go func() {
		v, err := c1.KVGet(context.Background(), "addr", 5*time.Second)
		got <- result{v, err}
	}()
	waitFor(t, "KVGet to block in the store", func() bool {
		kv.mu.Lock()
		defer kv.mu.Unlock()
		return kv.waits["job/0/addr"] != nil
	})
	if err := c2.KVSet(context.Background(), "addr", []byte("10.0.0.2:1234")); err != nil {
		t.Fatalf("KVSet: %v", err)
	}
	select {
	case r := <-got:
		if r.err != nil || string(r.v) != "10.0.0.2:1234" {
			t.Errorf("KVGet: got %q %v, want %q", r.v, r.err, "10.0.0.2:1234")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("KVGet was not woken by KVSet")
	}
	// A value that already exists is returned at once.
	v, err := c2.KVGet(context.Background(), "addr", 0)
	if err != nil || string(v) != "10.0.0.2:1234" {
		t.Errorf("second KVGet: got %q %v, want %q", v, err, "10.0.0.2:1234")
	}
}

func TestKVGetTimeout(t *testing.T) {
	leakCheck(t)
	s := startServer(t, Config{})
	c, _ := dial(t, s, selfHello(0))
	start := time.Now()
	_, err := c.KVGet(context.Background(), "missing", 100*time.Millisecond)
	if !errors.Is(err, wire.ErrTimeout) {
		t.Fatalf("got %v, want %v", err, wire.ErrTimeout)
	}
	var re *wire.RemoteError
	if !errors.As(err, &re) || re.Code != wire.CodeTimeout {
		t.Errorf("got %v, want a *RemoteError with code %v", err, wire.CodeTimeout)
	}
	if d := time.Since(start); d < 90*time.Millisecond || d > 2*time.Second {
		t.Errorf("KVGet took %v, want about 100ms", d)
	}
	// An empty key is a bad request but keeps the connection.
	if err := c.KVSet(context.Background(), "", nil); !errors.As(err, &re) || re.Code != wire.CodeBadRequest {
		t.Errorf("empty key: got %v, want code %v", err, wire.CodeBadRequest)
	}
	if err := c.KVSet(context.Background(), "k", nil); err != nil {
		t.Errorf("KVSet after bad request: got %v, want nil", err)
	}
}

func TestGenerationScoping(t *testing.T) {
	leakCheck(t)
	kv := NewMemKV()
	s := startServer(t, Config{KV: kv})
	s.SetGeneration(1, 2, nil)
	c1, _ := dial(t, s, selfHello(1))
	if err := c1.KVSet(context.Background(), "k", []byte("gen1")); err != nil {
		t.Fatalf("KVSet: %v", err)
	}
	if v, err := kv.Get(context.Background(), "job/1/k"); err != nil || string(v) != "gen1" {
		t.Errorf("stored key: got %q %v, want %q", v, err, "gen1")
	}

	s.SetGeneration(2, 2, nil)
	select {
	case <-c1.Aborted():
	case <-time.After(5 * time.Second):
		t.Fatal("generation 1 connection was not closed")
	}
	if err := c1.KVSet(context.Background(), "k", nil); !errors.Is(err, agentconn.ErrClosed) {
		t.Errorf("KVSet on closed connection: got %v, want %v", err, agentconn.ErrClosed)
	}
	if err := c1.Close(); err != nil {
		t.Errorf("Close after connection loss: got %v, want nil", err)
	}
	c2, w := dial(t, s, selfHello(2))
	if w.Generation != 2 {
		t.Errorf("Welcome.Generation: got %d, want 2", w.Generation)
	}
	if _, err := c2.KVGet(context.Background(), "k", 50*time.Millisecond); !errors.Is(err, wire.ErrTimeout) {
		t.Errorf("generation 2 KVGet: got %v, want %v", err, wire.ErrTimeout)
	}
}

func TestHandshakeRejected(t *testing.T) {
	tests := []struct {
		name      string
		authorize func(int) (int, error)
		hello     wire.Hello
		want      error
	}{
		{"stale generation", nil, selfHello(1), wire.ErrStaleGeneration},
		{"authorize denies", func(int) (int, error) { return 0, errors.New("no") }, selfHello(0), wire.ErrDenied},
		{"pid mismatch", nil, wire.Hello{Rank: testRank, PID: int32(os.Getpid() + 1)}, wire.ErrDenied},
		{"rank mismatch", nil, wire.Hello{Rank: testRank + 1, PID: int32(os.Getpid())}, wire.ErrDenied},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			leakCheck(t)
			s := startServerWith(t, Config{}, PIDAdmission{Authorize: tc.authorize})
			c, _, err := agentconn.Dial(context.Background(), s.Path(), tc.hello)
			if err == nil {
				c.Close()
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
			if got := s.Conns(); got != 0 {
				t.Errorf("Conns: got %d, want 0", got)
			}
		})
	}
}

func TestEvents(t *testing.T) {
	leakCheck(t)
	type got struct {
		rank int
		ev   wire.Events
	}
	ch := make(chan got, 1)
	s := startServerWith(t, Config{}, PIDAdmission{OnEvents: func(rank int, ev wire.Events) { ch <- got{rank, ev} }})
	c, _ := dial(t, s, selfHello(0))
	ev := wire.Events{Dropped: 2, Events: []wire.CollectiveEvent{{Step: 10, Bucket: 1, Bytes: 4096, DType: 3, Status: 0, TArrive: 1, TStart: 2, TEnd: 3}}}
	if err := c.SendEvents(ev); err != nil {
		t.Fatalf("SendEvents: %v", err)
	}
	select {
	case g := <-ch:
		if g.rank != testRank || !reflect.DeepEqual(g.ev, ev) {
			t.Errorf("got rank %d %+v, want rank %d %+v", g.rank, g.ev, testRank, ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnEvents was not called")
	}
}

func TestSendEventsDoesNotBlock(t *testing.T) {
	leakCheck(t)
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	s := startServerWith(t, Config{}, PIDAdmission{OnEvents: func(int, wire.Events) { <-release }})
	t.Cleanup(unblock) // runs before the server stops
	c, _ := dial(t, s, selfHello(0))
	ev := wire.Events{Events: make([]wire.CollectiveEvent, 20000)} // ~900 KiB
	for i := range 100 {
		start := time.Now()
		err := c.SendEvents(ev)
		if d := time.Since(start); d > agentconn.EventsWriteTimeout+500*time.Millisecond {
			t.Fatalf("SendEvents %d took %v, want at most about %v", i, d, agentconn.EventsWriteTimeout)
		}
		if err != nil {
			return
		}
	}
	t.Fatal("SendEvents never failed although the agent does not read")
}

func TestAbort(t *testing.T) {
	leakCheck(t)
	s := startServer(t, Config{})
	var clients []*agentconn.Client
	for range 3 {
		c, _ := dial(t, s, selfHello(0))
		clients = append(clients, c)
	}
	if n := s.Abort("rank 5 hung"); n != 3 {
		t.Errorf("Abort: got %d, want 3", n)
	}
	for i, c := range clients {
		select {
		case <-c.Aborted():
			if got := c.AbortReason(); got != "rank 5 hung" {
				t.Errorf("client %d reason: got %q, want %q", i, got, "rank 5 hung")
			}
		case <-time.After(5 * time.Second):
			t.Errorf("client %d: Aborted not closed", i)
		}
	}
}

func TestGarbageClosesOnlyThatConnection(t *testing.T) {
	tests := []struct {
		name  string
		hello bool
		send  []byte
	}{
		{"instead of hello", false, []byte("GET / HTTP/1.1\r\n\r\n")},
		{"after hello", true, []byte("\x7a\xda\x01\x09garbage!")},
		{"truncated payload", true, frame(wire.Magic, wire.Version, uint8(wire.TypeKVSet), 3, []byte{9, 0, 0})},
		{"unexpected type", true, encode(t, 5, wire.Welcome{})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			leakCheck(t)
			s := startServer(t, Config{})
			good, _ := dial(t, s, selfHello(0))
			nc := rawConn(t, s, tc.hello)
			if _, err := nc.Write(tc.send); err != nil {
				t.Fatalf("write garbage: %v", err)
			}
			nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			f, err := wire.ReadFrame(nc, 0)
			if err != nil {
				t.Fatalf("read reply: %v", err)
			}
			m, err := wire.Decode(f)
			if e, ok := m.(wire.Error); err != nil || !ok || e.Code != wire.CodeBadRequest {
				t.Errorf("reply: got %#v %v, want Error code %v", m, err, wire.CodeBadRequest)
			}
			// EOF, or ECONNRESET when the server closed with our bytes unread.
			if f, err := wire.ReadFrame(nc, 0); err == nil {
				t.Errorf("after reply: got %v frame, want the connection closed", f.Type)
			}
			if err := good.KVSet(context.Background(), "still", []byte("ok")); err != nil {
				t.Errorf("other client KVSet: got %v, want nil", err)
			}
			waitFor(t, "one connection", func() bool { return s.Conns() == 1 })
		})
	}
}

func TestNonReadingClient(t *testing.T) {
	leakCheck(t)
	s := startServer(t, Config{WriteTimeout: 200 * time.Millisecond})
	good, _ := dial(t, s, selfHello(0))
	nc := rawConn(t, s, true)
	// Ask for megabytes of replies and never read them.
	if err := wire.WriteFrame(nc, 2, wire.KVSet{Key: "big", Value: make([]byte, 1<<20)}); err != nil {
		t.Fatalf("write KVSet: %v", err)
	}
	if f, err := wire.ReadFrame(nc, 0); err != nil || f.Type != wire.TypeOK {
		t.Fatalf("KVSet reply: got %v %v, want OK", f.Type, err)
	}
	for id := range uint32(8) {
		if err := wire.WriteFrame(nc, 3+id, wire.KVGet{Key: "big"}); err != nil {
			t.Fatalf("write KVGet: %v", err)
		}
	}
	time.Sleep(100 * time.Millisecond) // let the server's writes wedge
	if err := good.KVSet(context.Background(), "k", nil); err != nil {
		t.Errorf("reading client KVSet during wedge: got %v, want nil", err)
	}

	start := time.Now()
	// 1 once the wedged connection timed out; 2 in the unlikely case that
	// its replies were not queued yet.
	if n := s.Abort("stop"); n < 1 || n > 2 {
		t.Errorf("Abort: got %d, want 1 or 2", n)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Abort took %v, want well under 2s", d)
	}
	select {
	case <-good.Aborted():
	case <-time.After(2 * time.Second):
		t.Fatal("reading client did not get Abort")
	}
	if err := good.KVSet(context.Background(), "k", nil); err != nil {
		t.Errorf("reading client KVSet: got %v, want nil", err)
	}
	waitFor(t, "the non-reading connection to be closed", func() bool { return s.Conns() == 1 })
}

func TestRunShutdown(t *testing.T) {
	tests := []struct {
		name string
		dir  func(t *testing.T) string
	}{
		{"new dir", func(t *testing.T) string { return filepath.Join(t.TempDir(), "sock") }},
		{"temp dir", func(*testing.T) string { return "" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			leakCheck(t)
			s, err := Listen(Config{Dir: tc.dir(t), Logger: testLogger(t)}, PIDAdmission{Authorize: authorizeSelf})
			if err != nil {
				t.Fatalf("Listen: %v", err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()

			c, _ := dial(t, s, selfHello(0))
			getErr := make(chan error, 1)
			go func() {
				_, err := c.KVGet(context.Background(), "never", time.Minute)
				getErr <- err
			}()
			time.Sleep(20 * time.Millisecond)

			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: got %v, want nil", err)
				}
			case <-time.After(2 * time.Second):
				t.Fatal("Run did not return promptly after cancel")
			}
			if _, err := os.Stat(s.Path()); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("socket after Run: got %v, want not exist", err)
			}
			if _, err := os.Stat(filepath.Dir(s.Path())); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("dir after Run: got %v, want not exist", err)
			}
			select {
			case err := <-getErr:
				if !errors.Is(err, agentconn.ErrClosed) {
					t.Errorf("pending KVGet: got %v, want %v", err, agentconn.ErrClosed)
				}
			case <-time.After(2 * time.Second):
				t.Error("pending KVGet not woken")
			}
			<-c.Aborted()
		})
	}
}

func TestPermissions(t *testing.T) {
	leakCheck(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, Config{Dir: dir})
	for _, tc := range []struct {
		name string
		path string
		want fs.FileMode
	}{
		{"socket", s.Path(), 0o600},
		{"dir", dir, 0o700},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fi, err := os.Stat(tc.path)
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Mode().Perm(); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	if filepath.Base(s.Path()) != SocketName {
		t.Errorf("socket name: got %q, want %q", filepath.Base(s.Path()), SocketName)
	}
}

func TestClientClose(t *testing.T) {
	leakCheck(t)
	s := startServer(t, Config{})
	c, _ := dial(t, s, selfHello(0))
	getErr := make(chan error, 1)
	go func() {
		_, err := c.KVGet(context.Background(), "never", time.Minute)
		getErr <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Errorf("Close: got %v, want nil", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: got %v, want nil", err)
	}
	select {
	case err := <-getErr:
		if !errors.Is(err, agentconn.ErrClosed) {
			t.Errorf("pending KVGet: got %v, want %v", err, agentconn.ErrClosed)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("pending KVGet not woken by Close")
	}
	if err := c.KVSet(context.Background(), "k", nil); !errors.Is(err, agentconn.ErrClosed) {
		t.Errorf("KVSet after Close: got %v, want %v", err, agentconn.ErrClosed)
	}
	if err := c.SendEvents(wire.Events{}); !errors.Is(err, agentconn.ErrClosed) {
		t.Errorf("SendEvents after Close: got %v, want %v", err, agentconn.ErrClosed)
	}
	waitFor(t, "server to drop the connection", func() bool { return s.Conns() == 0 })
}

func TestConcurrentCalls(t *testing.T) {
	leakCheck(t)
	s := startServer(t, Config{})
	c, _ := dial(t, s, selfHello(0))
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := string(rune('a' + i))
			want := bytes.Repeat([]byte{byte(i)}, i*100)
			if err := c.KVSet(context.Background(), key, want); err != nil {
				errs <- err
				return
			}
			got, err := c.KVGet(context.Background(), key, time.Second)
			if err != nil || !bytes.Equal(got, want) {
				errs <- errors.Join(err, errors.New("value mismatch for "+key))
			}
			if err := c.SendEvents(wire.Events{Dropped: uint64(i)}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestKVGetContextCancel(t *testing.T) {
	leakCheck(t)
	s := startServer(t, Config{})
	c, _ := dial(t, s, selfHello(0))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.KVGet(ctx, "never", time.Minute); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want %v", err, context.DeadlineExceeded)
	}
	// The connection is still usable and the late reply is discarded.
	if err := c.KVSet(context.Background(), "k", []byte("v")); err != nil {
		t.Errorf("KVSet after cancel: got %v, want nil", err)
	}
}

func TestMemKV(t *testing.T) {
	leakCheck(t)
	kv := NewMemKV()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := kv.Get(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Get: got %v, want %v", err, context.DeadlineExceeded)
	}
	if n := len(kv.waits); n != 0 {
		t.Errorf("waiters after cancel: got %d, want 0", n)
	}
	v := []byte("v1")
	if err := kv.Set(context.Background(), "k", v); err != nil {
		t.Fatal(err)
	}
	v[0] = 'x'
	got, err := kv.Get(context.Background(), "k")
	if err != nil || string(got) != "v1" {
		t.Errorf("Get: got %q %v, want %q", got, err, "v1")
	}
}

// TestLongTMPDIR: a TMPDIR too long for a unix socket path must not stop
// the agent from listening.
func TestLongTMPDIR(t *testing.T) {
	leakCheck(t)
	long := filepath.Join(t.TempDir(), strings.Repeat("d", 120))
	if err := os.MkdirAll(long, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", long)
	s, err := Listen(Config{JobID: "job"}, PIDAdmission{Authorize: authorizeSelf})
	if err != nil {
		t.Fatalf("Listen under a %d-byte TMPDIR: %v", len(long), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	if len(s.Path()) >= 108 || strings.HasPrefix(s.Path(), long) {
		t.Errorf("socket path %q, want one outside the long TMPDIR", s.Path())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(s.Path())); !os.IsNotExist(err) {
		t.Errorf("socket dir left behind: %v", err)
	}
}

func TestMemKVLimitAndDeletePrefix(t *testing.T) {
	ctx := context.Background()
	kv := NewMemKV()
	kv.limit = 1 << 10
	big := make([]byte, kv.limit/2) // two such entries, with their keys, exceed the limit
	if err := kv.Set(ctx, "job/0/a", big); err != nil {
		t.Fatal(err)
	}
	if err := kv.Set(ctx, "job/0/a", big); err != nil { // replacing does not double count
		t.Fatalf("replace: %v", err)
	}
	if err := kv.Set(ctx, "job/0/b", big); !errors.Is(err, ErrKVFull) {
		t.Fatalf("second half-limit value: got %v, want ErrKVFull", err)
	}
	if err := kv.Set(ctx, "job/1/x", []byte("keep")); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, Config{JobID: "job", KV: kv})
	if err := s.DropGeneration(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := kv.Set(ctx, "job/2/b", big); err != nil {
		t.Errorf("after dropping generation 0: %v, want room again", err)
	}
	if v, err := kv.Get(ctx, "job/1/x"); err != nil || string(v) != "keep" {
		t.Errorf("generation 1's key: got %q, %v; want it kept", v, err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := kv.Get(short, "job/0/a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("dropped key: got %v, want it gone", err)
	}
}
