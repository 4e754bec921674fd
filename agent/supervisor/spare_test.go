package supervisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/envname"
	"github.com/ddp-agent/ddp-agent/internal/syncbuf"
)

// spareHelper is the test binary as a warm spare: it says it is ready
// (with the rank variables it has: none), then reads its fd 3 as
// ddp_agent._spare does and says what it was given, or that it was let go.
func spareHelper() {
	fmt.Printf("spare ready fd=%s RANK=%q LOCAL_RANK=%q JOIN=%q\n", os.Getenv(envname.SpareFD), os.Getenv("RANK"),
		os.Getenv("LOCAL_RANK"), os.Getenv(envname.Join))
	if os.Getenv(envname.SpareReadyFD) == "4" { // started warm: say so on fd 4 (StartWarm)
		ready := os.NewFile(4, "ready")
		ready.Write([]byte{'r'})
		ready.Close()
	}
	if os.Getenv(envname.SpareFD) == "" { // a joining worker: its rank is given already
		return
	}
	line, err := bufio.NewReader(os.NewFile(3, "assignment")).ReadString('\n')
	if err != nil {
		fmt.Println("spare released")
		return
	}
	var a struct {
		Assignment
		Store *StoreAssignment `json:"store"`
	}
	if err := json.Unmarshal([]byte(line), &a); err != nil {
		fmt.Println("bad assignment:", err)
		os.Exit(4)
	}
	if a.Store != nil {
		fmt.Printf("spare serves the store at %s:%d\n", a.Store.Addr, a.Store.Port)
		time.Sleep(time.Minute)
		return
	}
	fmt.Printf("spare assigned rank %d local rank %d RANK=%s LOCAL_RANK=%s GPU=%s WORLD_SIZE=%s GROUP_RANK=%s GENERATION=%s mode=%q AGENT_STORE=%s\n",
		a.Rank, a.LocalRank, a.Env["RANK"], a.Env["LOCAL_RANK"], a.Env["CUDA_VISIBLE_DEVICES"], a.Env["WORLD_SIZE"],
		a.Env["GROUP_RANK"], a.Env[envname.Generation], a.Mode, a.Env["TORCHELASTIC_USE_AGENT_STORE"])
	if os.Getenv("SPARE_HOLD") != "" { // it trains on in its rank, until stopped
		time.Sleep(time.Minute)
	}
}

func spareSpec(t *testing.T, mode string, nproc, spares int) (*Spec, *syncbuf.Buffer) {
	spec, out, _ := testSpec(t, mode, nproc, consoleOnly)
	spec.Spares, spec.SpareArgv, spec.SpareEnv = spares, []string{os.Args[0]}, []string{"SUPERVISOR_HELPER=spare"}
	spec.Place = func(lr int) Placement {
		return Placement{Env: map[string]string{"CUDA_VISIBLE_DEVICES": fmt.Sprint(lr)}}
	}
	return spec, out
}

// TestSpareTakesDeadRank: a worker killed by a signal is reported by Wait
// as before; Replace gives its rank to the idle spare, which reads the
// rank's variables (its GPU's too) on its fd 3, prints under the rank's
// prefix, counts as the rank (PIDs, RankOf). Wait then waits for it as
// for any worker. AddSpare starts another spare, until the attempt ends.
func TestSpareTakesDeadRank(t *testing.T) {
	spec, out := spareSpec(t, "selfkillif:1", 2, 1)
	g := start(t, spec)
	waitFor(t, func() bool { return strings.Contains(out.String(), "[spare0]:spare ready fd=3") })
	if !strings.Contains(out.String(), `RANK="" LOCAL_RANK=""`) {
		t.Errorf("a spare has a rank's variables before it takes one:\n%s", out)
	}
	var e *WorkerExitError
	if err := g.Wait(context.Background()); !errors.As(err, &e) || e.Rank != 1 || e.Signal != syscall.SIGKILL {
		t.Fatalf("Wait: got %v, want rank 1 killed", err)
	}
	dead := e.PID
	pid, err := g.Replace(1)
	if err != nil {
		t.Fatal(err)
	}
	if g.Spares() != 0 {
		t.Errorf("idle spares after Replace: %d, want 0", g.Spares())
	}
	g.AddSpare()
	if g.Spares() != 1 {
		t.Errorf("idle spares after AddSpare: %d, want 1", g.Spares())
	}
	if err := g.Wait(context.Background()); err != nil {
		t.Fatalf("Wait after Replace: %v\n%s", err, out)
	}
	if want := "[rank1]:spare assigned rank 1 local rank 1 RANK=1 LOCAL_RANK=1 GPU=1"; !strings.Contains(out.String(), want) {
		t.Errorf("console: want %q\n%s", want, out)
	}
	if got := g.PIDs()[1]; got != pid || got == dead {
		t.Errorf("PIDs()[1] = %d, want the spare's %d", got, pid)
	}
	if r, err := g.RankOf(pid); err != nil || r != 1 {
		t.Errorf("RankOf(spare) = %d, %v; want 1", r, err)
	}
	if _, err := g.RankOf(dead); err == nil {
		t.Errorf("RankOf(dead worker %d) admitted it", dead)
	}
	// Until the others are said to have re-formed with the spare, rank 1
	// failed when its worker died: a spare the others never took (a
	// script without InProcess) is not the rank's failure.
	if o := g.Outcomes()[1]; o.PID != dead || o.Exit == nil || o.Exit.Signal != syscall.SIGKILL || o.Exit.SparePID != pid {
		t.Errorf("Outcomes before Settled: rank 1 %+v (exit %+v), want the dead worker's death, with the spare's pid", o, o.Exit)
	}
	if g.State() != StateSucceeded {
		t.Errorf("state %v, want succeeded", g.State())
	}
	// Settled after the attempt's end changes nothing: its root cause may
	// have been decided on the dead worker's exit.
	g.Settled(dead)
	if o := g.Outcomes()[1]; o.PID != dead {
		t.Errorf("Outcomes after a late Settled: rank 1 %+v, want the dead worker's still", o)
	}
	// The new spare ended with the attempt, and none starts after it.
	select {
	case <-g.Closed():
	default:
		t.Error("Closed() is open after the workers succeeded")
	}
	waitFor(t, func() bool { return len(g.aliveAll()) == 0 && g.Spares() == 0 })
	g.AddSpare()
	if g.Spares() != 0 || len(g.aliveAll()) != 0 {
		t.Errorf("AddSpare after the attempt's end started a spare")
	}
}

