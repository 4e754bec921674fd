package control

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/agentconn"
	"github.com/ddp-agent/ddp-agent/wire"
)

// leakCheck fails t if, after t's other cleanups, more goroutines are running
// than when it was called. Call it first so its cleanup runs last.
func leakCheck(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(3 * time.Second)
		for {
			n := runtime.NumGoroutine()
			if n <= before {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Errorf("goroutines after test: got %d, want <= %d\n%s", n, before, buf)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// waitFor polls cond until it is true or fails t after a few seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

const testRank = 3

// authorizeSelf maps this test process to testRank and denies other pids.
func authorizeSelf(pid int) (int, error) {
	if pid == os.Getpid() {
		return testRank, nil
	}
	return 0, errors.New("unknown pid")
}

func selfHello(gen uint64) wire.Hello {
	return wire.Hello{Rank: testRank, LocalRank: 1, PID: int32(os.Getpid()), Generation: gen, Transports: []string{"nccl"}}
}

// startServer listens with cfg (filling in test defaults) for this
// process as the worker of testRank, and runs the server until the test
// ends.
func startServer(t *testing.T, cfg Config) *Server {
	t.Helper()
	return startServerWith(t, cfg, PIDAdmission{})
}

// startServerWith is startServer with adm; its nil Authorize is
// authorizeSelf.
func startServerWith(t *testing.T, cfg Config, adm PIDAdmission) *Server {
	t.Helper()
	if adm.Authorize == nil {
		adm.Authorize = authorizeSelf
	}
	return runServer(t, cfg, func(cfg Config) (*Server, error) { return Listen(cfg, adm) })
}

// startSidecarServer is startServer for a server under sc (ListenSidecar).
func startSidecarServer(t *testing.T, cfg Config, sc Sidecar) *Server {
	t.Helper()
	return runServer(t, cfg, func(cfg Config) (*Server, error) { return ListenSidecar(cfg, sc) })
}

// runServer listens with cfg (filling in test defaults) through listen and
// runs the server until the test ends.
func runServer(t *testing.T, cfg Config, listen func(Config) (*Server, error)) *Server {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if cfg.JobID == "" {
		cfg.JobID = "job"
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	s, err := listen(cfg)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: got %v, want nil", err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("Run did not return after cancel")
		}
	})
	return s
}

func dial(t *testing.T, s *Server, hello wire.Hello) (*agentconn.Client, wire.Welcome) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, w, err := agentconn.Dial(ctx, s.Path(), hello)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c, w
}

// rawConn connects without a Client and, if hello is set, completes the
// handshake by hand.
func rawConn(t *testing.T, s *Server, hello bool) net.Conn {
	t.Helper()
	nc, err := net.Dial("unix", s.Path())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { nc.Close() })
	if hello {
		if err := wire.WriteFrame(nc, 1, selfHello(0)); err != nil {
			t.Fatalf("write hello: %v", err)
		}
		f, err := wire.ReadFrame(nc, 0)
		if err != nil || f.Type != wire.TypeWelcome {
			t.Fatalf("read welcome: got %v %v, want Welcome", f.Type, err)
		}
	}
	return nc
}

// frame builds a raw frame with the given header fields and payload.
func frame(magic uint16, version, typ uint8, length uint32, payload []byte) []byte {
	b := binary.LittleEndian.AppendUint16(nil, magic)
	b = append(b, version, typ)
	b = binary.LittleEndian.AppendUint32(b, 1)
	b = binary.LittleEndian.AppendUint32(b, length)
	return append(b, payload...)
}

func encode(t testing.TB, id uint32, m wire.Message) []byte {
	t.Helper()
	b, err := wire.AppendFrame(nil, id, m)
	if err != nil {
		t.Fatalf("encode %v: %v", m.Type(), err)
	}
	return b
}
