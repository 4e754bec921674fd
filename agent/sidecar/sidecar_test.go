package sidecar

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/control"
	"github.com/ddp-agent/ddp-agent/agent/observe"
	"github.com/ddp-agent/ddp-agent/internal/syncbuf"
	"github.com/ddp-agent/ddp-agent/shim/agentconn"
	"github.com/ddp-agent/ddp-agent/wire"
)

func hello(job string, gen uint64, rank, localRank, world, localWorld int, extra ...string) wire.Hello {
	j := map[string]string{wire.HelloJob: job, wire.HelloWorldSize: strconv.Itoa(world), wire.HelloLocalWorldSize: strconv.Itoa(localWorld)}
	for i := 0; i+1 < len(extra); i += 2 {
		j[extra[i]] = extra[i+1]
	}
	return wire.Hello{Rank: int32(rank), LocalRank: int32(localRank), PID: int32(os.Getpid()), Generation: gen, Transports: []string{"host"}, Job: j}
}

func TestParseHello(t *testing.T) {
	w, err := parseHello(hello("j", 2, 5, 1, 8, 4))
	if err != nil || w.offset() != 4 || w.nnodes() != 2 || w.groupRank != 1 || w.gen != 2 {
		t.Fatalf("got %+v %v: want offset 4, 2 nodes, group rank 1 (from the rank), generation 2", w, err)
	}
	if w, _ := parseHello(hello("j", 0, 5, 1, 8, 4, wire.HelloGroupRank, "0")); w.groupRank != 0 {
		t.Errorf("group rank from the Hello: got %d", w.groupRank)
	}
	for name, h := range map[string]wire.Hello{
		"no job":             {Rank: 0, Job: map[string]string{wire.HelloWorldSize: "2"}},
		"no Job map":         {Rank: 0},
		"world not a number": hello("j", 0, 0, 0, 2, 1, wire.HelloWorldSize, "two"),
		"rank past world":    hello("j", 0, 2, 0, 2, 1),
		"local past local":   hello("j", 0, 1, 2, 4, 2),
		"local world > all":  hello("j", 0, 1, 1, 2, 4),
		"offset negative":    hello("j", 0, 0, 1, 4, 2),
		"job too long":       hello(strings.Repeat("x", 300), 0, 0, 0, 1, 1),
	} {
		if _, err := parseHello(h); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestDefaultSocket(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	if got := DefaultSocket(7, env(map[string]string{SocketEnv: "/x/s.sock", "XDG_RUNTIME_DIR": "/run/user/7"})); got != "/x/s.sock" {
		t.Errorf("override: %s", got)
	}
	if got := DefaultSocket(7, env(map[string]string{"XDG_RUNTIME_DIR": "/run/user/7"})); got != "/run/user/7/ddp-agent/sidecar.sock" {
		t.Errorf("XDG_RUNTIME_DIR: %s", got)
	}
	if got := DefaultSocket(7, env(nil)); got != filepath.Join(os.TempDir(), "ddp-agent-sidecar-7", "sidecar.sock") {
		t.Errorf("default: %s", got)
	}
}

func TestNames(t *testing.T) {
	for id, want := range map[string]string{
		"job-1.a_b":             "job-1.a_b",
		"a b/c:1":               "a_b_c_1-81b7dab8",
		"a_b_c_1":               "a_b_c_1", // not the same as the one above
		"..":                    "..-5ec1f7e7",
		strings.Repeat("x", 70): strings.Repeat("x", 48) + "-c71bd109",
	} {
		if got := dirName(id); got != want {
			t.Errorf("dirName(%q) = %q, want %q", id, got, want)
		}
	}
}

// TestSocketDir: the socket's directory must be the user's alone; the
// sidecar never chmods one that is not (a home directory, say).
func TestSocketDir(t *testing.T) {
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	if _, err := New(Config{Socket: filepath.Join(dir, "s.sock")}, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "mode 755") {
		t.Errorf("a 0755 directory: got %v", err)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o755 {
		t.Errorf("the directory's mode was changed to %o", fi.Mode().Perm())
	}
	if err := checkDir(filepath.Join(dir, "new")); err != nil {
		t.Errorf("a missing directory (made 0700): %v", err)
	}
}

func TestClearStale(t *testing.T) {
	dir := t.TempDir()
	if err := clearStale(filepath.Join(dir, "none.sock")); err != nil {
		t.Errorf("missing: %v", err)
	}
	plain := filepath.Join(dir, "plain")
	os.WriteFile(plain, nil, 0o600)
	if err := clearStale(plain); err == nil {
		t.Errorf("a regular file was taken for a socket")
	}
	live := filepath.Join(dir, "live.sock")
	ln, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	if err := clearStale(live); err == nil || !strings.Contains(err.Error(), "another sidecar") {
		t.Errorf("live socket: got %v", err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close() // the file stays, as after a SIGKILL
	if err := clearStale(live); err != nil {
		t.Errorf("dead socket: %v", err)
	}
	if _, err := os.Stat(live); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dead socket not removed: %v", err)
	}
}

func startSidecar(t *testing.T, cfg Config) (*Sidecar, *syncbuf.Buffer) {
	t.Helper()
	if cfg.Socket == "" {
		cfg.Socket = filepath.Join(t.TempDir(), "sc", "sidecar.sock")
	}
	lb := &syncbuf.Buffer{}
	sc, err := New(cfg, slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Run did not return")
		}
	})
	// Run sets the context Admit needs; wait for it to serve.
	waitFor(t, func() bool { return strings.Contains(lb.String(), "sidecar serving") })
	return sc, lb
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
	}
}

func dial(t *testing.T, sc *Sidecar, h wire.Hello) (*agentconn.Client, wire.Welcome, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, w, err := agentconn.Dial(ctx, sc.Path(), h)
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, w, err
}

// TestJobsAndGenerations: workers make their jobs; a later generation
// begins anew and an older one is then refused; an Abort for one job
// reaches its workers only; a job whose workers left closes after the
// linger time, its Perfetto file written.
func TestJobsAndGenerations(t *testing.T) {
	logDir := t.TempDir()
	sc, lb := startSidecar(t, Config{LogDir: logDir, Linger: 200 * time.Millisecond, Telemetry: observe.Config{HangTimeout: time.Minute}})
	a0, w, err := dial(t, sc, hello("job-a", 0, 0, 0, 2, 2))
	if err != nil || w.JobID != "job-a" || w.WorldSize != 2 || w.Config[wire.WelcomeRelay] != "" {
		t.Fatalf("first worker: %+v %v (no relay on one node)", w, err)
	}
	b0, _, err := dial(t, sc, hello("job b/1", 0, 0, 0, 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	var re *wire.RemoteError
	if _, _, err := dial(t, sc, wire.Hello{Rank: 0, PID: int32(os.Getpid())}); !errors.As(err, &re) || re.Code != wire.CodeBadRequest {
		t.Errorf("a Hello without a job: got %v, want bad request", err)
	}
	a1, w, err := dial(t, sc, hello("job-a", 1, 1, 1, 2, 2))
	if err != nil || w.Generation != 1 {
		t.Fatalf("generation 1: %+v %v", w, err)
	}
	if _, _, err := dial(t, sc, hello("job-a", 0, 1, 1, 2, 2)); !errors.Is(err, wire.ErrStaleGeneration) {
		t.Errorf("generation 0 after 1: got %v, want stale", err)
	}
	if !strings.Contains(lb.String(), "a new attempt of the job") {
		t.Errorf("no log of the new generation\n%s", lb.String())
	}

	sc.abortJob("job-a", 1, "test abort")
	select {
	case <-a1.Aborted():
		if !a1.Told() || a1.AbortReason() != "test abort" {
			t.Errorf("abort: told %v %q", a1.Told(), a1.AbortReason())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("job-a generation 1 not aborted")
	}
	select {
	case <-a0.Aborted():
		t.Errorf("generation 0 aborted: %s", a0.AbortReason())
	case <-b0.Aborted():
		t.Errorf("the other job aborted: %s", b0.AbortReason())
	case <-time.After(200 * time.Millisecond):
	}

	b0.Close()
	waitFor(t, func() bool { return sc.lookup("job b/1") == nil })
	if _, err := os.Stat(filepath.Join(logDir, dirName("job b/1"), "trace-gen0.json")); err != nil {
		t.Errorf("job b's trace file: %v", err)
	}
	if sc.lookup("job-a") == nil {
		t.Errorf("job-a closed while its workers are connected")
	}
	// A worker back within the linger time keeps the job; with no worker
	// connected, even a lower generation begins a new attempt (a run again
	// under the same id: its restart count starts over).
	j := sc.lookup("job-a")
	a0.Close()
	a1.Close()
	waitFor(t, func() bool { j.mu.Lock(); defer j.mu.Unlock(); return len(j.peers) == 0 })
	if _, _, err := dial(t, sc, hello("job-a", 0, 0, 0, 2, 2)); err != nil {
		t.Fatalf("a new run of job-a at generation 0: %v", err)
	}
	time.Sleep(400 * time.Millisecond) // twice the linger time
	if sc.lookup("job-a") != j {
		t.Errorf("job-a closed although a worker came back")
	}
	// A worker describing another shape of the job begins anew too.
	if _, _, err := dial(t, sc, hello("job-a", 0, 1, 1, 4, 2)); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(lb.String(), "a new attempt of the job"); n != 3 {
		t.Errorf("new attempts: got %d, want 3 (generation 1, the rerun, the new shape)\n%s", n, lb.String())
	}
}

// TestLeaderRelay: on the node of group rank 0 of a multi-node job, the
// sidecar leads: the Welcome carries its relay endpoint; another
// sidecar's worker that brings it in its Hello makes that sidecar follow
// (it connects to the leader's relay).
func TestLeaderRelay(t *testing.T) {
	lead, llog := startSidecar(t, Config{})
	follow, _ := startSidecar(t, Config{})
	_, w, err := dial(t, lead, hello("mn", 0, 0, 0, 4, 2, wire.HelloGroupRank, "0", wire.HelloMasterAddr, "127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	relay := w.Config[wire.WelcomeRelay]
	if relay == "" {
		t.Fatalf("the leader's Welcome has no relay endpoint\n%s", llog.String())
	}
	if _, _, err := dial(t, follow, hello("mn", 0, 2, 0, 4, 2, wire.HelloGroupRank, "1", wire.HelloRelay, relay)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(llog.String(), "relay: follower connected") })
}

var _ control.Sidecar = (*Sidecar)(nil)

// TestLeaderWithoutFollowers: the leading sidecar of a two-node job whose
// other node never reports (no sidecar there, a blocked relay port, a
// restarted leader) does not take the other ranks' missing records for a
// hang: it says so once and aborts nothing.
func TestLeaderWithoutFollowers(t *testing.T) {
	sc, lb := startSidecar(t, Config{Telemetry: observe.Config{HangTimeout: time.Second}})
	var clients []*agentconn.Client
	for r := range 2 {
		c, _, err := dial(t, sc, hello("mn", 0, r, r, 4, 2, wire.HelloGroupRank, "0", wire.HelloMasterAddr, "127.0.0.1"))
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	at := time.Now().UnixNano()
	for _, c := range clients { // both local ranks in the collective, the other node's never heard of
		if err := c.SendEvents(wire.Events{Events: []wire.CollectiveEvent{{Step: 1, Status: wire.StatusInFlight, TArrive: at, TStart: at}}}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return strings.Contains(lb.String(), "not judged a hang") })
	for _, c := range clients {
		select {
		case <-c.Aborted():
			t.Fatalf("aborted: %s\n%s", c.AbortReason(), lb.String())
		case <-time.After(500 * time.Millisecond):
		}
	}
	if strings.Contains(lb.String(), "hang: step") {
		t.Errorf("a hang reported\n%s", lb.String())
	}
}

// TestRestartsCounted: a later generation of a job is its launcher's
// restart after a fault, and ddp_restarts_total counts it, one per
// generation that ended so, as under ddp-agent run (it stayed 0 under the
// sidecar while torchrun restarted the job). A rerun under the same id
// (its count starts over) is no restart.
func TestRestartsCounted(t *testing.T) {
	sc, _ := startSidecar(t, Config{Linger: time.Minute, Telemetry: observe.Config{HangTimeout: time.Minute, MetricsAddr: "127.0.0.1:0"}})
	restarts := func() string {
		resp, err := http.Get(sc.hub.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for line := range strings.SplitSeq(string(body), "\n") {
			if strings.HasPrefix(line, "ddp_restarts_total{") && strings.Contains(line, `ddp_job_id="job-r"`) {
				return line[strings.LastIndex(line, " ")+1:]
			}
		}
		return "(none)\n" + string(body)
	}
	a0, _, err := dial(t, sc, hello("job-r", 0, 0, 0, 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	if got := restarts(); got != "0" {
		t.Fatalf("at generation 0: ddp_restarts_total %s, want 0", got)
	}
	a0.Close()
	a2, _, err := dial(t, sc, hello("job-r", 2, 0, 0, 1, 1)) // generation 1's workers never connected
	if err != nil {
		t.Fatal(err)
	}
	if got := restarts(); got != "2" {
		t.Fatalf("at generation 2: ddp_restarts_total %s, want 2", got)
	}
	j := sc.lookup("job-r")
	a2.Close()
	waitFor(t, func() bool { j.mu.Lock(); defer j.mu.Unlock(); return len(j.peers) == 0 })
	if _, _, err := dial(t, sc, hello("job-r", 0, 0, 0, 1, 1)); err != nil {
		t.Fatal(err)
	}
	if got := restarts(); got != "2" {
		t.Fatalf("after a rerun at generation 0: ddp_restarts_total %s, want still 2", got)
	}
}