// TestReplaceRefuses: no spare, a worker still running, a rank that is
// not the group's: Replace says so and changes nothing.
func TestReplaceRefuses(t *testing.T) {
	spec, _ := spareSpec(t, "selfkillif:1", 2, 0)
	g := start(t, spec)
	if err := g.Wait(context.Background()); err == nil {
		t.Fatal("Wait: want rank 1's failure")
	}
	if _, err := g.Replace(1); !errors.Is(err, ErrNoSpare) {
		t.Errorf("Replace without spares: got %v, want ErrNoSpare", err)
	}

	spec, _ = spareSpec(t, "sleepif:0", 2, 1)
	g = start(t, spec)
	if _, err := g.Replace(0); err == nil || !strings.Contains(err.Error(), "the group is healthy") {
		t.Errorf("Replace of a running worker: got %v", err)
	}
	if _, err := g.Replace(7); err == nil || !strings.Contains(err.Error(), "not a worker") {
		t.Errorf("Replace of rank 7: got %v", err)
	}
	if g.Spares() != 1 {
		t.Errorf("idle spares %d, want 1", g.Spares())
	}
}

// TestSparesEndWithTheAttempt: when every worker succeeds, or the group
// is stopped, the idle spares are killed at once (no grace: they hold no
// state); a spare that exits on its own is dropped, with a warning that
// has its last words, and the group runs on.
func TestSparesEndWithTheAttempt(t *testing.T) {
	spec, _ := spareSpec(t, "exit:0", 1, 2)
	g := start(t, spec)
	if err := g.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(g.aliveAll()) == 0 })

	spec, _ = spareSpec(t, "sleep", 1, 1)
	spec.SpareArgv = []string{"/bin/sh", "-c", "echo no module named ddp_agent >&2; exit 5"}
	var logs syncbuf.Buffer
	g = New(spec, slog.New(slog.NewTextHandler(&logs, nil)))
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(logs.String(), "warm spare exited before it was needed") })
	if !strings.Contains(logs.String(), "no module named ddp_agent") || g.Spares() != 0 || g.State() != StateHealthy {
		t.Errorf("want the spare's stderr in the warning, no spare left and a healthy group; got %d spares, %v\n%s",
			g.Spares(), g.State(), logs.String())
	}
	g.Stop(syscall.SIGTERM, time.Second)

	spec, out := spareSpec(t, "sleep", 1, 1)
	g = start(t, spec)
	waitFor(t, func() bool { return strings.Contains(out.String(), "spare ready") })
	began := time.Now()
	g.Stop(syscall.SIGTERM, 5*time.Second)
	if n := len(g.aliveAll()); n != 0 {
		t.Errorf("Stop left %d processes", n)
	}
	t.Logf("Stop of a worker and a spare took %v", time.Since(began))
}

