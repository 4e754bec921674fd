package e2e

import (
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// slowFirstAttempt runs train.py (its first argument) with the rest of its
// arguments, less --slow-rank and its value once TORCHELASTIC_RESTART_COUNT
// says the job has been restarted: the straggler is slow only in the first
// attempt, so a restart cures it, as it does a rank slowed by its process's
// own state. It execs, so the worker keeps the pid the agent knows.
const slowFirstAttempt = `import os, sys
train, args = sys.argv[1], sys.argv[2:]
if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0" and "--slow-rank" in args:
    i = args.index("--slow-rank")
    del args[i:i + 2]
os.execv(sys.executable, [sys.executable, "-u", train] + args)
`

// slowJob is the command line of a 2-rank job whose rank 1 is slow by
// 0.4 s in every step of its first attempt (most of a step of about
// 0.5 s: far above the jitter that other work beside this one causes on a
// 2-core machine; 0.25 s went unnamed at load 9 in 2 of 5 runs): the
// wrapper and train.py with their arguments.
func slowJob(t *testing.T) []string {
	t.Helper()
	needTorch(t)
	dir := t.TempDir()
	wrapper := filepath.Join(dir, "slow_first_attempt.py")
	if err := os.WriteFile(wrapper, []byte(slowFirstAttempt), 0o644); err != nil {
		t.Fatal(err)
	}
	const steps = 50
	return []string{wrapper, filepath.Join(repoRoot, "examples", "train.py"),
		"--steps", strconv.Itoa(steps), "--ckpt-every", "10", "--log-every", "10", "--ckpt-dir", filepath.Join(dir, "ckpt"),
		"--batch-size", "8", "--sleep-per-step", "0.15",
		"--slow-rank", "1", "--slow-steps", stepList(1, steps), "--slow-seconds", "0.4"}
}

// startSlowJob runs slowJob on one standalone node with the agent flags
// given.
func startSlowJob(t *testing.T, flags ...string) *agentRun {
	t.Helper()
	job := slowJob(t)
	args := append(append([]string{"--standalone", "--nproc-per-node", "2"}, flags...), job...)
	return startAgent(t, nil, args...)
}

// TestStragglerActionRestart: with --straggler-action restart and a 3 s
// confirmation window, rank 1, named a persistent straggler, is confirmed
// and the job restarted once, with a reason that names the rank and its
// cause; the restarted workers (no longer slow) resume from the checkpoint
// and the job finishes.
func TestStragglerActionRestart(t *testing.T) {
	budgetAlongside(t, 90*time.Second)
	r := startSlowJob(t, "--straggler-action", "restart", "--straggler-confirm", "3s", "--max-restarts", "2")
	if code := r.wait(2 * time.Minute); code != 0 {
		t.Fatalf("exit code %d, want 0\n%s", code, r.logs())
	}
	logs := r.stderr.String()
	restart := regexp.MustCompile(`persistent straggler rank (\d+) confirmed for 3s \(cause (\w+): .+\); action restart: restarting the job`)
	ms := restart.FindAllStringSubmatch(logs, -1)
	if len(ms) != 1 || ms[0][1] != "1" {
		t.Fatalf("want one restart for rank 1, got %q\n%s", ms, r.logs())
	}
	if !strings.Contains(logs, "restarting worker group") || strings.Count(logs, "workers started") != 2 {
		t.Errorf("want one restart of the worker group (two attempts)\n%s", r.logs())
	}
	out := r.stdout.String()
	for _, want := range []string{"restart_count 1", "resumed from step", "done: steps=50"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q\n%s", want, r.logs())
		}
	}
	t.Logf("restarted for rank 1 (cause %s) after %v", ms[0][2], time.Since(r.started).Round(time.Second))
}

// TestStragglerActionLogDefault: without --straggler-action the same
// straggler, confirmed, gets one line and nothing is done: the job runs
// to its end in one attempt.
func TestStragglerActionLogDefault(t *testing.T) {
	budgetAlongside(t, 60*time.Second)
	r := startSlowJob(t, "--straggler-confirm", "3s", "--max-restarts", "2")
	if code := r.wait(2 * time.Minute); code != 0 {
		t.Fatalf("exit code %d, want 0\n%s", code, r.logs())
	}
	logs := r.stderr.String()
	if n := strings.Count(logs, "persistent straggler rank 1 confirmed for 3s; action log: nothing done"); n != 1 {
		t.Errorf("%d lines confirming rank 1 with action log, want 1\n%s", n, r.logs())
	}
	if strings.Contains(logs, "restarting worker group") || strings.Count(logs, "workers started") != 1 {
		t.Errorf("the job restarted under --straggler-action log\n%s", r.logs())
	}
	if strings.Contains(r.stdout.String(), "restart_count 1") {
		t.Errorf("workers of a second attempt ran\n%s", r.logs())
	}
}

