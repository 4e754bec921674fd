package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/agentconn"
	"github.com/ddp-agent/ddp-agent/wire"
)

// helper is the test binary acting as a worker (started with --no-python).
func helper(mode string) int {
	rank, _ := strconv.Atoi(os.Getenv("RANK"))
	localRank, _ := strconv.Atoi(os.Getenv("LOCAL_RANK"))
	world, _ := strconv.Atoi(os.Getenv("WORLD_SIZE"))
	gen, _ := strconv.ParseUint(os.Getenv("DDP_AGENT_GENERATION"), 10, 64)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	switch mode {
	case "kv":
		// Every rank publishes an address and reads everyone's, as a
		// transport bootstrap does.
		c, w, err := agentconn.Dial(ctx, os.Getenv("DDP_AGENT_SOCKET"), wire.Hello{
			Rank: int32(rank), LocalRank: int32(localRank), PID: int32(os.Getpid()), Generation: gen, Transports: []string{"host"}})
		if err != nil {
			fmt.Fprintln(os.Stderr, "dial:", err)
			return 1
		}
		defer c.Close()
		if int(w.WorldSize) != world || w.Generation != gen {
			fmt.Fprintf(os.Stderr, "welcome %+v does not match env world %d gen %d\n", w, world, gen)
			return 1
		}
		if err := c.KVSet(ctx, "addr/"+strconv.Itoa(rank), []byte(fmt.Sprintf("host-%d", rank))); err != nil {
			fmt.Fprintln(os.Stderr, "kvset:", err)
			return 1
		}
		var got []string
		for r := 0; r < world; r++ {
			v, err := c.KVGet(ctx, "addr/"+strconv.Itoa(r), 10*time.Second)
			if err != nil {
				fmt.Fprintln(os.Stderr, "kvget:", err)
				return 1
			}
			got = append(got, string(v))
		}
		fmt.Printf("job %s gen %d peers %s\n", w.JobID, w.Generation, strings.Join(got, ","))
		// Generation 1 (the restart) must not see generation 0's keys.
		if gen == 0 {
			if err := c.KVSet(ctx, "gen0-only/"+strconv.Itoa(rank), []byte("x")); err != nil {
				fmt.Fprintln(os.Stderr, "kvset:", err)
				return 1
			}
			if rank == 0 {
				for r := 0; r < world; r++ { // everyone has printed its line
					if _, err := c.KVGet(ctx, "gen0-only/"+strconv.Itoa(r), 10*time.Second); err != nil {
						fmt.Fprintln(os.Stderr, "kvget:", err)
						return 1
					}
				}
				return 3 // fail the attempt, so the agent restarts into generation 1
			}
		}
		if gen == 1 {
			if _, err := c.KVGet(ctx, "gen0-only/"+strconv.Itoa(rank), 100*time.Millisecond); !errors.Is(err, wire.ErrTimeout) {
				fmt.Fprintln(os.Stderr, "stale key lookup:", err)
				return 1
			}
		}
		return 0
	}
	if mode == "hello" {
		return helloHelper()
	}
	if mode == "fill" {
		return fillHelper(ctx)
	}
	if mode == "abortwait" {
		// Ignore SIGTERM so only the control socket's Abort ends this worker.
		signal.Ignore(syscall.SIGTERM)
		c, _, err := agentconn.Dial(ctx, os.Getenv("DDP_AGENT_SOCKET"), wire.Hello{
			Rank: int32(rank), LocalRank: int32(localRank), PID: int32(os.Getpid()), Generation: gen})
		if err != nil {
			fmt.Fprintln(os.Stderr, "dial:", err)
			return 1
		}
		defer c.Close()
		fmt.Println("connected")
		select {
		case <-c.Aborted():
			fmt.Println("abort:", c.AbortReason())
			return 0
		case <-ctx.Done():
			return 1
		}
	}
	fmt.Fprintln(os.Stderr, "unknown helper mode", mode)
	return 2
}

// TestAbortOnSignal: when a signal stops the agent, connected workers still
// receive Abort (so a shim can abort a hung collective) while they are
// being stopped.
func TestAbortOnSignal(t *testing.T) {
	budget(t, 10*time.Second)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	r := startAgent(t, []string{"E2E_HELPER=abortwait"}, "--nproc-per-node", "2", "--stop-timeout", "5s", "--no-python", self)
	waitFor(t, 10*time.Second, func() bool { return strings.Count(r.stdout.String(), "connected") == 2 }, r.logs)
	r.cmd.Process.Signal(syscall.SIGTERM)
	if code := r.wait(10 * time.Second); code != 143 {
		t.Errorf("exit code %d, want 143", code)
	}
	for rank := 0; rank < 2; rank++ {
		if want := fmt.Sprintf("[rank%d]:abort: agent stopping: received terminated", rank); !strings.Contains(r.stdout.String(), want) {
			t.Errorf("stdout lacks %q\n%s", want, r.logs())
		}
	}
}

// TestControlSocketKV: workers of a real agent say Hello and bootstrap
// through KVSet/KVGet; the store is scoped to the generation (attempt), and
// a process that is not a worker is turned away.
func TestControlSocketKV(t *testing.T) {
	budget(t, 10*time.Second)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	r := startAgent(t, []string{"E2E_HELPER=kv"}, "--nproc-per-node", "3", "--max-restarts", "1", "--run-id", "kvjob", "--no-python", self)
	if code := r.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit code %d\n%s", code, r.logs())
	}
	out := r.stdout.String()
	for gen := 0; gen < 2; gen++ {
		for rank := 0; rank < 3; rank++ {
			want := fmt.Sprintf("[rank%d]:job kvjob gen %d peers host-0,host-1,host-2", rank, gen)
			if !strings.Contains(out, want) {
				t.Errorf("stdout lacks %q\n%s", want, r.logs())
			}
		}
	}
}

func TestControlSocketRejectsStrangers(t *testing.T) {
	budget(t, 10*time.Second)
	r := startAgent(t, nil, "--nproc-per-node", "1", "sleeper.py")
	r.workerPIDs(1)
	b, err := os.ReadFile(filepath.Join(r.out, "pid_0"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(string(b))
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	var sock string
	for _, kv := range strings.Split(string(env), "\x00") {
		if v, ok := strings.CutPrefix(kv, "DDP_AGENT_SOCKET="); ok {
			sock = v
		}
	}
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket %q: mode %v, %v; want 0600", sock, fi.Mode().Perm(), err)
	}
	if di, err := os.Stat(filepath.Dir(sock)); err != nil || di.Mode().Perm() != 0o700 {
		t.Errorf("socket dir: mode %v, %v; want 0700", di.Mode().Perm(), err)
	}
	// Same user, but not a worker: denied even when claiming to be rank 0.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _, err = agentconn.Dial(ctx, sock, wire.Hello{Rank: 0, PID: int32(os.Getpid())})
	if !errors.Is(err, wire.ErrDenied) {
		t.Errorf("Dial from the test process: got %v, want ErrDenied", err)
	}
	r.cmd.Process.Signal(os.Interrupt)
	r.wait(10 * time.Second)
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left behind after exit: %v", err)
	}
}
