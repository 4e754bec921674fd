package store

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestStartPortZero(t *testing.T) {
	s := startServer(t, ServerConfig{ClientAddr: "127.0.0.1:0"})
	host, port, err := net.SplitHostPort(s.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	if host != "127.0.0.1" || port == "0" {
		t.Fatalf("Endpoint() = %q, want 127.0.0.1 and a real port", s.Endpoint())
	}

	cli := dial(t, ClientConfig{Endpoints: []string{s.Endpoint()}})
	ctx := t.Context()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("Put: %v", err)
	}
	resp, err := cli.Get(ctx, "k")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("Get = %v, want v", resp.Kvs)
	}

	// The short ticks of a lone member allow one-second leases (etcd
	// raises shorter TTLs to 1.5 election timeouts, rounded up).
	lease, err := cli.Grant(ctx, 1)
	if err != nil {
		t.Fatalf("Grant: %v", err)
	}
	if lease.TTL != 1 {
		t.Errorf("Grant(1).TTL = %d, want 1", lease.TTL)
	}
}

func TestStartAddrInUse(t *testing.T) {
	first := startServer(t, ServerConfig{})

	begin := time.Now()
	s, err := Start(t.Context(), ServerConfig{ClientAddr: first.Endpoint(), Logger: testLogger(t)})
	if err == nil {
		s.Close()
		t.Fatal("second Start on the same address succeeded")
	}
	if !errors.Is(err, ErrAddrInUse) {
		t.Fatalf("second Start: %v, want ErrAddrInUse", err)
	}
	if d := time.Since(begin); d > time.Second {
		t.Errorf("second Start took %v to fail, want well under a second", d)
	}
	t.Logf("second Start: %v", err)

	// The first server is unharmed.
	cli := dial(t, ClientConfig{Endpoints: []string{first.Endpoint()}})
	if _, err := cli.Put(t.Context(), "still", "here"); err != nil {
		t.Fatalf("Put to first server: %v", err)
	}

	// Someone other than etcd holding the port counts too.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := Start(t.Context(), ServerConfig{ClientAddr: l.Addr().String()}); !errors.Is(err, ErrAddrInUse) {
		t.Fatalf("Start on a held port: %v, want ErrAddrInUse", err)
	}
}

// Two agents on one host starting at once race for the port: exactly one
// must host the store and the other must see ErrAddrInUse.
func TestStartRace(t *testing.T) {
	addr := deadAddr(t)
	const n = 3
	type result struct {
		s   *Server
		err error
	}
	results := make(chan result, n)
	for range n {
		go func() {
			s, err := Start(t.Context(), ServerConfig{ClientAddr: addr})
			results <- result{s, err}
		}()
	}
	hosts := 0
	for range n {
		r := <-results
		switch {
		case r.err == nil:
			hosts++
			defer func() {
				if err := r.s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}()
		case !errors.Is(r.err, ErrAddrInUse):
			t.Errorf("Start: %v, want success or ErrAddrInUse", r.err)
		}
	}
	if hosts != 1 {
		t.Errorf("%d servers started on %s, want 1", hosts, addr)
	}
}

func TestStartPeerAddrInUseIsNotErrAddrInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s, err := Start(t.Context(), ServerConfig{PeerAddr: l.Addr().String()})
	if err == nil {
		s.Close()
		t.Fatal("Start with a held peer port succeeded")
	}
	if errors.Is(err, ErrAddrInUse) {
		t.Fatalf("Start with a held peer port: %v; must not match ErrAddrInUse, which means the store is hosted", err)
	}
}

func TestStartCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := Start(ctx, ServerConfig{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Start with a canceled ctx: %v, want context.Canceled", err)
	}
}

