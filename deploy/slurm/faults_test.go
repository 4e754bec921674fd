package slurm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// These are TestSlurm's steps for the faults around a job, on one node
// each: Slurm's SIGUSR1 warning, a node refused by the prolog, an epilog
// installed without its prolog.

// usr1Worker notes SIGUSR1 (as Lightning checkpoints on it) and carries on
// until it is killed.
const usr1Worker = `import os, signal, time
rank = os.environ["RANK"]
signal.signal(signal.SIGUSR1, lambda *_: print(f"rank {rank}: SIGUSR1, checkpointing", flush=True))
print(f"rank {rank}: waiting for SIGUSR1", flush=True)
while True:
    time.sleep(1)
`

// usr1StopsTheJob: Slurm's warning before the time limit, --signal=USR1@N,
// with the agent told to handle it (--signals-to-handle ...,SIGUSR1). Here
// `scancel --signal=USR1` sends it at once, to the same processes (every one
// of each step, not the batch shell). The task's shell outlives it, the
// agent stops its workers (which get SIGUSR1, then SIGKILL after
// STOP_TIMEOUT) and exits 138.
func usr1StopsTheJob(ctx context.Context, t *testing.T, c *cluster, repo string, env []string) {
	script := filepath.Join(c.dir, "usr1.py")
	if err := os.WriteFile(script, []byte(usr1Worker), 0o644); err != nil {
		t.Fatal(err)
	}
	env = append(env, fmt.Sprintf("RDZV_PORT=%d", freePort(t)), "STOP_TIMEOUT=2s",
		"DDP_AGENT_ARGS=--signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1")
	id, outPath := c.sbatch(ctx, t, env, "--nodes=1", "--chdir="+repo, "--time=5",
		filepath.Join(repo, "deploy/slurm/ddp-agent.sbatch"), script)
	waitFor(ctx, t, 60*time.Second, "job "+id+"'s workers to wait for SIGUSR1", func() (bool, string) {
		data, _ := os.ReadFile(outPath)
		return strings.Contains(string(data), "rank 0: waiting") && strings.Contains(string(data), "rank 1: waiting"), string(data)
	})
	if _, err := c.cmd(ctx, "scancel", "--signal=USR1", id); err != nil {
		t.Fatal(err)
	}
	state, exit := c.waitJob(ctx, t, id, 30*time.Second)
	out := readOutput(t, outPath)
	for _, want := range []string{"rank 0: SIGUSR1, checkpointing", "rank 1: SIGUSR1, checkpointing",
		`msg="agent stopped by signal"`, `signal="user defined signal 1"`, "stopped by signal 10"} {
		if !strings.Contains(out, want) {
			t.Errorf("job %s's output lacks %q:\n%s", id, want, out)
		}
	}
	if strings.Contains(out, "User defined signal 1") { // srun's word for a task killed by it
		t.Errorf("a task died of SIGUSR1 instead of its agent stopping:\n%s", out)
	}
	if state != "FAILED" || exit != "138:0" {
		t.Errorf("job %s: state %s, exit %s, want FAILED 138:0", id, state, exit)
	}
}

