package relay

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

func ips(ss ...string) []net.IP {
	out := make([]net.IP, len(ss))
	for i, s := range ss {
		out[i] = net.ParseIP(s)
	}
	return out
}

func TestPickBindIP(t *testing.T) {
	local := ips("127.0.0.1", "10.0.0.5", "fd00::5")
	for _, tc := range []struct {
		name     string
		resolved []net.IP
		want     string // "": an error
	}{
		{"the one local address", ips("10.0.0.5"), "10.0.0.5"},
		{"a remote address first", ips("10.9.9.9", "10.0.0.5"), "10.0.0.5"},
		{"Debian's 127.0.1.1 before the real one", ips("127.0.1.1", "10.0.0.5"), "10.0.0.5"},
		{"IPv6 before IPv4", ips("fd00::5", "10.0.0.5"), "10.0.0.5"},
		{"IPv6 alone", ips("fd00::5"), "fd00::5"},
		{"loopback alone", ips("::1", "127.0.0.1"), "127.0.0.1"},
		{"another loopback address", ips("127.0.1.1"), "127.0.1.1"},
		{"no local address", ips("10.9.9.9", "192.0.2.7"), ""},
		{"unspecified", ips("0.0.0.0", "::"), ""},
		{"nothing", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := pickBindIP("node-a", tc.resolved, local)
			switch {
			case tc.want == "" && err == nil:
				t.Errorf("got %v, want an error", got)
			case tc.want != "" && (err != nil || got.String() != tc.want):
				t.Errorf("got %v, %v; want %s", got, err, tc.want)
			}
		})
	}
}

func TestBindHost(t *testing.T) {
	for host, want := range map[string]string{"127.0.0.1": "127.0.0.1", "10.1.2.3": "10.1.2.3", "localhost": "127.0.0.1"} {
		if got, err := BindHost(t.Context(), host); err != nil || got != want {
			t.Errorf("BindHost(%q): %q, %v; want %q", host, got, err, want)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second) // a resolver offline errs by then
	defer cancel()
	for _, host := range []string{"", "0.0.0.0", "::", "224.0.0.1", "no-such-host.invalid"} {
		if got, err := BindHost(ctx, host); err == nil {
			t.Errorf("BindHost(%q): %q, want an error", host, got)
		}
	}
}

// TestListensOnlyOnItsAddress: a Server on 127.0.0.1 refuses connections
// on the same port of another address of this machine: 127.0.0.2 (Linux
// routes all of 127/8 to loopback, so a server on every interface would
// answer there) and the first non-loopback address, if there is one.
func TestListensOnlyOnItsAddress(t *testing.T) {
	s := listen(t, "127.0.0.1:0", newRecorder(), nil)
	_, port, _ := net.SplitHostPort(s.Addr())
	others := []string{"127.0.0.2"}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
				others = append(others, n.IP.String())
				break
			}
		}
	}
	for _, h := range others {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(h, port), time.Second)
		if err == nil {
			c.Close()
			t.Errorf("%s:%s accepted a connection: the server listens beyond 127.0.0.1", h, port)
			continue
		}
		if !errors.Is(err, syscall.ECONNREFUSED) { // a firewall's drop, say: not accepted either
			t.Logf("%s:%s: %v (not refused, but not accepted)", h, port, err)
		}
	}
	if c, err := net.DialTimeout("tcp", s.Addr(), time.Second); err != nil {
		t.Errorf("its own address: %v", err)
	} else {
		c.Close()
	}
}