func TestCloseCleansUp(t *testing.T) {
	// Warm up: etcd, gRPC and the runtime start a few goroutines once per
	// process, which are not leaks.
	warm, err := Start(t.Context(), ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cli := dial(t, ClientConfig{Endpoints: []string{warm.Endpoint()}})
	cli.Close()
	warm.Close()
	before := settleGoroutines(0, 500*time.Millisecond)

	s, err := Start(t.Context(), ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	dir := s.tempDir.Path
	if _, err := os.Stat(filepath.Join(dir, "member")); err != nil {
		t.Fatalf("data dir not in use: %v", err)
	}
	cli = dial(t, ClientConfig{Endpoints: []string{s.Endpoint()}})
	kv := NewKV(NewClient(cli), "/t/")
	if err := kv.Set(t.Context(), "a", []byte("b")); err != nil {
		t.Fatal(err)
	}
	cli.Close()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("temp dir %s still there after Close (stat: %v)", dir, err)
	}
	if n := settleGoroutines(before, 5*time.Second); n > before {
		t.Errorf("%d goroutines after Close, %d before Start", n, before)
	}

	// The port is free again.
	if err := probeAddr(s.Endpoint()); err != nil {
		t.Errorf("client port still bound after Close: %v", err)
	}
}

func TestStartKeepsCallerDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etcd")
	s := startServer(t, ServerConfig{Dir: dir, Name: "n1"})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "member")); err != nil {
		t.Fatalf("caller's data dir was removed: %v", err)
	}
}

func TestDialDeadEndpoint(t *testing.T) {
	addr := deadAddr(t)
	const timeout = 500 * time.Millisecond
	begin := time.Now()
	cli, err := Dial(t.Context(), ClientConfig{Endpoints: []string{addr}, DialTimeout: timeout})
	elapsed := time.Since(begin)
	if err == nil {
		cli.Close()
		t.Fatal("Dial to a dead endpoint succeeded")
	}
	if elapsed > timeout+2*time.Second {
		t.Errorf("Dial took %v, want about %v", elapsed, timeout)
	}
	want := "rendezvous store at " + addr + " unreachable after 500ms"
	if !strings.Contains(err.Error(), want) {
		t.Errorf("Dial: %q, want it to contain %q", err, want)
	}
	t.Logf("Dial: %v", err)
}

func TestDialCanceled(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err := Dial(ctx, ClientConfig{Endpoints: []string{deadAddr(t)}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial with a short ctx: %v, want context.DeadlineExceeded", err)
	}
}

func TestTLS(t *testing.T) {
	pki := newTestPKI(t)
	s := startServer(t, ServerConfig{TLS: &TLSFiles{CertFile: pki.ServerCert, KeyFile: pki.ServerKey, CAFile: pki.CAFile}})

	mutual := &TLSFiles{CertFile: pki.ClientCert, KeyFile: pki.ClientKey, CAFile: pki.CAFile}
	cli := dial(t, ClientConfig{Endpoints: []string{s.Endpoint()}, TLS: mutual})
	if _, err := cli.Put(t.Context(), "secure", "yes"); err != nil {
		t.Fatalf("Put over TLS: %v", err)
	}
	// An explicit https:// URL works as well.
	dial(t, ClientConfig{Endpoints: []string{"https://" + s.Endpoint()}, TLS: mutual})

	const timeout = 500 * time.Millisecond
	for _, tc := range []struct {
		name string
		tls  *TLSFiles
	}{
		{"plain", nil},
		{"no client cert", &TLSFiles{CAFile: pki.CAFile}},
		{"unknown CA", &TLSFiles{CertFile: pki.ClientCert, KeyFile: pki.ClientKey}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cli, err := Dial(t.Context(), ClientConfig{
				Endpoints: []string{s.Endpoint()}, TLS: tc.tls, DialTimeout: timeout, Logger: testLogger(t),
			})
			if err == nil {
				cli.Close()
				t.Fatal("Dial succeeded")
			}
			if !strings.Contains(err.Error(), s.Endpoint()) {
				t.Errorf("Dial: %q does not name the endpoint", err)
			}
			t.Logf("Dial: %v", err)
		})
	}
}

