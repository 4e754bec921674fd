package slurm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSlurm runs the scripts of this directory on a real Slurm: Debian's
// slurm-wlm and munge, slurmctld and two slurmd "nodes" on this host. It
// submits ddp-agent.sbatch with 2 nodes x 2 workers training
// examples/train.py with the comm hook to completion, scancels a second job
// mid-training and finds none of its processes left, runs sidecar.sbatch
// (the sidecar beside an unchanged srun torchrun) to completion and finds
// its socket's directory gone, and checks that the prolog and epilog ran
// their health checks on both nodes and that a node whose agent exited 3
// was drained by the epilog (the drain directory the site's, not the
// user's). Then the faults of faults_test.go: Slurm's SIGUSR1 warning with
// --signals-to-handle, a job refused by a prolog check running on the other
// node, an epilog installed without its prolog draining its node.
//
// It runs only with DDP_AGENT_DEPLOY_TESTS=1, as root, after `make build`:
//
//	deploy/slurm/testdeps.sh && DDP_AGENT_DEPLOY_TESTS=1 go test -count=1 -v ./deploy/slurm/
//
// DDP_AGENT_BIN (default bin/ddp-agent), DDP_AGENT_PYTHON (default
// /usr/bin/python3, with torch) and DDP_AGENT_TORCHRUN_COMPAT (default
// scripts/torchrun_compat.py, torchrun for Debian's torch 1.13) override
// what the jobs run.
func TestSlurm(t *testing.T) {
	if os.Getenv("DDP_AGENT_DEPLOY_TESTS") != "1" {
		t.Skip("set DDP_AGENT_DEPLOY_TESTS=1 to run Slurm (munged, slurmctld, two slurmd) on this host")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: munged, slurmd and the job steps it starts")
	}
	for _, tool := range slurmTools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: run deploy/slurm/testdeps.sh (apt-get install slurm-wlm munge)", tool)
		}
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	jobEnv := jobEnvironment(t, repo)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Second)
	defer cancel()

	start := time.Now()
	c := startCluster(ctx, t, repo)
	t.Logf("slurmctld and slurmd n1, n2 up in %v (%s)", time.Since(start).Round(time.Millisecond), c.dir)
	defer func() {
		if t.Failed() {
			t.Logf("Slurm's logs:\n%s", c.logs())
		}
	}()

	steps := []struct {
		name string
		run  func(context.Context, *testing.T, *cluster, string, []string)
	}{
		{"ddp-agent.sbatch to completion", runToCompletion},
		{"scancel leaves no process", cancelMidTraining},
		{"sidecar.sbatch to completion", sidecarToCompletion},
		{"prolog and epilog ran the checks", prologEpilogRan},
		{"exit 3 drains the node", exit3Drains},
		// One-node jobs from here: prologEpilogRan expects both nodes in
		// every job before it.
		{"SIGUSR1 with --signals-to-handle stops the job", usr1StopsTheJob},
		{"a job refused by a prolog check runs on the other node", prologRefusalRunsElsewhere},
		{"an epilog without its prolog drains the node", epilogWithoutPrologDrains},
	}
	for _, st := range steps {
		if !t.Run(st.name, func(t *testing.T) {
			begin := time.Now()
			st.run(ctx, t, c, repo, jobEnv)
			t.Logf("took %v", time.Since(begin).Round(time.Millisecond))
		}) {
			return
		}
	}
}

