package store

import (
	"context"
	"log/slog"
	"runtime"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ddp-agent/ddp-agent/agent/rdzv/store/storetest"
)

// testLogger sends etcd's warnings to the test's output, shown on failure or
// with -v.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// startServer starts an embedded etcd on a free loopback port, closed when
// the test ends.
func startServer(t *testing.T, cfg ServerConfig) *Server {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	begin := time.Now()
	s, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Logf("Start took %v", time.Since(begin))
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// dial dials endpoints, closing the client when the test ends. It returns
// the etcd client underneath, for the tests to drive the store directly.
func dial(t *testing.T, cfg ClientConfig) *clientv3.Client {
	t.Helper()
	return dialClient(t, cfg).Etcd()
}

// dialClient is dial returning the store's Client itself.
func dialClient(t *testing.T, cfg ClientConfig) *Client {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	cli, err := Dial(t.Context(), cfg)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// testCluster starts an n-member cluster, closed when the test ends,
// after the cleanups registered later (they run first).
func testCluster(t *testing.T, n int) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	c, err := StartCluster(ctx, n, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// deadAddr returns a loopback address nobody listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	addr, err := FreeAddr("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// settleGoroutines waits for the goroutine count to fall to at most want,
// returning the last count seen.
func settleGoroutines(want int, within time.Duration) int {
	deadline := time.Now().Add(within)
	for {
		n := runtime.NumGoroutine()
		if n <= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testPKI is a CA with a server and a client certificate for 127.0.0.1,
// written as PEM files.
type testPKI = storetest.PKI

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	p, err := storetest.NewPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return p
}
