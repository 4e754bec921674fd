package join

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

func TestBackend(t *testing.T) {
	tests := []struct {
		b         Backend
		name      string
		usesStore bool
	}{
		{Static, "static", false},
		{Standalone, "standalone", false},
		{Hosted, "hosted etcd", true},
		{External, "external etcd", true},
		{Backend(9), "Backend(9)", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.b.String(); got != tc.name {
				t.Errorf("String: got %v, want %v", got, tc.name)
			}
			if got := tc.b.UsesStore(); got != tc.usesStore {
				t.Errorf("UsesStore: got %v, want %v", got, tc.usesStore)
			}
		})
	}
}

// TestOpenWithoutStore: static and standalone open no store; the workers
// of a multi-node static job bootstrap through torch's store.
func TestOpenWithoutStore(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	tests := []struct {
		name          string
		cfg           Config
		wantLocalKV   bool
		wantMaster    string
		wantGroupRank int
	}{
		{"standalone", Config{Backend: Standalone, NNodesMin: 1, NNodesMax: 1}, false, "127.0.0.1", 0},
		{"static, two nodes", Config{Backend: Static, NodeRank: 1, NNodesMin: 2, NNodesMax: 2, MasterAddr: "127.0.0.1", MasterPort: 29500}, true, "127.0.0.1", 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			j, err := Open(context.Background(), tc.cfg, Node{JobID: "j", NProc: 2}, log)
			if err != nil {
				t.Fatalf("Open: got %v, want nil", err)
			}
			defer j.Close()
			if _, ok := j.Rendezvous.(*rdzv.Static); !ok || j.KV != nil || j.Client != nil {
				t.Fatalf("got %T (kv %v, client %v), want *rdzv.Static without a store", j.Rendezvous, j.KV, j.Client)
			}
			if j.NodeLocalKV != tc.wantLocalKV {
				t.Errorf("NodeLocalKV: got %v, want %v", j.NodeLocalKV, tc.wantLocalKV)
			}
			r, err := j.Rendezvous.Next(context.Background())
			if err != nil {
				t.Fatalf("Next: got %v, want nil", err)
			}
			if r.MasterAddr != tc.wantMaster || r.GroupRank != tc.wantGroupRank {
				t.Errorf("round: got master %v, group rank %v; want %v, %v", r.MasterAddr, r.GroupRank, tc.wantMaster, tc.wantGroupRank)
			}
		})
	}
	if _, err := Open(context.Background(), Config{Backend: Backend(9)}, Node{JobID: "j"}, log); err == nil {
		t.Errorf("unknown backend: got nil, want an error")
	}
}

// TestPortTakenByAnotherProgram: the store's port on this host is held by
// a program that is no store: one that accepts connections and never
// answers, a web server, one that hangs up (torch's TCPStore, to gRPC's
// preface). The agent, finding it taken, would be that program's client;
// it says another program holds the port, instead of retrying "not
// reachable yet" for the join timeout (10 minutes by default), or asking
// for the same --rdzv-token everywhere, which a first-hour review got for
// a TCPStore and a web server.
func TestPortTakenByAnotherProgram(t *testing.T) {
	for _, tc := range []struct {
		name  string
		serve func(c net.Conn)
	}{
		{"silent", func(c net.Conn) { t.Cleanup(func() { c.Close() }) }}, // held open, never answered
		{"a web server", func(c net.Conn) {
			defer c.Close()
			c.Read(make([]byte, 512))
			c.Write([]byte("HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
		}},
		{"hangs up", func(c net.Conn) {
			c.Read(make([]byte, 512))
			c.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go tc.serve(c)
				}
			}()
			cfg := Config{Backend: Hosted, Endpoints: []string{ln.Addr().String()}, NNodesMin: 2, NNodesMax: 2,
				JoinTimeout: 10 * time.Minute, LastCall: time.Second, TTL: 3 * time.Second, Prefix: "/ddp-agent/v1/"}
			start := time.Now()
			_, err = Open(context.Background(), cfg, Node{JobID: "j", NProc: 1}, slog.New(slog.DiscardHandler))
			if err == nil || !strings.Contains(err.Error(), "another program holds the port") {
				t.Fatalf("Open: got %v, want the port named as another program's", err)
			}
			if took := time.Since(start); took > 2*time.Minute {
				t.Fatalf("Open gave up after %v, want within a few dials", took)
			}
			t.Logf("gave up after %v: %v", time.Since(start).Round(time.Millisecond), err)
		})
	}
}