// prologRefusalRunsElsewhere: with n1 busy (an --exclusive job), a one-node
// job lands on n2, where a prolog check exits 3: the prolog drains n2 and
// fails, and Slurm requeues the job. With nohold_on_prolog_fail the job
// runs on n1 once n1 is free; without it, it would wait held
// (launch_failed_requeued_held) until `scontrol release`.
func prologRefusalRunsElsewhere(ctx context.Context, t *testing.T, c *cluster, repo string, env []string) {
	waitFor(ctx, t, 30*time.Second, "n1 and n2 idle", func() (bool, string) {
		out, err := c.cmd(ctx, "sinfo", "-h", "-N", "-o", "%N %T")
		return err == nil && strings.Contains(out, "n1 idle") && strings.Contains(out, "n2 idle"), out + fmt.Sprint(err)
	})
	refuse := filepath.Join(c.dir, "checks", "20-refuse-n2")
	script := "#!/bin/sh\nif [ \"$SLURM_SCRIPT_CONTEXT\" = prolog_slurmd ] && [ \"$SLURMD_NODENAME\" = n2 ]; then echo 'test: n2 refuses jobs'; exit 3; fi\necho ok\n"
	if err := os.WriteFile(refuse, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = os.Remove(refuse)
		_, _ = c.cmd(ctx, "scontrol", "update", "NodeName=n2", "State=RESUME")
	}()

	blocker, _ := c.sbatch(ctx, t, nil, "--nodes=1", "--nodelist=n1", "--exclusive", "--time=5", "--wrap=exec sleep 600")
	defer func() { _, _ = c.cmd(ctx, "scancel", blocker) }()
	waitFor(ctx, t, 30*time.Second, "job "+blocker+" to hold n1", func() (bool, string) {
		state, _, err := c.job(ctx, blocker)
		return state == "RUNNING", state + fmt.Sprint(err)
	})

	id, outPath := c.sbatch(ctx, t, nil, "--nodes=1", "--time=5", "--wrap=echo ran on $SLURMD_NODENAME")
	waitFor(ctx, t, 30*time.Second, "n2 drained by the prolog and job "+id+" requeued", func() (bool, string) {
		node, _ := c.cmd(ctx, "scontrol", "show", "node", "n2")
		job, _ := c.cmd(ctx, "scontrol", "show", "job", id)
		return strings.Contains(node, "Reason=ddp-agent: check 20-refuse-n2: test: n2 refuses jobs") &&
			strings.Contains(job, "JobState=PENDING") && !strings.Contains(job, "Restarts=0"), node + job
	})

	if _, err := c.cmd(ctx, "scancel", blocker); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, 60*time.Second, "job "+id+" to run on n1", func() (bool, string) {
		job, err := c.cmd(ctx, "scontrol", "show", "job", id)
		if strings.Contains(job, "_held") || strings.Contains(job, "Priority=0 ") {
			t.Fatalf("job %s is held after the prolog refused it on n2 (n1 is free): is nohold_on_prolog_fail set?\n%s", id, job)
		}
		state, _, _ := c.job(ctx, id)
		return state == "COMPLETED" || state == "FAILED" || state == "CANCELLED", job + fmt.Sprint(err)
	})
	job, _ := c.cmd(ctx, "scontrol", "show", "job", id)
	out := readOutput(t, outPath)
	if !strings.Contains(job, "JobState=COMPLETED") || !strings.Contains(job, " NodeList=n1") || !strings.Contains(out, "ran on n1") {
		t.Errorf("job %s: want COMPLETED on n1; output %q:\n%s", id, out, job)
	}
	if n1, _ := c.cmd(ctx, "scontrol", "show", "node", "n1"); strings.Contains(n1, "DRAIN") {
		t.Errorf("n1 drained too:\n%s", n1)
	}
}

// epilogWithoutPrologDrains: an epilog.sh installed without prolog.sh
// beside it cannot run the post-job checks: it fails, and Slurm drains the
// node ("Epilog error") rather than give it to the next job unchecked.
func epilogWithoutPrologDrains(ctx context.Context, t *testing.T, c *cluster, repo string, env []string) {
	lonely := filepath.Join(c.dir, "lonely")
	if err := os.Mkdir(lonely, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(repo, "deploy/slurm/epilog.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lonely, "epilog.sh"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	c.writeHook(t, "epilog", filepath.Join(lonely, "epilog.sh"))
	defer func() {
		c.writeHook(t, "epilog", filepath.Join(repo, "deploy/slurm/epilog.sh"))
		_, _ = c.cmd(ctx, "scontrol", "update", "NodeName=n1", "State=RESUME")
	}()
	id, _ := c.sbatch(ctx, t, nil, "--nodes=1", "--nodelist=n1", "--time=5", "--wrap=true")
	c.waitJob(ctx, t, id, 30*time.Second)
	waitFor(ctx, t, 30*time.Second, "n1 drained by the failed epilog", func() (bool, string) {
		node, _ := c.cmd(ctx, "scontrol", "show", "node", "n1")
		return strings.Contains(node, "DRAIN") && strings.Contains(node, "Reason=Epilog error"), node
	})
}
