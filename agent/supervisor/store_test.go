package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/syncbuf"
)

// storeHelper is the test binary as the job's store (no RANK): it says so
// and serves until killed, or, with die, fails at once as a store that
// cannot bind would; and as a worker: it says what it was told and exits
// 0, or, with die or stay, runs on (the store's death must end it).
func storeHelper(rank int, arg string) {
	die := arg == "die"
	agentStore := os.Getenv("TORCHELASTIC_USE_AGENT_STORE")
	if _, ok := os.LookupEnv("RANK"); !ok {
		fmt.Printf("store up pid=%d USE_AGENT_STORE=%s port=%s\n", os.Getpid(), agentStore, os.Getenv("MASTER_PORT"))
		if die {
			fmt.Fprintln(os.Stderr, "cannot bind the store's port")
			os.Exit(3)
		}
		time.Sleep(time.Minute)
		return
	}
	fmt.Printf("worker rank %d USE_AGENT_STORE=%s\n", rank, agentStore)
	if die || arg == "stay" {
		time.Sleep(time.Minute)
	}
}

func storeSpec(t *testing.T, mode string, nodeRank int) (*Spec, *syncbuf.Buffer) {
	spec, out, _ := testSpec(t, mode, 2, consoleOnly)
	spec.NodeRank, spec.RankOffset, spec.NNodes, spec.WorldSize = nodeRank, 2*nodeRank, 2, 4
	spec.AgentStore, spec.StoreArgv = true, []string{os.Args[0]}
	return spec, out
}

// TestStoreServedByItsOwnProcess: with AgentStore, node rank 0's group
// starts the store's process before its workers, without a rank's
// variables; every worker is told the agent serves the store; once the
// workers have succeeded the store is ended with the attempt.
func TestStoreServedByItsOwnProcess(t *testing.T) {
	spec, out := storeSpec(t, "store", 0)
	g := start(t, spec)
	if err := g.Wait(context.Background()); err != nil {
		t.Fatalf("Wait: %v\n%s", err, out)
	}
	for _, want := range []string{"[store]:store up", "USE_AGENT_STORE=True port=29500", "[rank0]:worker rank 0 USE_AGENT_STORE=True",
		"[rank1]:worker rank 1 USE_AGENT_STORE=True"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("console: want %q\n%s", want, out)
		}
	}
	g.mu.Lock()
	st := g.store
	g.mu.Unlock()
	select {
	case <-st.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the store (pid %d) still runs after the workers succeeded", st.pid)
	}
}

// TestStoreNotOnOtherNodes: the other nodes' workers are clients too,
// and start no store; without AgentStore rank 0 serves it.
func TestStoreNotOnOtherNodes(t *testing.T) {
	spec, out := storeSpec(t, "store", 1)
	g := start(t, spec)
	if err := g.Wait(context.Background()); err != nil {
		t.Fatalf("Wait: %v\n%s", err, out)
	}
	if strings.Contains(out.String(), "store up") || !strings.Contains(out.String(), "[rank3]:worker rank 3 USE_AGENT_STORE=True") {
		t.Errorf("node rank 1: want no store and clients told so\n%s", out)
	}
	spec, out = storeSpec(t, "store", 0)
	spec.AgentStore = false
	if err := start(t, spec).Wait(context.Background()); err != nil {
		t.Fatalf("Wait: %v\n%s", err, out)
	}
	if strings.Contains(out.String(), "store up") || !strings.Contains(out.String(), "[rank0]:worker rank 0 USE_AGENT_STORE=False") {
		t.Errorf("without AgentStore: want rank 0 to serve\n%s", out)
	}
}

// TestStoreExitEndsAttempt: the store's death, while the workers run,
// is Wait's error (its exit and last words), and Stop ends the workers.
func TestStoreExitEndsAttempt(t *testing.T) {
	spec, out := storeSpec(t, "store:die", 0)
	g := start(t, spec)
	var se *StoreExitError
	if err := g.Wait(context.Background()); !errors.As(err, &se) {
		t.Fatalf("Wait: got %v, want the store's exit\n%s", err, out)
	}
	if se.Exit != "exit status 3" || !strings.Contains(strings.Join(se.StderrTail, "\n"), "cannot bind") {
		t.Errorf("store exit: got %q %q", se.Exit, se.StderrTail)
	}
	if !strings.Contains(se.Error(), "the job's store") {
		t.Errorf("error: %v", se)
	}
	pids := g.PIDs()
	g.Stop(syscall.SIGTERM, time.Second)
	for rank, pid := range pids {
		if alive(pid) {
			t.Errorf("rank %d (pid %d) runs after Stop", rank, pid)
		}
	}
}

