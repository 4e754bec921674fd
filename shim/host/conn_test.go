package host

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// listen opens n endpoints on loopback; those Connect does not consume are
// closed when the test ends.
func listen(t testing.TB, n int) ([]*Endpoint, []PeerInfo) {
	t.Helper()
	eps := make([]*Endpoint, n)
	peers := make([]PeerInfo, n)
	for r := range n {
		ep, err := Listen(Options{Host: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ep.Close() })
		eps[r], peers[r] = ep, ep.Info()
	}
	return eps, peers
}

// TestStrangers: connections that fail the handshake are answered (when
// they speak the protocol) and dropped, and the real peers still connect.
func TestStrangers(t *testing.T) {
	eps, peers := listen(t, 2)
	addr := peers[0].Addr // rank 0 accepts rank 1
	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()

	cfg := Config{Timeout: 20 * time.Second}
	comms := make([]*Comm, 2)
	start := time.Now()
	connected := make(chan error, 1)
	go func() {
		var err error
		comms[0], err = Connect(t.Context(), eps[0], 0, peers, cfg)
		connected <- err
	}()

	tests := []struct {
		name        string
		rank, size  int
		nonce, want string
	}{
		{"wrong nonce", 1, 2, "0123456789abcdef", "wrong nonce"},
		{"wrong rank", 0, 2, peers[0].Nonce, "unexpected sender rank"},
		{"wrong world size", 1, 3, peers[0].Nonce, "unexpected sender rank"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			err = clientHandshake(t.Context(), c.(*net.TCPConn), tc.rank, tc.size, tc.nonce)
			if !errors.Is(err, failure.ErrPeer) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want failure.ErrPeer saying %q", err, tc.want)
			}
		})
	}
	t.Run("not the protocol", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		// Closed with the request unread: EOF or a reset.
		if n, err := c.Read(make([]byte, 64)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("got %d bytes, %v; want the connection closed without a reply", n, err)
		}
	})

	var err1 error
	comms[1], err1 = Connect(t.Context(), eps[1], 1, peers, cfg)
	if err := errors.Join(<-connected, err1); err != nil {
		t.Fatal(err)
	}
	for _, c := range comms {
		defer c.Close()
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("connecting took %v despite a silent stranger", el)
	}
	silent.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := silent.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("silent stranger: got %v, want its connection closed", err)
	}
	errs := each(2, func(r int) error {
		return comms[r].AllReduce(t.Context(), make([]byte, 1024), reduce.Float32, reduce.Sum)
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// TestConnectErrors: Connect fails with the right sentinel and in time.
func TestConnectErrors(t *testing.T) {
	const timeout = 300 * time.Millisecond
	tests := []struct {
		name  string
		setup func(eps []*Endpoint, peers []PeerInfo) []PeerInfo // the peers rank 0 is given
		rank  int
		want  error
		after time.Duration // how long it should take
	}{
		{"rank out of range", func(_ []*Endpoint, p []PeerInfo) []PeerInfo { return p }, 2, failure.ErrInvalid, 0},
		{"negative rank", func(_ []*Endpoint, p []PeerInfo) []PeerInfo { return p }, -1, failure.ErrInvalid, 0},
		{"no peers", func([]*Endpoint, []PeerInfo) []PeerInfo { return nil }, 0, failure.ErrInvalid, 0},
		{"not this endpoint", func(_ []*Endpoint, p []PeerInfo) []PeerInfo { return []PeerInfo{p[1], p[0]} }, 0, failure.ErrInvalid, 0},
		{"peer never connects", func(_ []*Endpoint, p []PeerInfo) []PeerInfo { return p }, 0, failure.ErrTimeout, timeout},
		{"nothing listening", func(eps []*Endpoint, p []PeerInfo) []PeerInfo { eps[1].Close(); return p }, 0, failure.ErrTimeout, timeout},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps, peers := listen(t, 2)
			start := time.Now()
			c, err := Connect(t.Context(), eps[0], tc.rank, tc.setup(eps, peers), Config{Timeout: timeout})
			el := time.Since(start)
			if c != nil {
				c.Close()
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			t.Log(err)
			if el < tc.after-20*time.Millisecond || el > tc.after+time.Second {
				t.Errorf("took %v, want about %v", el, tc.after)
			}
			// Connect consumed the endpoint.
			if c, err := net.Dial("tcp", peers[0].Addr); err == nil {
				c.Close()
				t.Errorf("endpoint still listening after Connect")
			}
		})
	}
}

// TestConnectRejected: a rank given the wrong nonce for its successor is
// rejected at once; the successor waits for a real predecessor until its
// timeout.
func TestConnectRejected(t *testing.T) {
	eps, peers := listen(t, 2)
	wrong := append([]PeerInfo(nil), peers...)
	wrong[1].Nonce = "ffff"
	timeouts := []time.Duration{20 * time.Second, time.Second}
	elapsed := make([]time.Duration, 2)
	errs := each(2, func(r int) error {
		p := peers
		if r == 0 {
			p = wrong
		}
		start := time.Now()
		c, err := Connect(t.Context(), eps[r], r, p, Config{Timeout: timeouts[r]})
		elapsed[r] = time.Since(start)
		if c != nil {
			c.Close()
		}
		return err
	})
	if !errors.Is(errs[0], failure.ErrPeer) || elapsed[0] > 500*time.Millisecond {
		t.Errorf("rank 0: got %v after %v, want failure.ErrPeer at once", errs[0], elapsed[0])
	}
	if !errors.Is(errs[1], failure.ErrTimeout) || elapsed[1] < timeouts[1]-20*time.Millisecond {
		t.Errorf("rank 1: got %v after %v, want failure.ErrTimeout after %v", errs[1], elapsed[1], timeouts[1])
	}
}

// TestConnectCancel: cancelling ctx ends a waiting Connect with failure.ErrAborted.
func TestConnectCancel(t *testing.T) {
	eps, peers := listen(t, 2)
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := Connect(ctx, eps[0], 0, peers, Config{Timeout: time.Minute})
	if !errors.Is(err, failure.ErrAborted) || !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want failure.ErrAborted and context.Canceled", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("took %v", el)
	}
}
