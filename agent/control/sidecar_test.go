package control

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/agentconn"
	"github.com/ddp-agent/ddp-agent/wire"
)

// recordingSidecar admits job "good" and refuses the others.
type recordingSidecar struct {
	mu       sync.Mutex
	peers    []Peer
	events   map[string]int
	reformed []wire.Reformed
	left     []Peer
}

func (r *recordingSidecar) Admit(p Peer) (wire.Welcome, error) {
	switch p.Hello.Job[wire.HelloJob] {
	case "good", "other":
		r.mu.Lock()
		r.peers = append(r.peers, p)
		r.mu.Unlock()
		return wire.Welcome{JobID: p.Hello.Job[wire.HelloJob], WorldSize: 2, Rank: p.Hello.Rank, Config: map[string]string{wire.WelcomeRelay: "r"}}, nil
	case "stale":
		return wire.Welcome{}, &wire.RemoteError{Code: wire.CodeStaleGeneration, Message: "old"}
	}
	return wire.Welcome{}, errors.New("unknown job")
}

func (r *recordingSidecar) Events(p Peer, ev wire.Events) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events[p.Hello.Job[wire.HelloJob]] += len(ev.Events)
}

func (r *recordingSidecar) Reformed(p Peer, m wire.Reformed) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reformed = append(r.reformed, m)
}

func (r *recordingSidecar) Left(p Peer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.left = append(r.left, p)
}

func (r *recordingSidecar) count(f func() int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return f()
}

func sidecarHello(job string, rank int32) wire.Hello {
	return wire.Hello{Rank: rank, PID: int32(os.Getpid()), Transports: []string{"host"}, Job: map[string]string{wire.HelloJob: job}}
}

func TestSidecarAdmitsByHello(t *testing.T) {
	leakCheck(t)
	sc := &recordingSidecar{events: map[string]int{}}
	s := startSidecarServer(t, Config{}, sc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	good, w := dial(t, s, sidecarHello("good", 1))
	if w.JobID != "good" || w.Rank != 1 || w.Config[wire.WelcomeRelay] != "r" {
		t.Fatalf("welcome: got %+v", w)
	}
	other, _ := dial(t, s, sidecarHello("other", 0))
	sc.mu.Lock()
	p := sc.peers[0]
	sc.mu.Unlock()
	if p.PID != os.Getpid() {
		t.Errorf("peer pid: got %d, want %d (the socket's)", p.PID, os.Getpid())
	}
	if err := good.SendEvents(wire.Events{Events: make([]wire.CollectiveEvent, 3)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "events of job good", func() bool { return sc.count(func() int { return sc.events["good"] }) == 3 })
	if err := good.KVSet(ctx, "k", []byte("v")); !errors.Is(err, wire.ErrDenied) {
		t.Errorf("KVSet through a sidecar: got %v, want denied", err)
	}

	// An Abort reaches the matched job only.
	if n := s.AbortPeers(func(p Peer) bool { return p.Hello.Job[wire.HelloJob] == "good" }, "hang"); n != 1 {
		t.Errorf("AbortPeers: got %d, want 1", n)
	}
	select {
	case <-good.Aborted():
		if !good.Told() || good.AbortReason() != "hang" {
			t.Errorf("abort: told %v reason %q", good.Told(), good.AbortReason())
		}
	case <-ctx.Done():
		t.Fatal("job good not aborted")
	}
	select {
	case <-other.Aborted():
		t.Fatalf("job other aborted too: %s", other.AbortReason())
	case <-time.After(100 * time.Millisecond):
	}

	// Refusals keep their code.
	if _, _, err := agentconn.Dial(ctx, s.Path(), sidecarHello("stale", 0)); !errors.Is(err, wire.ErrStaleGeneration) {
		t.Errorf("stale: got %v", err)
	}
	if _, _, err := agentconn.Dial(ctx, s.Path(), sidecarHello("nobody", 0)); !errors.Is(err, wire.ErrDenied) {
		t.Errorf("unknown job: got %v", err)
	}
	other.Close()
	waitFor(t, "Left of job other", func() bool {
		return sc.count(func() int { return len(sc.left) }) == 1 && sc.left[0].Hello.Job[wire.HelloJob] == "other"
	})
}

// TestSidecarRefusesOtherUser: a process of another user is refused by its
// credentials even when it can reach the socket (here the test opens the
// directory to everyone; the sidecar's own is 0700). Needs root to run the
// client as nobody.
func TestSidecarRefusesOtherUser(t *testing.T) {
	if path := os.Getenv("DDP_AGENT_TEST_DIAL"); path != "" {
		_, _, err := agentconn.Dial(context.Background(), path, sidecarHello("good", 0))
		if errors.Is(err, wire.ErrDenied) {
			os.Exit(7)
		}
		t.Fatalf("dial as another user: got %v, want denied", err)
	}
	if os.Getuid() != 0 {
		t.Skip("needs root to run a client as another user")
	}
	sc := &recordingSidecar{events: map[string]int{}}
	// Not t.TempDir: its parent is private to root.
	dir, err := os.MkdirTemp("", "sidecar-uid-*")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	s := startSidecarServer(t, Config{Dir: dir + "/sock"}, sc)
	os.Chmod(dir+"/sock", 0o777)
	os.Chmod(s.Path(), 0o777)
	// The test binary's own directory is private to root: run a copy.
	bin, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir+"/control.test", bin, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(dir+"/control.test", "-test.run=^TestSidecarRefusesOtherUser$")
	cmd.Env = append(os.Environ(), "DDP_AGENT_TEST_DIAL="+s.Path())
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("client as uid 65534: got %v, want exit 7 (denied)\n%s", err, out)
	}
	if n := sc.count(func() int { return len(sc.peers) }); n != 0 {
		t.Errorf("admitted %d peers of another user", n)
	}
}