// TestReplicationIsTheHosts: whether the embedded store keeps several
// members is the hosting agent's choice, by its --nnodes, as the job's
// other settings are. A node started with a larger --nnodes once tried
// to add a member to a store started for one, whose peer URL (port 0) it
// could not dial: etcd logged "bootstrap failed" every second. One with a
// smaller --nnodes left a replicated store a member short.
func TestReplicationIsTheHosts(t *testing.T) {
	for _, tc := range []struct {
		name             string
		hostMax, joinMax int
		want             bool
	}{
		{"host for 2 nodes, joiner for 3", 2, 3, false},
		{"host for 3 nodes, joiner for 2", 3, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep, err := store.FreeAddr("127.0.0.1")
			if err != nil {
				t.Fatal(err)
			}
			open := func(host bool, nnodesMax int) *Joined {
				cfg := Config{Backend: Hosted, Endpoints: []string{ep}, IsHost: &host, NNodesMin: 2, NNodesMax: nnodesMax,
					JoinTimeout: time.Minute, LastCall: time.Second, TTL: 3 * time.Second, Prefix: "/ddp-agent/v1/"}
				j, err := Open(t.Context(), cfg, Node{JobID: "j", NProc: 1}, slog.New(slog.DiscardHandler))
				if err != nil {
					t.Fatalf("Open (host %v, --nnodes 2:%d): %v", host, nnodesMax, err)
				}
				t.Cleanup(j.Close)
				return j
			}
			if got := open(true, tc.hostMax).Replicated; got != (tc.hostMax >= storeReplicas) {
				t.Errorf("host: Replicated %v", got)
			}
			if got := open(false, tc.joinMax).Replicated; got != tc.want {
				t.Errorf("joiner: Replicated %v, want %v", got, tc.want)
			}
		})
	}
}

// TestEndpointResolvesToThisHostLater: the host of a Kubernetes Job's
// pod 0 names itself by its name under a headless Service, which resolves
// only once the Service's DNS has the pod's record, possibly after the
// agent started. The agent decided once that it did not host the store,
// then dialed a store nobody would host until its join timeout. It now
// asks again between dials, and hosts the store once the name is its own.
func TestEndpointResolvesToThisHostLater(t *testing.T) {
	ep, err := store.FreeAddr("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ep)
	const name = "ddp-train-0.ddp-train.invalid"
	var mu sync.Mutex
	asked := 0
	lookup := func(host string) ([]net.IP, error) {
		if host != name {
			return net.LookupIP(host)
		}
		mu.Lock()
		defer mu.Unlock()
		if asked++; asked < 3 {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		return []net.IP{net.ParseIP("127.0.0.1")}, nil
	}
	cfg := Config{Backend: Hosted, Endpoints: []string{net.JoinHostPort(name, port)}, NNodesMin: 1, NNodesMax: 1,
		JoinTimeout: 30 * time.Second, LastCall: time.Second, TTL: 3 * time.Second, Prefix: "/ddp-agent/v1/"}
	o := &opener{cfg: cfg, node: Node{JobID: "j", NProc: 1}, log: slog.New(slog.DiscardHandler), lookupIP: lookup}
	start := time.Now()
	j, err := o.open(t.Context())
	if err != nil {
		t.Fatalf("open: got %v after %v, want the store hosted once its name resolved here", err, time.Since(start).Round(time.Millisecond))
	}
	defer j.Close()
	if j.Endpoint != ep {
		t.Errorf("endpoint: got %s, want the store this agent hosts at %s", j.Endpoint, ep)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("hosted the store after %d lookups, %v", asked, time.Since(start).Round(time.Millisecond))
}
