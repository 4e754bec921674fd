package rdzv

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestRoundFormsAndFaultsMoveEveryone(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 2, 3)
	es := []*Membership{open(t, dial(), cfg), open(t, dial(), cfg), open(t, dial(), cfg)}
	begin := time.Now()
	rounds := nextAll(t, es...)
	t.Logf("3 agents formed generation %d in %v", rounds[0].Generation, time.Since(begin))
	checkRounds(t, rounds)
	if rounds[0].Generation != 0 || rounds[0].Restarts != 0 {
		t.Fatalf("first round: generation %d restarts %d", rounds[0].Generation, rounds[0].Restarts)
	}

	// A worker failure on one node ends the round everywhere and counts.
	if err := es[1].Fail(t.Context(), rounds[1], "worker rank 3 failed"); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*Round{rounds[0], rounds[2]} {
		if why := waitDone(t, r, 2*time.Second); !strings.Contains(why, "worker rank 3 failed") {
			t.Fatalf("round ended with %q", why)
		}
	}
	old := rounds
	rounds = nextAll(t, es...)
	checkRounds(t, rounds)
	if rounds[0].Generation != 1 || rounds[0].Restarts != 1 {
		t.Fatalf("after a failure: generation %d restarts %d", rounds[0].Generation, rounds[0].Restarts)
	}
	for i := range es {
		if rounds[i].GroupRank != old[i].GroupRank {
			t.Fatalf("agent %d moved from group rank %d to %d", i, old[i].GroupRank, rounds[i].GroupRank)
		}
	}

	// An agent that dies (no keep-alives, probe refusing) is found by the
	// others, who re-form without it; it counts as a fault.
	victim := es[0]
	for i := range es {
		if rounds[i].GroupRank == 1 {
			victim = es[i]
		}
	}
	var rest []*Membership
	var restRounds []*Round
	for i := range es {
		if es[i] != victim {
			rest = append(rest, es[i])
			restRounds = append(restRounds, rounds[i])
		}
	}
	victim.Close() // keep-alives stop and the probe port refuses, as after SIGKILL
	lost := time.Now()
	for _, r := range restRounds {
		if why := waitDone(t, r, 5*time.Second); !strings.Contains(why, "lost") {
			t.Fatalf("round ended with %q", why)
		}
	}
	t.Logf("lost node noticed after %v", time.Since(lost))
	prev := restRounds
	rounds = nextAll(t, rest...)
	t.Logf("re-formed without it %v after it died", time.Since(lost))
	checkRounds(t, rounds)
	if rounds[0].Generation != 2 || rounds[0].Restarts != 2 {
		t.Fatalf("after a lost node: generation %d restarts %d", rounds[0].Generation, rounds[0].Restarts)
	}
	for i := range rest {
		// rank 0 keeps rank 0; old rank 2 takes the free rank 1
		if prev[i].GroupRank == 0 && rounds[i].GroupRank != 0 {
			t.Fatalf("rank 0 survivor moved to %d", rounds[i].GroupRank)
		}
	}
}

func TestNoRestartsLeftFailsTheJobEverywhere(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 2, 2)
	cfg.MaxRestarts = 0
	a, b := open(t, dial(), cfg), open(t, dial(), cfg)
	rounds := nextAll(t, a, b)
	var jf *JobFailedError
	if err := a.Fail(t.Context(), rounds[0], "worker rank 1 failed"); !errors.As(err, &jf) {
		t.Fatalf("Fail with no restarts: %v", err)
	}
	waitDone(t, rounds[1], 2*time.Second)
	if _, err := b.Next(t.Context()); !errors.As(err, &jf) || !strings.Contains(jf.Reason, "worker rank 1 failed") || !strings.Contains(jf.Reason, "no restarts left") {
		t.Fatalf("the other node's Next: %v", err)
	}
}

// TestReusedIDStartsANewRun: a job id whose last run ended (succeeded,
// or was killed without leaving) serves a new run.
func TestReusedIDStartsANewRun(t *testing.T) {
	dial := testStore(t)
	cfg := testConfig(t, 1, 1)
	a := open(t, dial(), cfg)
	r := nextAll(t, a)[0]
	if err := a.Succeed(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	a.Leave("done")
	b := open(t, dial(), cfg)
	rb := nextAll(t, b)[0]
	if rb.Generation <= r.Generation || rb.Restarts != 0 {
		t.Fatalf("new run: generation %d (last run %d), restarts %d", rb.Generation, r.Generation, rb.Restarts)
	}
	// Its traces are its own (export.TraceJob).
	if r.Run == "" || rb.Run == "" || rb.Run == r.Run {
		t.Fatalf("new run named %q, the last %q", rb.Run, r.Run)
	}
	// killed without leaving: the lease runs out, the state still says running
	b.Close()
	c := open(t, dial(), cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	rc, err := c.Next(ctx)
	if err != nil {
		t.Fatalf("after a killed run: %v", err)
	}
	if rc.Generation <= rb.Generation {
		t.Fatalf("generation %d after %d", rc.Generation, rb.Generation)
	}
}
