package host

import (
	"net"
	"regexp"
	"testing"
)

func TestListen(t *testing.T) {
	tests := []struct {
		name     string
		opts     Options
		wantHost string
		wantBind string // "" for all interfaces
	}{
		{"no master", Options{}, "127.0.0.1", "127.0.0.1"},
		{"loopback master", Options{MasterAddr: "127.0.0.1:29500"}, "127.0.0.1", "127.0.0.1"},
		{"master without port", Options{MasterAddr: "127.0.0.1"}, "127.0.0.1", "127.0.0.1"},
		{"local host", Options{Host: "127.0.0.1", MasterAddr: "10.0.0.1"}, "127.0.0.1", "127.0.0.1"},
		{"host name", Options{Host: "node-7.example"}, "node-7.example", ""},
		{"foreign IP", Options{Host: "192.0.2.7"}, "192.0.2.7", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ep, err := Listen(tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer ep.Close()
			host, port, err := net.SplitHostPort(ep.Info().Addr)
			if err != nil {
				t.Fatal(err)
			}
			if host != tc.wantHost {
				t.Errorf("advertised %q, want %q", host, tc.wantHost)
			}
			bound := ep.ln.Addr().(*net.TCPAddr)
			if bind := bound.IP.String(); (tc.wantBind == "") != bound.IP.IsUnspecified() || tc.wantBind != "" && bind != tc.wantBind {
				t.Errorf("bound to %v, want %q", bound, tc.wantBind)
			}
			c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", port))
			if err != nil {
				t.Fatalf("dial the advertised port: %v", err)
			}
			c.Close()
		})
	}
}

func TestPeerInfo(t *testing.T) {
	a, err := Listen(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Listen(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ia, ib := a.Info(), b.Info()
	if ia.HostID == "" || ia.HostID != ib.HostID {
		t.Errorf("HostIDs %q and %q, want equal and not empty", ia.HostID, ib.HostID)
	}
	hex := regexp.MustCompile(`^[0-9a-f]{32}$`)
	if !hex.MatchString(ia.Nonce) || ia.Nonce == ib.Nonce {
		t.Errorf("nonces %q and %q, want distinct 32-digit hex", ia.Nonce, ib.Nonce)
	}
	if ia.Addr == ib.Addr {
		t.Errorf("both endpoints at %s", ia.Addr)
	}
	if err := a.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