// jobEnvironment is what the jobs get on top of the cluster's environment:
// ddp-agent on PATH and named by DDP_AGENT_BIN, the in-tree Python package,
// the interpreter with torch, and torchrun for the sidecar's job.
func jobEnvironment(t *testing.T, repo string) []string {
	t.Helper()
	bin := os.Getenv("DDP_AGENT_BIN")
	if bin == "" {
		bin = filepath.Join(repo, "bin", "ddp-agent")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%v: run `make build` first (or set DDP_AGENT_BIN)", err)
	}
	py := os.Getenv("DDP_AGENT_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if out, err := exec.Command(py, "-c", "import torch").CombinedOutput(); err != nil {
		t.Fatalf("%s has no torch (%v: %s): run scripts/deps.sh, or set DDP_AGENT_PYTHON", py, err, out)
	}
	compat := os.Getenv("DDP_AGENT_TORCHRUN_COMPAT")
	if compat == "" {
		compat = filepath.Join(repo, "scripts", "torchrun_compat.py")
	}
	return []string{
		"PATH=" + filepath.Dir(bin) + ":" + os.Getenv("PATH"),
		"DDP_AGENT_BIN=" + bin,
		"DDP_AGENT_PYTHON=" + py,
		"PYTHONPATH=" + filepath.Join(repo, "python"),
		"TORCHRUN=" + py + " " + compat,
		"NPROC_PER_NODE=2",
	}
}

// trainArgs are examples/train.py's arguments: a few small steps on CPU.
func trainArgs(c *cluster, name string, steps int) []string {
	return []string{"examples/train.py", "--cpu", "--steps", strconv.Itoa(steps), "--batch-size", "8",
		"--warmup-steps", "1", "--log-every", "1", "--ckpt-every", "0", "--ckpt-dir", filepath.Join(c.dir, "ckpt-"+name)}
}

// submitTraining submits deploy/slurm/SCRIPT for 2 nodes running
// examples/train.py for steps steps (trainArgs); it returns the job's id
// and output file.
func submitTraining(ctx context.Context, t *testing.T, c *cluster, repo string, env []string, script, name string, steps int) (id, outPath string) {
	args := append([]string{"--nodes=2", "--chdir=" + repo, "--time=5", filepath.Join(repo, "deploy/slurm", script)},
		trainArgs(c, name, steps)...)
	return c.sbatch(ctx, t, env, args...)
}

// waitTraining waits until job id's output shows its second step.
func waitTraining(ctx context.Context, t *testing.T, id, outPath string) {
	waitFor(ctx, t, 90*time.Second, "job "+id+" to train two steps", func() (bool, string) {
		data, _ := os.ReadFile(outPath)
		return strings.Contains(string(data), "step 2 loss"), string(data)
	})
}

var paramsRE = regexp.MustCompile(`params rank=(\d+) sha256=(\w+)`)

// checkTrained checks that every rank of a 4-rank world finished with the
// same parameters.
func checkTrained(t *testing.T, out string) {
	t.Helper()
	digests := map[string]string{}
	for _, m := range paramsRE.FindAllStringSubmatch(out, -1) {
		digests[m[1]] = m[2]
	}
	for r := range 4 {
		if digests[strconv.Itoa(r)] == "" {
			t.Errorf("rank %d did not finish (no params line); got %v", r, digests)
		} else if digests[strconv.Itoa(r)] != digests["0"] {
			t.Errorf("rank %d's parameters %s differ from rank 0's %s", r, digests[strconv.Itoa(r)], digests["0"])
		}
	}
	if !strings.Contains(out, "done: steps=") {
		t.Errorf("no %q line from rank 0", "done: steps=")
	}
}

func readOutput(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the job's output: %v", err)
	}
	return string(data)
}

// runToCompletion: ddp-agent.sbatch, 2 nodes x 2 workers, the hook on.
// STOP_TIMEOUT=16s against KillWait=30 leaves the agent less than 15 s
// after it, and makes the script warn (cancelMidTraining's 5s does not).
func runToCompletion(ctx context.Context, t *testing.T, c *cluster, repo string, env []string) {
	env = append(env, fmt.Sprintf("RDZV_PORT=%d", freePort(t)), "STOP_TIMEOUT=16s")
	id, outPath := submitTraining(ctx, t, c, repo, env, "ddp-agent.sbatch", "complete", 4)
	state, exit := c.waitJob(ctx, t, id, 120*time.Second)
	out := readOutput(t, outPath)
	if state != "COMPLETED" || exit != "0:0" {
		t.Fatalf("job %s: state %s, exit %s, want COMPLETED 0:0; output:\n%s", id, state, exit, out)
	}
	checkTrained(t, out)
	for _, want := range []string{"comm hook: ddp-agent", "world_size=4", "job " + id + " finished",
		"STOP_TIMEOUT=16s leaves less than 15s before KillWait=30s"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "all workers succeeded"); n != 2 {
		t.Errorf("%d agents said 'all workers succeeded', want 2:\n%s", n, out)
	}
}

