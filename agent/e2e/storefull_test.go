package e2e

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/agentconn"
	"github.com/ddp-agent/ddp-agent/wire"
)

// The hosted store over a job's life: generations that each write a lot
// must not fill it, and a store that is full anyway ends the job with the
// reason rather than a retry that never ends.

// fillHelper is a worker that writes E2E_FILL_VALUES values of 1 MB through
// the control socket's KV (into the store), then fails the attempt until
// generation E2E_FILL_GENS, where it succeeds.
func fillHelper(ctx context.Context) int {
	rank, _ := strconv.Atoi(os.Getenv("RANK"))
	localRank, _ := strconv.Atoi(os.Getenv("LOCAL_RANK"))
	gen, _ := strconv.ParseUint(os.Getenv("DDP_AGENT_GENERATION"), 10, 64)
	values, _ := strconv.Atoi(os.Getenv("E2E_FILL_VALUES"))
	gens, _ := strconv.ParseUint(os.Getenv("E2E_FILL_GENS"), 10, 64)
	c, _, err := agentconn.Dial(ctx, os.Getenv("DDP_AGENT_SOCKET"), wire.Hello{
		Rank: int32(rank), LocalRank: int32(localRank), PID: int32(os.Getpid()), Generation: gen})
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		return 1
	}
	defer c.Close()
	v := make([]byte, 1_000_000)
	for i := range values {
		rand.Read(v) // incompressible, and no two alike
		if err := c.KVSet(ctx, fmt.Sprintf("fill/%d/%d", rank, i), v); err != nil {
			fmt.Fprintln(os.Stderr, "kvset:", err)
			return 1
		}
	}
	fmt.Printf("filled gen %d\n", gen)
	if gen < gens {
		return 3
	}
	return 0
}

// fillJob runs one agent that hosts the store with quota MiB, its four
// workers writing values MB each generation.
func fillJob(t *testing.T, quotaMiB, values, gens int) *agentRun {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return startAgent(t, []string{"E2E_HELPER=fill", "E2E_FILL_VALUES=" + strconv.Itoa(values), "E2E_FILL_GENS=" + strconv.Itoa(gens)},
		"--nnodes", "1", "--nproc-per-node", "4", "--max-restarts", strconv.Itoa(gens),
		"--rdzv-backend", "c10d", "--rdzv-endpoint", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--rdzv-id", "fill",
		"--rdzv-conf", fmt.Sprintf("store_quota=%dMiB", quotaMiB), "--no-python", self)
}

// TestStoreBoundedOverGenerations: each generation writes 12 MB (four
// ranks, 3 MB each) into a 48 MiB store, four generations in all. The
// keys of a generation that ended are deleted, and their space must come
// back (compaction), or the store fills by the fourth generation. (Small:
// the agents run under the race detector here, where etcd takes seconds
// per 10 MB.)
func TestStoreBoundedOverGenerations(t *testing.T) {
	budgetAlongside(t, 15*time.Second)
	r := fillJob(t, 48, 3, 3)
	if code := r.wait(90 * time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0\n%s", code, r.logs())
	}
	if !strings.Contains(r.stdout.String(), "filled gen 3") {
		t.Errorf("the last generation did not fill\n%s", r.logs())
	}
}

// TestStoreFullFailsTheJob: one generation writes more than the store
// holds. The job must end, soon, saying the store is full and how to make
// it larger.
func TestStoreFullFailsTheJob(t *testing.T) {
	budget(t, 20*time.Second)
	r := fillJob(t, 16, 8, 3)
	if code := r.wait(60 * time.Second); code == 0 {
		t.Fatalf("exit code 0 from a job whose store is full\n%s", r.logs())
	}
	for _, want := range []string{"rendezvous store is full", "store_quota"} {
		if !strings.Contains(r.stderr.String(), want) {
			t.Errorf("the agent's log lacks %q\n%s", want, r.logs())
		}
	}
}
