package comm

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/host"
	"github.com/ddp-agent/ddp-agent/shim/status"
	"github.com/ddp-agent/ddp-agent/wire"
)

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name    string
		json    string
		wantRC  int
		wantErr string
		check   func(*Config) bool
	}{
		{"minimal", `{"rank":0,"world_size":1}`, status.OK, "", func(c *Config) bool {
			return c.Transport == "host" && c.Bootstrap == "external" && c.timeout() == defaultTimeout && c.Name == "default"
		}},
		{"socket means agent", `{"rank":1,"world_size":2,"socket":"/s"}`, status.OK, "", func(c *Config) bool { return c.Bootstrap == "agent" }},
		{"timeout", `{"rank":0,"world_size":1,"timeout_ms":1500}`, status.OK, "", func(c *Config) bool { return c.timeout() == 1500*time.Millisecond }},
		{"not json", `rank=0`, status.Invalid, "config", nil},
		{"trailing", `{"rank":0,"world_size":1} {}`, status.Invalid, "trailing", nil},
		{"missing world", `{"rank":0}`, status.Invalid, "required", nil},
		{"rank too big", `{"rank":3,"world_size":3}`, status.Invalid, "outside", nil},
		{"negative rank", `{"rank":-1,"world_size":3}`, status.Invalid, "outside", nil},
		{"zero world", `{"rank":0,"world_size":0}`, status.Invalid, "at least 1", nil},
		{"typo", `{"rank":0,"world_size":1,"timeout":5}`, status.Invalid, "unknown field", nil},
		{"nccl", `{"rank":0,"world_size":1,"transport":"nccl","nccl_lib":"/x/libnccl.so.2"}`, status.OK, "", func(c *Config) bool {
			return c.Transport == "nccl" && c.ncclLib() == "/x/libnccl.so.2"
		}},
		{"bad transport", `{"rank":0,"world_size":1,"transport":"ib"}`, status.Invalid, "transport", nil},
		{"agent without socket", `{"rank":0,"world_size":1,"bootstrap":"agent"}`, status.Invalid, "socket", nil},
		{"bad bootstrap", `{"rank":0,"world_size":1,"bootstrap":"mdns"}`, status.Invalid, "bootstrap", nil},
		{"bad name", `{"rank":0,"world_size":1,"name":"a/b"}`, status.Invalid, "name", nil},
		{"bad level", `{"rank":0,"world_size":1,"log_level":"loud"}`, status.Invalid, "log_level", nil},
		{"negative timeout", `{"rank":0,"world_size":1,"timeout_ms":-1}`, status.Invalid, "negative", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig(tc.json)
			if got := status.Of(err); got != tc.wantRC {
				t.Fatalf("status %d (%v), want %d", got, err, tc.wantRC)
			}
			if err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not mention %q", err, tc.wantErr)
			}
			if tc.check != nil && !tc.check(c) {
				t.Errorf("unexpected config %+v", c)
			}
		})
	}
}

func TestBlob(t *testing.T) {
	b := blob{V: blobVersion, Rank: 3, PeerInfo: host.PeerInfo{Addr: "10.0.0.1:4000", HostID: "h", Nonce: "n"}}
	got, err := decodeBlob(b.encode())
	if err != nil || got != b {
		t.Fatalf("round trip: got %+v, %v", got, err)
	}
	for _, bad := range []string{"", "{", `{"v":2,"rank":0,"addr":"a","nonce":"n"}`, `{"v":1,"rank":0}`, `{"v":1,"rank":0,"addr":"a","nonce":"n","x":1}`} {
		if _, err := decodeBlob(bad); err == nil {
			t.Errorf("decodeBlob(%q) accepted", bad)
		}
	}
	if strings.Contains(b.encode(), "\n") {
		t.Error("blob spans lines")
	}
}

type sinkFunc func(wire.Events) error

func (f sinkFunc) SendEvents(ev wire.Events) error { return f(ev) }

func TestEventRingDropsInsteadOfBlocking(t *testing.T) {
	r := newEventRing()
	for i := range eventRingSize + 10 {
		r.push(wire.CollectiveEvent{Step: uint64(i)})
	}
	ev := r.take()
	if len(ev.Events) != eventBatchMax || ev.Dropped != 10 || ev.Events[0].Step != 0 {
		t.Fatalf("first batch: %d events, %d dropped, first step %d", len(ev.Events), ev.Dropped, ev.Events[0].Step)
	}
	r.settle(ev, errors.New("agent gone"))
	ev2 := r.take()
	if ev2.Dropped != 10+eventBatchMax || ev2.Events[0].Step != eventBatchMax {
		t.Fatalf("after a failed send: dropped %d, first step %d", ev2.Dropped, ev2.Events[0].Step)
	}
	r.settle(ev2, nil)
	if sent, dropped := r.stats(); sent != eventBatchMax || dropped != 10+eventBatchMax {
		t.Errorf("stats: sent %d dropped %d", sent, dropped)
	}
}

func TestEventRingShipsAndFlushes(t *testing.T) {
	r := newEventRing()
	var mu sync.Mutex
	var got []wire.CollectiveEvent
	sink := sinkFunc(func(ev wire.Events) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, ev.Events...)
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		r.ship(ctx, sink, nil)
		close(done)
	}()
	for i := range 2500 {
		r.push(wire.CollectiveEvent{Step: uint64(i)})
	}
	cancel() // the final flush sends what is left
	<-done
	if len(got) != 2500 || got[2499].Step != 2499 {
		t.Fatalf("shipped %d events", len(got))
	}
}