// cancelMidTraining: a long job, scancelled once it trains; then no process
// of it may be left, and both agents must have stopped on their own
// (SIGTERM, exit 143) rather than by Slurm's SIGKILL after KillWait.
func cancelMidTraining(ctx context.Context, t *testing.T, c *cluster, repo string, env []string) {
	env = append(env, fmt.Sprintf("RDZV_PORT=%d", freePort(t)), "STOP_TIMEOUT=5s")
	marker := filepath.Join(c.dir, "ckpt-cancel-marker")
	id, outPath := submitTraining(ctx, t, c, repo, env, "ddp-agent.sbatch", "cancel-marker", 100000)
	waitTraining(ctx, t, id, outPath)
	running := processesWithEnv("SLURM_JOB_ID=" + id)
	var agents, workers int
	for _, p := range running {
		switch {
		case len(p.argv) > 1 && filepath.Base(p.argv[0]) == "ddp-agent" && p.argv[1] == "run":
			agents++
		case strings.HasPrefix(filepath.Base(p.argv[0]), "python") && slices.Contains(p.argv, marker):
			workers++
		}
	}
	if agents != 2 || workers != 4 {
		t.Fatalf("before scancel: %d agents and %d workers of job %s in /proc, want 2 and 4: %v", agents, workers, id, running)
	}

	begin := time.Now()
	if _, err := c.cmd(ctx, "scancel", id); err != nil {
		t.Fatal(err)
	}
	state, _ := c.waitJob(ctx, t, id, 45*time.Second)
	ended := time.Since(begin)
	if state != "CANCELLED" {
		t.Errorf("job %s: state %s after scancel, want CANCELLED", id, state)
	}
	left := append(processesWithEnv("SLURM_JOB_ID="+id), processesWithEnv(marker)...)
	if len(left) > 0 {
		t.Errorf("%d processes of job %s left %v after scancel (job ended in %v): %v", len(left), id, ended.Round(time.Millisecond), state, left)
	}
	out := readOutput(t, outPath)
	if n := strings.Count(out, "agent stopped by signal"); n != 2 {
		t.Errorf("%d agents said 'agent stopped by signal', want 2 (the others were SIGKILLed?):\n%s", n, out)
	}
	if strings.Contains(out, "STOP_TIMEOUT=5s leaves") {
		t.Errorf("STOP_TIMEOUT=5s, 25 s before KillWait=30, warned:\n%s", out)
	}
	t.Logf("scancel to job %s ended, %d processes gone: %v", id, len(running), ended.Round(time.Millisecond))
}

// sidecarToCompletion: sidecar.sbatch, the sidecar on both nodes beside
// srun torchrun, each watching its node's ranks, then stopped cleanly.
func sidecarToCompletion(ctx context.Context, t *testing.T, c *cluster, repo string, env []string) {
	env = append(env, fmt.Sprintf("RDZV_PORT=%d", freePort(t)))
	id, outPath := submitTraining(ctx, t, c, repo, env, "sidecar.sbatch", "sidecar", 4)
	state, exit := c.waitJob(ctx, t, id, 120*time.Second)
	out := readOutput(t, outPath)
	if state != "COMPLETED" || exit != "0:0" {
		t.Fatalf("job %s: state %s, exit %s, want COMPLETED 0:0; output:\n%s", id, state, exit, out)
	}
	checkTrained(t, out)
	for _, want := range []string{"sidecar serving", "watching a new job", "job closed", "sidecar stopped"} {
		if n := strings.Count(out, want); n != 2 {
			t.Errorf("%d sidecars said %q, want 2:\n%s", n, want, out)
		}
	}
	// The socket's directory, with the workers' stacks/<job>/ in it, goes
	// with the sidecar's task: by the job's end it is gone on both nodes.
	for _, node := range []string{"n1", "n2"} {
		dir := fmt.Sprintf("/tmp/ddp-agent-%s.%s", id, node)
		if _, err := os.Lstat(dir); !os.IsNotExist(err) {
			left, _ := exec.Command("find", dir).CombinedOutput()
			t.Errorf("%s left after the job (%v):\n%s", dir, err, left)
		}
	}
}