// TestPendingReplacement: a spare's replacement of a dead worker stays
// pending, and Outcomes gives the rank the dead worker's exit, until
// Settled names that dead worker (another pid changes nothing), or until
// Renumber moves the group into a new world.
func TestPendingReplacement(t *testing.T) {
	replaced := func() (*Group, int, int) {
		spec, out := spareSpec(t, "selfkillif:1", 2, 1)
		spec.SpareEnv = append(spec.SpareEnv, "SPARE_HOLD=1")
		g := start(t, spec)
		waitFor(t, func() bool { return strings.Contains(out.String(), "[spare0]:spare ready fd=3") })
		var e *WorkerExitError
		if err := g.Wait(context.Background()); !errors.As(err, &e) || e.Rank != 1 {
			t.Fatalf("Wait: got %v, want rank 1 killed", err)
		}
		pid, err := g.Replace(1)
		if err != nil {
			t.Fatal(err)
		}
		if o := g.Outcomes()[1]; o.PID != e.PID || o.Exit == nil || o.Exit.SparePID != pid {
			t.Fatalf("Outcomes after Replace: rank 1 %+v, want the dead worker %d's exit with spare %d", o, e.PID, pid)
		}
		return g, e.PID, pid
	}
	g, dead, spare := replaced()
	g.Settled(dead + 100000)
	if o := g.Outcomes()[1]; o.PID != dead {
		t.Errorf("Settled of another pid: rank 1 %+v, want still pending", o)
	}
	g.Settled(dead)
	if o := g.Outcomes()[1]; o.PID != spare || o.Exit != nil {
		t.Errorf("Outcomes after Settled: rank 1 %+v, want the running spare %d", o, spare)
	}
	g, _, spare = replaced()
	g.Renumber(World{Generation: 1, RankOffset: 2, WorldSize: 4, NodeRank: 1, NNodes: 2})
	if o := g.Outcomes()[1]; o.PID != spare || o.Rank != 3 || o.Exit != nil {
		t.Errorf("Outcomes after Renumber: local rank 1 %+v, want the running spare %d as rank 3", o, spare)
	}
}

// TestRenumberThenReplace: a group moved into another world (Renumber,
// as when its workers carry on after a node was lost) has its workers'
// new ranks by pid, in PIDs and RankOf; a worker that dies after is
// reported under its new rank, and the spare that takes it is given the
// new world's variables, though it started in the old one.
func TestRenumberThenReplace(t *testing.T) {
	spec, out := spareSpec(t, "selfkillif:1", 2, 1)
	g := start(t, spec)
	waitFor(t, func() bool { return strings.Contains(out.String(), "[spare0]:spare ready fd=3") })
	before := g.PIDs()
	ranks := g.Renumber(World{Generation: 3, RankOffset: 4, WorldSize: 6, NodeRank: 2, NNodes: 3, RestartCount: 1})
	if len(ranks) != 2 || ranks[before[0]] != 4 || ranks[before[1]] != 5 {
		t.Fatalf("Renumber: got %v for pids %v, want ranks 4 and 5", ranks, before)
	}
	if p := g.PIDs(); p[4] != before[0] || p[5] != before[1] || len(p) != 2 {
		t.Errorf("PIDs after Renumber: %v", p)
	}
	if r, err := g.RankOf(before[0]); err != nil || r != 4 {
		t.Errorf("RankOf(local rank 0) = %d, %v; want 4", r, err)
	}
	var e *WorkerExitError
	if err := g.Wait(context.Background()); !errors.As(err, &e) || e.Rank != 5 || e.LocalRank != 1 {
		t.Fatalf("Wait: got %v, want rank 5 (local rank 1) killed", err)
	}
	if _, err := g.Replace(5); err != nil {
		t.Fatal(err)
	}
	if err := g.Wait(context.Background()); err != nil {
		t.Fatalf("Wait after Replace: %v\n%s", err, out)
	}
	want := "[rank5]:spare assigned rank 5 local rank 1 RANK=5 LOCAL_RANK=1 GPU=1 WORLD_SIZE=6 GROUP_RANK=2 GENERATION=3"
	if !strings.Contains(out.String(), want) {
		t.Errorf("console: want %q\n%s", want, out)
	}
}

// TestJoinStartsWorkersAsSpares: a group started to join the others'
// re-formation (Spec.Join) runs SpareArgv for each worker, with its rank's
// variables and DDP_AGENT_JOIN, and no spare pipe; its own warm spares
// wait for a rank as ever, without the mark.
func TestJoinStartsWorkersAsSpares(t *testing.T) {
	spec, out := spareSpec(t, "ok", 2, 1)
	spec.Argv = []string{"/nonexistent/not-run-when-joining"}
	spec.Join = true
	g := start(t, spec)
	for _, want := range []string{`[rank0]:spare ready fd= RANK="0" LOCAL_RANK="0" JOIN="1"`,
		`[rank1]:spare ready fd= RANK="1" LOCAL_RANK="1" JOIN="1"`, `[spare0]:spare ready fd=3 RANK="" LOCAL_RANK="" JOIN=""`} {
		waitFor(t, func() bool { return strings.Contains(out.String(), want) })
	}
	if err := g.Wait(context.Background()); err != nil {
		t.Fatalf("Wait: %v\n%s", err, out)
	}
}
