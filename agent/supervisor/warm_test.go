package supervisor

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStartWarm: the workers' processes start as warm spares before the
// round is known (a provisional spec), say they are ready on fd 4, and
// Start, once Adopt has given the group the round's spec, makes them the
// workers: each gets its rank and the round's world in its assignment,
// with the mode the spec asks ("join" here), prints under its rank's
// prefix and is the rank's pid. The regular spare starts after them. A
// warm process that died before Start is replaced by a fresh worker.
func TestStartWarm(t *testing.T) {
	provisional, out := spareSpec(t, "ok", 3, 1)
	provisional.WorldSize, provisional.RankOffset = 0, 0
	g := New(provisional, quiet())
	t.Cleanup(func() { g.Stop(syscall.SIGTERM, time.Second) })
	if n := g.StartWarm(context.Background(), 3, 30*time.Second); n != 3 {
		t.Fatalf("StartWarm: %d ready, want 3\n%s", n, out)
	}
	// Ready is said on fd 4; the line on stdout comes through the
	// console's copier, moments later.
	waitFor(t, func() bool { return strings.Contains(out.String(), "[spare0]:spare ready fd=3") })
	warm := map[int]bool{}
	g.mu.Lock()
	for _, sp := range g.spares {
		warm[sp.pid] = true
	}
	dead := g.spares[2].pid
	g.mu.Unlock()
	if err := syscall.Kill(dead, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return g.Spares() == 2 }) // dropped as an idle spare's exit

	round := *provisional
	round.WorldSize, round.RankOffset, round.NodeRank, round.Generation, round.Join, round.AgentStore = 6, 3, 1, 4, true, true
	wrong := round
	wrong.NProc = 2
	if err := g.Adopt(&wrong); err == nil {
		t.Error("Adopt of a spec with another number of workers: no error")
	}
	if err := g.Adopt(&round); err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The regular spare, started after the workers (its own output may
	// not come before the workers succeed and it is let go).
	if n := g.Spares(); n != 1 {
		t.Errorf("idle spares after Start: %d, want the regular one", n)
	}
	if err := g.Adopt(&round); !errors.Is(err, ErrNotInit) {
		t.Errorf("Adopt after Start: got %v, want ErrNotInit", err)
	}
	if err := g.Wait(context.Background()); err != nil {
		t.Fatalf("Wait: %v\n%s", err, out)
	}
	for _, want := range []string{
		`[rank3]:spare assigned rank 3 local rank 0 RANK=3 LOCAL_RANK=0 GPU=0 WORLD_SIZE=6 GROUP_RANK=1 GENERATION=4 mode="join" AGENT_STORE=True`,
		`[rank4]:spare assigned rank 4 local rank 1 RANK=4 LOCAL_RANK=1 GPU=1 WORLD_SIZE=6 GROUP_RANK=1 GENERATION=4 mode="join"`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("console: want %q\n%s", want, out)
		}
	}
	pids := g.PIDs()
	if !warm[pids[3]] || !warm[pids[4]] {
		t.Errorf("ranks 3 and 4 are pids %d and %d, not the warm processes %v", pids[3], pids[4], warm)
	}
	if warm[pids[5]] || pids[5] == 0 {
		t.Errorf("rank 5 is pid %d: want a fresh worker in place of the dead warm process %d", pids[5], dead)
	}
}

// TestStartWarmStart: a round that starts the job (no Join) gives the warm
// processes mode "start". StartWarm does not wait for them here (the
// job's start): the process still starting reads its rank once it is up.
func TestStartWarmStart(t *testing.T) {
	spec, out := spareSpec(t, "ok", 1, 0)
	g := New(spec, quiet())
	t.Cleanup(func() { g.Stop(syscall.SIGTERM, time.Second) })
	g.StartWarm(context.Background(), 1, 0)
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := g.Wait(context.Background()); err != nil {
		t.Fatalf("Wait: %v\n%s", err, out)
	}
	if want := `[rank0]:spare assigned rank 0 local rank 0 RANK=0 LOCAL_RANK=0 GPU=0 WORLD_SIZE=1 GROUP_RANK=0 GENERATION=0 mode="start"`; !strings.Contains(out.String(), want) {
		t.Errorf("console: want %q\n%s", want, out)
	}
}