// prologEpilogRan: the record check ran in the prolog and the epilog of
// every job on both nodes.
func prologEpilogRan(ctx context.Context, t *testing.T, c *cluster, repo string, env []string) {
	data, err := os.ReadFile(filepath.Join(c.dir, "checks.log"))
	if err != nil {
		t.Fatalf("no check ran: %v", err)
	}
	log := string(data)
	ids, err := c.cmd(ctx, "squeue", "-h", "-t", "all", "-o", "%i")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range strings.Fields(ids) {
		for _, want := range []string{"prolog_slurmd " + id + " n1", "prolog_slurmd " + id + " n2", "epilog_slurmd " + id + " n1", "epilog_slurmd " + id + " n2"} {
			if !strings.Contains(log, want) {
				t.Errorf("checks.log lacks %q:\n%s", want, log)
			}
		}
	}
}

// exit3Drains: an exec health check that starts exiting 3 on n2 while the
// job trains makes n2's agent leave with exit 3; the epilog drains n2 with
// a reason. The user's environment names a drain directory of its own, but
// the site's settings file names another, which the epilog reads: the
// job's note must land in the site's. n2 is resumed after.
func exit3Drains(ctx context.Context, t *testing.T, c *cluster, repo string, env []string) {
	check, trigger := filepath.Join(c.dir, "drain-n2.sh"), filepath.Join(c.dir, "n2-breaks")
	script := fmt.Sprintf("#!/bin/sh\nif [ \"$SLURMD_NODENAME\" = n2 ] && [ -e %s ]; then echo 'test: n2 is broken'; exit 3; fi\necho ok\n", trigger)
	if err := os.WriteFile(check, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	userDrain := filepath.Join(c.dir, "user-drain")
	if err := os.Mkdir(userDrain, 0o755); err != nil {
		t.Fatal(err)
	}
	env = append(env, fmt.Sprintf("RDZV_PORT=%d", freePort(t)), "STOP_TIMEOUT=5s",
		"DDP_AGENT_DRAIN_DIR="+userDrain,
		"DDP_AGENT_ARGS=--plugin exec,command="+check+",interval=1s")
	id, outPath := submitTraining(ctx, t, c, repo, env, "ddp-agent.sbatch", "drain", 100000)
	defer func() { _, _ = c.cmd(ctx, "scontrol", "update", "NodeName=n2", "State=RESUME") }()
	waitTraining(ctx, t, id, outPath)
	if err := os.WriteFile(trigger, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	state, _ := c.waitJob(ctx, t, id, 60*time.Second)
	out := readOutput(t, outPath)
	if state != "FAILED" || !strings.Contains(out, "srun: error: n2: task 1: Exited with exit code 3") {
		t.Fatalf("job %s: state %s, want FAILED with n2's task exiting 3; output:\n%s", id, state, out)
	}
	waitFor(ctx, t, 10*time.Second, "n2 drained", func() (bool, string) {
		node, _ := c.cmd(ctx, "scontrol", "show", "node", "n2")
		return strings.Contains(node, "DRAIN") && strings.Contains(node, "Reason=ddp-agent"), node
	})
	if n1, _ := c.cmd(ctx, "scontrol", "show", "node", "n1"); strings.Contains(n1, "DRAIN") {
		t.Errorf("n1 drained too:\n%s", n1)
	}
	if left, _ := os.ReadDir(userDrain); len(left) > 0 {
		t.Errorf("a note in the user's DDP_AGENT_DRAIN_DIR, which the epilog does not read: %v", left)
	}
}