func TestTLSBadFiles(t *testing.T) {
	pki := newTestPKI(t)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tc := range []struct {
		name string
		tls  TLSFiles
		want string
	}{
		{"missing CA", TLSFiles{CAFile: missing}, missing},
		{"CA not PEM", TLSFiles{CAFile: pki.ClientKey}, pki.ClientKey},
		{"missing key", TLSFiles{CertFile: pki.ClientCert, KeyFile: missing}, missing},
		{"key without cert", TLSFiles{KeyFile: pki.ClientKey}, "both or neither"},
		{"mismatched pair", TLSFiles{CertFile: pki.ClientCert, KeyFile: pki.ServerKey}, pki.ServerKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tls := tc.tls
			_, err := Dial(t.Context(), ClientConfig{Endpoints: []string{deadAddr(t)}, TLS: &tls})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Dial: %v, want an error naming %q", err, tc.want)
			}
		})
	}

	_, err := Start(t.Context(), ServerConfig{TLS: &TLSFiles{CertFile: pki.ServerCert, KeyFile: missing}})
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("Start with a missing key: %v, want an error naming %s", err, missing)
	}
}

func TestDialAuth(t *testing.T) {
	s := startServer(t, ServerConfig{})
	root := dial(t, ClientConfig{Endpoints: []string{s.Endpoint()}})
	ctx := t.Context()
	if _, err := root.UserAdd(ctx, "root", "secret"); err != nil {
		t.Fatal(err)
	}
	if _, err := root.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := root.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}

	cli := dial(t, ClientConfig{Endpoints: []string{s.Endpoint()}, Username: "root", Password: "secret"})
	if _, err := cli.Put(ctx, "authed", "yes"); err != nil {
		t.Fatalf("Put with auth: %v", err)
	}

	_, err := Dial(ctx, ClientConfig{Endpoints: []string{s.Endpoint()}, Username: "root", Password: "wrong"})
	if err == nil || !strings.Contains(err.Error(), "authentication failed") {
		t.Fatalf("Dial with a wrong password: %v, want an authentication error", err)
	}
	t.Logf("Dial with a wrong password: %v", err)

	// A dead store with credentials still fails as unreachable, on time.
	begin := time.Now()
	dead := deadAddr(t)
	_, err = Dial(ctx, ClientConfig{Endpoints: []string{dead}, Username: "root", Password: "secret", DialTimeout: 300 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "rendezvous store at "+dead+" unreachable") {
		t.Fatalf("Dial to a dead store with auth: %v", err)
	}
	if d := time.Since(begin); d > 2*time.Second {
		t.Errorf("Dial took %v", d)
	}
	t.Logf("Dial to a dead store with auth: %v", err)
}

// TestFailFast: once no member has been connected for FailFastAfter,
// requests fail at once with ErrUnreachable instead of waiting out their
// deadline.
func TestFailFast(t *testing.T) {
	s, err := Start(t.Context(), ServerConfig{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := Dial(t.Context(), ClientConfig{Endpoints: []string{s.Endpoint()}, FailFastAfter: 500 * time.Millisecond, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Etcd().Put(t.Context(), "/k", "v"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	time.Sleep(time.Second)
	if d := cli.DownFor(); d < 500*time.Millisecond {
		t.Errorf("DownFor = %v a second after the store stopped", d)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	begin := time.Now()
	_, err = cli.Etcd().Put(ctx, "/k", "v2")
	if !errors.Is(err, ErrUnreachable) {
		t.Errorf("got %v, want ErrUnreachable", err)
	}
	if took := time.Since(begin); took > time.Second {
		t.Errorf("took %v, want at once", took)
	}
}

// TestForeignClusterRefused: a client that spoke to one store refuses the
// answers of another at the same endpoints, as when the agent on the
// bootstrap address restarted and started a fresh store there.
func TestForeignClusterRefused(t *testing.T) {
	addr := deadAddr(t)
	s1, err := Start(t.Context(), ServerConfig{ClientAddr: addr, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := Dial(t.Context(), ClientConfig{Endpoints: []string{addr}, Logger: testLogger(t)})
	if err != nil {
		s1.Close()
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Etcd().Put(t.Context(), "/k", "v"); err != nil {
		t.Fatal(err)
	}
	s1.Close()
	s2, err := Start(t.Context(), ServerConfig{ClientAddr: addr, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var lastErr error
	for ctx.Err() == nil {
		if _, lastErr = cli.Etcd().Get(ctx, "/k"); lastErr != nil && errors.Is(lastErr, ErrForeignCluster) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the fresh store's answers were taken: last %v", lastErr)
}
