package comm

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/agent/control"
	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
	"github.com/ddp-agent/ddp-agent/wire"
)

// fakeSidecar admits every Hello and counts them and the events.
type fakeSidecar struct {
	mu       sync.Mutex
	hellos   int
	events   int
	reformed []wire.Reformed
}

func (f *fakeSidecar) Admit(p control.Peer) (wire.Welcome, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hellos++
	return wire.Welcome{JobID: p.Hello.Job[wire.HelloJob], WorldSize: 1, Config: map[string]string{wire.WelcomeRelay: "relay-1"}}, nil
}

func (f *fakeSidecar) Events(_ control.Peer, ev wire.Events) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events += len(ev.Events)
}

func (f *fakeSidecar) Reformed(_ control.Peer, m wire.Reformed) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reformed = append(f.reformed, m)
}

func (f *fakeSidecar) Left(control.Peer) {}

func (f *fakeSidecar) counts() (int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hellos, f.events
}

// serveSidecar serves a control socket at dir/sidecar.sock until the
// returned func is called.
func serveSidecar(t *testing.T, dir string, sc control.Sidecar) (*control.Server, func()) {
	t.Helper()
	srv, err := control.ListenSidecar(control.Config{Dir: dir, SocketName: "sidecar.sock"}, sc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Run(ctx)
	}()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return srv, stop
}

func openWithSidecar(t *testing.T, sock string) *Comm {
	t.Helper()
	cfg, err := ParseConfig(`{"rank": 0, "world_size": 1, "bootstrap": "external", "timeout_ms": 10000, "sidecar": "` + sock +
		`", "sidecar_job": {"job": "j", "world_size": "1", "local_world_size": "1"}}`)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	blob, err := c.Info()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Connect([]string{blob}); err != nil {
		t.Fatal(err)
	}
	return c
}

func allreduceOne(t *testing.T, c *Comm, step uint64) error {
	t.Helper()
	buf := []float32{1, 2, 3}
	w, err := c.AllReduce(unsafe.Pointer(&buf[0]), 3, reduce.Float32, reduce.Sum, nil, step, 0)
	if err != nil {
		return err
	}
	return w.Wait()
}

func sidecarInfo(t *testing.T, c *Comm) (bool, string) {
	var info struct {
		Sidecar bool   `json:"sidecar"`
		Relay   string `json:"sidecar_relay"`
	}
	if err := json.Unmarshal([]byte(c.Describe()), &info); err != nil {
		t.Fatal(err)
	}
	return info.Sidecar, info.Relay
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestSidecarLink: the communicator sends the sidecar its events; the
// sidecar gone, collectives go on; a sidecar back on the socket is
// redialed and gets the events again; its Abort aborts the communicator.
func TestSidecarLink(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sc")
	first := &fakeSidecar{}
	_, stop := serveSidecar(t, dir, first)
	c := openWithSidecar(t, filepath.Join(dir, "sidecar.sock"))
	if on, relay := sidecarInfo(t, c); !on || relay != "relay-1" {
		t.Fatalf("info: sidecar %v relay %q", on, relay)
	}
	if err := allreduceOne(t, c, 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first sidecar's events", func() bool { _, n := first.counts(); return n > 0 })

	stop()
	eventually(t, "the link to notice", func() bool { on, _ := sidecarInfo(t, c); return !on })
	for step := uint64(2); step < 5; step++ {
		if err := allreduceOne(t, c, step); err != nil {
			t.Fatalf("a collective without the sidecar: %v", err)
		}
	}

	second := &fakeSidecar{}
	srv, _ := serveSidecar(t, dir, second)
	eventually(t, "the redial", func() bool { h, _ := second.counts(); return h == 1 })
	if err := allreduceOne(t, c, 5); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the second sidecar's events", func() bool { _, n := second.counts(); return n > 0 })

	if n := srv.Abort("test abort"); n != 1 {
		t.Fatalf("Abort reached %d connections", n)
	}
	eventually(t, "the abort", func() bool {
		err := allreduceOne(t, c, 6)
		return errors.Is(err, failure.ErrAborted)
	})
}

// TestSidecarLateStart: no sidecar when the communicator opens (a dead
// one's socket path): it opens anyway and connects once one serves there.
func TestSidecarLateStart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sc")
	c := openWithSidecar(t, filepath.Join(dir, "sidecar.sock"))
	if on, _ := sidecarInfo(t, c); on {
		t.Fatal("connected to no sidecar")
	}
	if err := allreduceOne(t, c, 1); err != nil {
		t.Fatal(err)
	}
	late := &fakeSidecar{}
	serveSidecar(t, dir, late)
	eventually(t, "the late connection", func() bool { on, _ := sidecarInfo(t, c); return on })
}
