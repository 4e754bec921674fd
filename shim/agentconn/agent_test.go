package agentconn

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/leaktest"
	"github.com/ddp-agent/ddp-agent/wire"
)

func TestMain(m *testing.M) {
	before := runtime.NumGoroutine()
	code := m.Run()
	if code == 0 {
		// Every Client was closed and every fake agent stopped.
		if err := leaktest.CheckCount(before, 2*time.Second); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// request is one frame a fake agent read from its client.
type request struct {
	id uint32
	m  wire.Message
}

// fakeAgent is the agent's end of a real unix socket, speaking package
// wire's frames: it accepts one connection, answers its Hello with what
// the test says, then hands every later frame to the test (reqs), which
// answers with reply. Tests script the conversation step by step.
type fakeAgent struct {
	t    *testing.T
	path string
	ln   net.Listener

	hello  chan request // the Hello frame, once
	reqs   chan request // every frame after it, in order
	closed chan struct{}

	mu sync.Mutex
	nc net.Conn // the accepted connection, once there is one
	wg sync.WaitGroup
}

// startAgent listens on a socket in a test directory; answer is the reply
// to the Hello (nil: none, the agent stays silent).
func startAgent(t *testing.T, answer func(wire.Hello) wire.Message) *fakeAgent {
	t.Helper()
	path := filepath.Join(t.TempDir(), "control.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	a := &fakeAgent{t: t, path: path, ln: ln, hello: make(chan request, 1), reqs: make(chan request, 16), closed: make(chan struct{})}
	a.wg.Add(1)
	go a.serve(answer)
	t.Cleanup(a.stop)
	return a
}

func (a *fakeAgent) serve(answer func(wire.Hello) wire.Message) {
	defer a.wg.Done()
	defer close(a.closed)
	nc, err := a.ln.Accept()
	if err != nil {
		return // stopped before a client came
	}
	a.mu.Lock()
	a.nc = nc
	a.mu.Unlock()
	for first := true; ; first = false {
		f, err := wire.ReadFrame(nc, wire.MaxPayload)
		if err != nil {
			return // the client closed, or stop did
		}
		m, err := wire.Decode(f)
		if err != nil {
			a.t.Errorf("fake agent: decode %v frame: %v", f.Type, err)
			return
		}
		if !first {
			a.reqs <- request{f.ID, m}
			continue
		}
		a.hello <- request{f.ID, m}
		h, ok := m.(wire.Hello)
		if !ok {
			a.t.Errorf("fake agent: first frame %v, want Hello", f.Type)
			return
		}
		if answer == nil {
			continue
		}
		if r := answer(h); r != nil {
			a.reply(f.ID, r)
		}
	}
}

// reply writes m to the client as the answer to request id (0: unsolicited).
func (a *fakeAgent) reply(id uint32, m wire.Message) {
	a.mu.Lock()
	nc := a.nc
	a.mu.Unlock()
	if err := wire.WriteFrame(nc, id, m); err != nil {
		a.t.Errorf("fake agent: write %v: %v", m.Type(), err)
	}
}

// next returns the client's next request after Hello.
func (a *fakeAgent) next() request {
	a.t.Helper()
	select {
	case r := <-a.reqs:
		return r
	case <-time.After(10 * time.Second):
		a.t.Fatal("fake agent: no request from the client")
		return request{}
	}
}

// hangUp closes the agent's end of the connection, as a dying agent does.
func (a *fakeAgent) hangUp() {
	a.mu.Lock()
	nc := a.nc
	a.mu.Unlock()
	if nc != nil {
		nc.Close()
	}
}

func (a *fakeAgent) stop() {
	a.ln.Close()
	a.hangUp()
	a.wg.Wait()
}

// welcome accepts any Hello.
func welcome(h wire.Hello) wire.Message {
	return wire.Welcome{JobID: "job-1", Generation: h.Generation, WorldSize: 2, Rank: h.Rank, Config: map[string]string{"k": "v"}}
}

// dial connects a Client to a and closes it at the end of the test.
func dial(t *testing.T, a *fakeAgent) *Client {
	t.Helper()
	c, _, err := Dial(t.Context(), a.path, wire.Hello{Rank: 1, PID: int32(os.Getpid()), Generation: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	<-a.hello
	return c
}

// waitClosed waits for ch, failing the test after a while.
func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not closed", what)
	}
}
