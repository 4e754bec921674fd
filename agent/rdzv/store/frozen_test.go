package store

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestFrozenMembers(t *testing.T) {
	now := time.Now()
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	for _, c := range []struct {
		name  string
		heard map[string]time.Time
		want  []string
	}{
		{"all answer", map[string]time.Time{"a": ago(0), "b": ago(200 * time.Millisecond)}, nil},
		{"one silent", map[string]time.Time{"a": ago(0), "b": ago(2 * time.Second), "c": ago(300 * time.Millisecond)}, []string{"b"}},
		{"silent, not yet past the limit", map[string]time.Time{"a": ago(0), "b": ago(1400 * time.Millisecond)}, nil},
		// Nobody answered lately: this agent stalled, not a member.
		{"all silent", map[string]time.Time{"a": ago(3 * time.Second), "b": ago(2 * time.Second)}, nil},
		{"alone", map[string]time.Time{"a": ago(5 * time.Second)}, nil},
	} {
		got := frozenMembers(c.heard, now, 1500*time.Millisecond, time.Second)
		slices.Sort(got)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: frozenMembers = %v, want %v", c.name, got, c.want)
		}
	}
}

// freezer forwards TCP to a member until frozen; then it keeps every
// connection open and passes nothing, as a stopped process or a dropped
// link does.
type freezer struct {
	ln     net.Listener
	to     string
	frozen chan struct{}
}

func startFreezer(t *testing.T, to string) *freezer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, to: to, frozen: make(chan struct{})}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go f.serve(t, c)
		}
	}()
	return f
}

func (f *freezer) serve(t *testing.T, c net.Conn) {
	defer c.Close()
	select {
	case <-f.frozen:
		<-t.Context().Done() // accepted, never answered
		return
	default:
	}
	up, err := net.Dial("tcp", f.to)
	if err != nil {
		return
	}
	defer up.Close()
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if err != nil {
				dst.Close()
				return
			}
			select {
			case <-f.frozen:
				<-t.Context().Done()
				return
			default:
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
	}
	go pipe(up, c)
	pipe(c, up)
}

func (f *freezer) freeze() { close(f.frozen) }

// TestFrozenMemberCut: a client's watch and lease keep-alive are on a
// member that then freezes (its connection stays up, nothing comes back).
// The client finds it silent while the others answer, cuts its
// connections, and the watch sees the next change within seconds rather
// than after gRPC's 10 s keepalive; the lease's renewals, hedged, reach
// another member before its TTL runs out.
func TestFrozenMemberCut(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	// Closed after the freezer's connections (cleanups run last first),
	// which would hold a member's graceful stop.
	eps := testCluster(t, 3).Endpoints()
	fr := startFreezer(t, eps[0])
	proxied := fr.ln.Addr().String()

	// Everything this client opens goes through the freezer first.
	wrapped := dialClient(t, ClientConfig{Endpoints: []string{proxied}, CutFrozen: true})
	cli := wrapped.Etcd()
	lease, err := cli.Grant(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	lost := KeepAlive(ctx, cli, lease.ID, 3*time.Second)
	wch := cli.Watch(clientv3.WithRequireLeader(ctx), "k")
	if _, err := cli.Put(ctx, "k", "0"); err != nil {
		t.Fatal(err)
	}
	if ev := <-wch; len(ev.Events) != 1 {
		t.Fatalf("watch: %+v", ev)
	}
	// Then the others too (under the lock the watch dials with); the open
	// streams stay where they are.
	wrapped.SetEndpoints("http://"+proxied, "http://"+eps[1], "http://"+eps[2])
	time.Sleep(2 * probeEvery) // a probe of each member answered

	other := dial(t, ClientConfig{Endpoints: eps[1:]})
	fr.freeze()
	frozeAt := time.Now()
	if _, err := other.Put(ctx, "k", "1"); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-wch:
		took := time.Since(frozeAt)
		t.Logf("the watch saw the change %v after its member froze", took.Round(time.Millisecond))
		if len(ev.Events) != 1 || string(ev.Events[0].Kv.Value) != "1" {
			t.Fatalf("watch: %+v (%v)", ev, ev.Err())
		}
		if took > 4*time.Second {
			t.Errorf("took %v, want within 4 s", took)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("the watch saw nothing for 8 s after its member froze")
	}
	// Past the lease's TTL, its keep-alives reached another member.
	time.Sleep(3 * time.Second)
	ttl, err := other.TimeToLive(ctx, lease.ID)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-lost:
		t.Errorf("KeepAlive gave the lease up")
	default:
	}
	if ttl.TTL <= 0 {
		t.Errorf("the lease expired: its keep-alives stayed on the frozen member")
	}
}

// TestSetEndpointsWhileProbing: the replica manager changes the client's
// endpoints while the freeze watch dials the new ones. etcd's Client.Dial
// reads the endpoints without the client's lock; under -race, changing
// them with the etcd client's own SetEndpoints here was a data race (seen
// in CI in a 3-node job), and Client.SetEndpoints must not be.
func TestSetEndpointsWhileProbing(t *testing.T) {
	eps := testCluster(t, 3).Endpoints()
	cli := dialClient(t, ClientConfig{Endpoints: eps[:1], CutFrozen: true})
	// Changes every 25 ms for four of the watch's ticks: at each tick it
	// dials the members it has no probe of, and a change follows at once.
	for i := range int(4 * probeEvery / (25 * time.Millisecond)) {
		cli.SetEndpoints(eps[i%3:]...)
		time.Sleep(25 * time.Millisecond)
	}
	if _, err := cli.Etcd().Get(t.Context(), "k"); err != nil {
		t.Fatalf("get after the changes: %v", err)
	}
}