// startSpareJob starts slowJob as a one-node job (--nnodes 1:1) on an
// etcd that neither agent hosts (a drained host would take the store with
// it), under --straggler-action drain with a 3 s window: the member first,
// then a second agent, which waits as a spare.
func startSpareJob(t *testing.T) (member, spare *agentRun) {
	t.Helper()
	job := slowJob(t)
	cl, err := store.StartCluster(t.Context(), 1, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	args := append([]string{"--rdzv-backend", "etcd", "--rdzv-endpoint", strings.Join(cl.Endpoints(), ","),
		"--rdzv-id", "e2e" + strconv.Itoa(freePort(t)), "--rdzv-conf", fastConf, "--nnodes", "1:1", "--nproc-per-node", "2",
		"--max-restarts", "0", "--straggler-action", "drain", "--straggler-confirm", "3s"}, job...)
	member = startAgent(t, nil, args...)
	waitFor(t, 30*time.Second, func() bool { return strings.Contains(member.stderr.String(), "workers started") }, member.logs)
	spare = startAgent(t, nil, args...)
	waitFor(t, 30*time.Second, func() bool { return strings.Contains(spare.stderr.String(), "standing by as a spare") }, spare.logs)
	return member, spare
}

// TestStragglerActionDrainToSpare: a one-node job (--nnodes 1:1) with a
// second agent waiting as a spare. The member, whose rank 1 is confirmed
// slow, finds the spare in the store, leaves the job and exits 3 (drained);
// the spare takes its place, resumes from the checkpoint and finishes the
// job without draining itself (its rank 1 is as slow, but nobody is left
// to take its place). A drain is no fault: the job has no restarts
// (--max-restarts 0) and finishes all the same.
func TestStragglerActionDrainToSpare(t *testing.T) {
	budgetAlongside(t, 90*time.Second)
	member, spare := startSpareJob(t)
	if code := member.wait(time.Minute); code != 3 {
		t.Fatalf("the drained agent exited %d, want 3\n%s", code, member.logs())
	}
	logs := member.stderr.String()
	for _, want := range []string{
		"persistent straggler rank 1 confirmed for 3s (cause ",
		"; action drain: this node leaves the job (1 nodes, MIN 1, 1 spare(s))",
		"--straggler-action drain: this node leaves the job",
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("the drained agent's log lacks %q\n%s", want, member.logs())
		}
	}
	if code := spare.wait(2 * time.Minute); code != 0 {
		t.Fatalf("the spare exited %d, want 0\n%s", code, spare.logs())
	}
	if !strings.Contains(spare.stderr.String(), "left: drained: persistent straggler rank 1") {
		t.Errorf("the spare does not see the member's going as a drain\n%s", spare.logs())
	}
	out := spare.stdout.String()
	for _, want := range []string{"resumed from step", "done: steps=50"} {
		if !strings.Contains(out, want) {
			t.Errorf("the spare's stdout lacks %q\n%s", want, spare.logs())
		}
	}
	if strings.Contains(spare.stderr.String(), "; action drain: this node leaves the job (") {
		t.Errorf("the last node drained itself\n%s", spare.logs())
	}
}

// TestStragglerActionDrainAcrossNodes: two agents of one worker each
// (--nnodes 1:2) under --straggler-action drain. Rank 1, the slow one,
// runs on the follower's node: the leader names it (it analyzes every
// rank) and publishes it, the follower reads it from the store, confirms it
// and drains itself (exit 3); the leader's node goes on alone, resumes from
// the checkpoint and finishes.
func TestStragglerActionDrainAcrossNodes(t *testing.T) {
	budgetAlongside(t, 120*time.Second)
	job := slowJob(t)
	id := "drain" + strconv.Itoa(freePort(t))
	endpoint := "127.0.0.1:" + strconv.Itoa(freePort(t))
	var agents []*agentRun
	for i := range 2 {
		args := []string{"--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", id, "--nnodes", "1:2",
			"--nproc-per-node", "1", "--max-restarts", "0", "--rdzv-conf", fastConf,
			"--straggler-action", "drain", "--straggler-confirm", "3s"}
		agents = append(agents, startAgent(t, nil, append(args, job...)...))
		if i == 0 { // it hosts the store
			waitFor(t, 30*time.Second, func() bool { return strings.Contains(agents[0].stderr.String(), "hosting the rendezvous store") },
				agents[0].logs)
		}
	}
	// Rank 1 runs on whichever node got group rank 1: the follower.
	logs := func() string { return agents[0].logs() + "\n----\n" + agents[1].logs() }
	waitFor(t, time.Minute, func() bool {
		return strings.Contains(agents[0].stdout.String()+agents[1].stdout.String(), "[rank1]:")
	}, logs)
	leader, follower := agents[0], agents[1]
	if strings.Contains(leader.stdout.String(), "[rank1]:") {
		leader, follower = follower, leader
	}
	if code := follower.wait(2 * time.Minute); code != 3 {
		t.Fatalf("the follower exited %d, want 3 (drained)\n%s", code, logs())
	}
	if code := leader.wait(2 * time.Minute); code != 0 {
		t.Fatalf("the leader exited %d, want 0\n%s", code, logs())
	}
	for _, c := range []struct {
		who  *agentRun
		name string
		want string
	}{
		{follower, "the follower", "persistent straggler rank 1 confirmed for 3s (cause "},
		{follower, "the follower", "; action drain: this node leaves the job (2 nodes, MIN 1"},
		{leader, "the leader", "not drained here: rank 1 runs on"},
	} {
		if !strings.Contains(c.who.stderr.String(), c.want) {
			t.Errorf("%s's log lacks %q\n%s", c.name, c.want, logs())
		}
	}
	for _, want := range []string{"resumed from step", "world_size=1"} {
		if !strings.Contains(leader.stdout.String(), want) {
			t.Errorf("the leader's stdout lacks %q\n%s", want, logs())
		}
	}
}