// TestStopEndsStore: stopping a running attempt ends its store too.
func TestStopEndsStore(t *testing.T) {
	spec, out := storeSpec(t, "sleep", 0)
	g := start(t, spec)
	g.mu.Lock()
	st := g.store
	g.mu.Unlock()
	g.Stop(syscall.SIGTERM, time.Second)
	select {
	case <-st.done:
	default:
		t.Fatalf("the store (pid %d) runs after Stop\n%s", st.pid, out)
	}
}

// TestServeStoreAfterRenumber: a group that carries on into node rank 0
// where it was not (the store's node was lost) starts the new store, on
// the new world's port, once; a group still elsewhere starts none.
func TestServeStoreAfterRenumber(t *testing.T) {
	spec, out := storeSpec(t, "store:stay", 1)
	g := start(t, spec)
	defer g.Stop(syscall.SIGTERM, time.Second)
	g.Renumber(World{Generation: 2, RankOffset: 2, WorldSize: 4, NodeRank: 1, NNodes: 2, MasterAddr: "127.0.0.1", MasterPort: 29600})
	if started, _, err := g.ServeStore(); started || err != nil {
		t.Fatalf("ServeStore at node rank 1: got %v, %v; want no store", started, err)
	}
	g.Renumber(World{Generation: 3, WorldSize: 2, NodeRank: 0, NNodes: 1, MasterAddr: "127.0.0.1", MasterPort: 29601})
	if started, spare, err := g.ServeStore(); !started || spare || err != nil {
		t.Fatalf("ServeStore at node rank 0: got %v, %v, %v; want a new store's process", started, spare, err)
	}
	waitFor(t, func() bool { return strings.Contains(out.String(), "[store]:store up") })
	if !strings.Contains(out.String(), "USE_AGENT_STORE=True port=29601") {
		t.Errorf("the store serves another port than the new world's 29601\n%s", out)
	}
	if started, _, err := g.ServeStore(); started || err != nil {
		t.Errorf("ServeStore again: got %v, %v; want the store it serves", started, err)
	}
}

// TestSpareServesStore: under spares, ServeStore has an idle warm spare
// serve the store (it has imported torch): one line on its pipe with the
// new world's address and port. It is no spare from then on, and its
// exit is the store's, a fault of the attempt.
func TestSpareServesStore(t *testing.T) {
	spec, out := storeSpec(t, "store:stay", 1)
	spec.Spares, spec.SpareArgv, spec.SpareEnv = 1, []string{os.Args[0]}, []string{"SUPERVISOR_HELPER=spare"}
	g := start(t, spec)
	defer g.Stop(syscall.SIGTERM, time.Second)
	waitFor(t, func() bool { return strings.Contains(out.String(), "[spare0]:spare ready fd=3") })
	g.Renumber(World{Generation: 2, WorldSize: 2, NodeRank: 0, NNodes: 1, MasterAddr: "127.0.0.1", MasterPort: 29602})
	if started, spare, err := g.ServeStore(); !started || !spare || err != nil {
		t.Fatalf("ServeStore: got %v, %v, %v; want the spare serving", started, spare, err)
	}
	waitFor(t, func() bool {
		return strings.Contains(out.String(), "[store]:spare serves the store at 127.0.0.1:29602")
	})
	if n := g.Spares(); n != 0 || strings.Contains(out.String(), "store up") {
		t.Errorf("%d spares idle after one became the store (want 0), or a new store's process\n%s", n, out)
	}
	g.mu.Lock()
	st := g.store
	g.mu.Unlock()
	syscall.Kill(st.pid, syscall.SIGKILL)
	var se *StoreExitError
	if err := g.Wait(context.Background()); !errors.As(err, &se) || se.PID != st.pid {
		t.Fatalf("Wait: got %v, want the store's (pid %d) exit", err, st.pid)
	}
}
