package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestInProcessRecovery: under ddp-agent run, train.py --in-process
// (ddp_agent.InProcess) keeps every worker's process when rank 0 or rank 1
// raises: the agent starts its workers once and restarts nobody, the ranks
// re-form the process group and the hook's communicator in place, the
// failed step is retried, and the parameters end as an uninterrupted run's.
// Each rank tells the agent once its resumed step completed, and the
// agent logs it with the phases' times.
func TestInProcessRecovery(t *testing.T) {
	budgetAlongside(t, 40*time.Second)
	needTorch(t)
	train := func(name string, extra ...string) *agentRun {
		args := append([]string{"--max-restarts", "0"}, hookTrainArgs(trainPy(), "--steps", "14", "--log-every", "7",
			"--ckpt-dir", filepath.Join(t.TempDir(), name), "--in-process")...)
		r := startAgent(t, nil, append(args, extra...)...)
		if code := r.wait(2 * time.Minute); code != 0 {
			t.Fatalf("%s: exit code %d, want 0\n%s", name, code, r.logs())
		}
		return r
	}
	want := checkSameDigests(t, train("uninterrupted").stdout.String(), "")[0]
	reformed := regexp.MustCompile(`re-formed in process, re-formation 1: rank \d's step 9 failed .*; resuming at step 9 with rank (\d)'s state`)
	told := regexp.MustCompile(`msg="re-formed in process: the workers kept their processes" component=ddp-agent rank=(\d) generation=0 reform=1 step=9 resume=9 source=\d lost_steps=1 took=\S+ abort=\S+ rendezvous=\S+ process_group=\S+ state=\S+ first_step=\S+ error=`)
	for _, rank := range []int{0, 1} {
		r := train(fmt.Sprintf("rank%d", rank), "--fail-rank", fmt.Sprint(rank), "--fail-at-step", "9")
		out, logs := r.stdout.String()+r.stderr.String(), r.logs()
		if !strings.Contains(out, fmt.Sprintf("injected failure on rank %d at step 9", rank)) {
			t.Fatalf("rank %d: no injected failure\n%s", rank, logs)
		}
		if n := len(reformed.FindAllString(out, -1)); n != 2 {
			t.Fatalf("rank %d: %d ranks logged the re-formation, want 2\n%s", rank, n, logs)
		}
		if n := strings.Count(r.stderr.String(), `msg="workers started"`); n != 1 || strings.Contains(r.stderr.String(), "restarting worker group") {
			t.Fatalf("rank %d: workers started %d times, want once and no restart\n%s", rank, n, logs)
		}
		if m := told.FindAllStringSubmatch(r.stderr.String(), -1); len(m) != 2 || m[0][1] == m[1][1] {
			t.Fatalf("rank %d: the agent logged %d reports of the re-formation, want one of each rank\n%s", rank, len(m), logs)
		}
		if got := checkSameDigests(t, out, logs)[0]; got != want {
			t.Fatalf("rank %d: params %s after the re-formation, %s uninterrupted: want equal\n%s", rank, got, want, logs)
		}
	}
}

// TestWarmSpare: with --spares 1, a worker SIGKILLed mid-training, or one
// that hangs (killed by the agent once its hang is reported), is replaced
// by the warm spare the agent started beside the workers. The survivor
// keeps its process and re-forms in process with the spare, which takes
// the state from it and trains from the retried step: the workers start
// once and nobody restarts. Rank 0 too: under --spares the agent serves
// the workers' store in a process of its own, which outlives rank 0. The
// parameters end as an uninterrupted run's, an LR scheduler's count taken
// from the survivor too.
func TestWarmSpare(t *testing.T) {
	budgetAlongside(t, 80*time.Second) // four jobs
	needTorch(t)
	train := func(name string, agentFlags []string, fault ...string) *agentRun {
		// The package installed, as a spare's first import needs it.
		pythonPath := []string{"PYTHONPATH=" + filepath.Join(repoRoot, "python")}
		r := startAgent(t, pythonPath, append(append([]string{"--spares", "1", "--max-restarts", "0"}, agentFlags...),
			// --lr-step: a spare whose scheduler counted from 0 ended with
			// other parameters than the survivor's (InProcess's state=).
			hookTrainArgs(append([]string{trainPy(), "--steps", "14", "--log-every", "7", "--ckpt-every", "0",
				"--lr-step", "5", "--in-process"}, fault...)...)...)...)
		if code := r.wait(2 * time.Minute); code != 0 {
			t.Fatalf("%s: exit code %d, want 0\n%s", name, code, r.logs())
		}
		return r
	}
	replaced := func(name string, dead int, r *agentRun, why *regexp.Regexp) string {
		out, agentLog, logs := r.stdout.String()+r.stderr.String(), r.stderr.String(), r.logs()
		peer := 1 - dead
		died := regexp.MustCompile(fmt.Sprintf(`msg="worker died: a warm spare takes its rank, the other workers keep their processes and re-form in process" component=ddp-agent rank=%d local_rank=%d pid=\d+ signal=killed spare_pid=\d+`, dead, dead))
		told := regexp.MustCompile(fmt.Sprintf(`time=(\S+) level=INFO msg="re-formed in process: the workers kept their processes" component=ddp-agent rank=%d generation=0 reform=1 step=9 resume=9 source=%d `, peer, peer))
		w, tm := why.FindStringSubmatch(agentLog), told.FindStringSubmatch(agentLog)
		switch {
		case w == nil || !died.MatchString(agentLog):
			t.Fatalf("%s: the agent did not give rank %d to the warm spare\n%s", name, dead, logs)
		case !strings.Contains(out, fmt.Sprintf("rank %d joined re-formation 1 in process as a warm spare: resuming at step 9 with rank %d's state", dead, peer)):
			t.Fatalf("%s: the spare did not log joining the re-formation\n%s", name, logs)
		case tm == nil:
			t.Fatalf("%s: the agent did not log rank %d's report of the re-formation\n%s", name, peer, logs)
		case strings.Count(agentLog, `msg="workers started"`) != 1 || strings.Contains(agentLog, "restarting worker group"):
			t.Fatalf("%s: the workers started more than once, or restarted\n%s", name, logs)
		}
		t0, _ := time.Parse(time.RFC3339Nano, w[1])
		t1, _ := time.Parse(time.RFC3339Nano, tm[1])
		// From the fault's notice (the death's reaping, the hang's
		// report) to the survivor's report that the retried step
		// completed with the spare: loose here (a loaded CI machine),
		// about 0.4 s on an idle 2-core VM.
		if took := t1.Sub(t0); took <= 0 || took > 20*time.Second {
			t.Fatalf("%s: the fault to the retried step's completion took %v\n%s", name, took, logs)
		} else {
			t.Logf("%s: the retried step completed with the spare %v after the agent noticed", name, took)
		}
		return checkSameDigests(t, out, logs)[0]
	}
	diedNotice := regexp.MustCompile(`time=(\S+) level=WARN msg="worker died: a warm spare takes its rank`)

	killed := replaced("SIGKILL", 1, train("rank1", nil, "--fail-rank", "1", "--fail-at-step", "9", "--fail-signal", "KILL"),
		diedNotice)
	hung := replaced("hang", 1, train("hang", []string{"--hang-timeout", "3"}, "--hang-rank", "1", "--hang-at-step", "9"),
		regexp.MustCompile(`time=(\S+) level=WARN msg="hang: killing the ranks that never arrived, for warm spares to take; the others keep their processes" component=ddp-agent ranks=\[1\]`))
	r := train("rank0", nil, "--fail-rank", "0", "--fail-at-step", "9", "--fail-signal", "KILL")
	if !strings.Contains(r.stderr.String(), `msg="job store started"`) {
		t.Fatalf("rank 0's death: want the agent to serve the workers' store\n%s", r.logs())
	}
	rank0 := replaced("rank 0 SIGKILL", 0, r, diedNotice)

	r = train("uninterrupted", nil)
	if want := checkSameDigests(t, r.stdout.String(), r.logs())[0]; killed != want || hung != want || rank0 != want {
		t.Fatalf("params %s after the spare took a killed rank 1, %s a hung one, %s a killed rank 0, %s uninterrupted: want equal\n%s",
			killed, hung, rank0, want, r.logs())
	}
}

// TestSpareWithoutInProcess: --spares with a script that does not use
// ddp_agent.InProcess. Rank 0 is SIGKILLed, a spare takes its rank and
// starts the script again from its top, and rank 1, which cannot re-form,
// fails; the agent then stops the spare. The root cause is rank 0's death
// by SIGKILL, with a word on the spare the others never re-formed with.
// Before, it was the spare, "killed by signal 15", the agent's own stop.
func TestSpareWithoutInProcess(t *testing.T) {
	budgetAlongside(t, 20*time.Second)
	needTorch(t)
	r := startAgent(t, []string{"PYTHONPATH=" + filepath.Join(repoRoot, "python")}, append([]string{"--spares", "1", "--max-restarts", "0"},
		hookTrainArgs(trainPy(), "--steps", "30", "--log-every", "10", "--ckpt-every", "0", "--fail-rank", "0", "--fail-at-step", "5",
			"--fail-signal", "KILL")...)...)
	if code := r.wait(2 * time.Minute); code != 1 {
		t.Fatalf("exit code %d, want 1\n%s", code, r.logs())
	}
	reports := rootCauseReports(r.stderr.String())
	root := regexp.MustCompile(`^  worker rank 0 \(local rank 0, pid \d+\) killed by signal 9 \(killed\), \S+ after start\n` +
		`  a warm spare \(pid \d+\) took its rank, and the other workers never re-formed with it`)
	if len(reports) != 1 || !root.MatchString(reports[0]) {
		t.Fatalf("want one report naming rank 0's SIGKILL and the spare that took its rank, got %q\n%s", reports, r.logs())
	}
	if !strings.Contains(r.stderr.String(), "msg=\"worker died: a warm spare takes its rank") {
		t.Fatalf("no spare took rank 0\n%s", r.logs())
	}
}

// TestWarmSpareHangOnAnotherNode: two nodes under --spares 1, rank 3 (the
// second node's) hangs before its backward. The leader finds the hang,
// sees every rank that never arrived on the other node and leaves it to
// that node's agent, which kills rank 3 for its spare: the spare joins the
// survivors, on both nodes, in process. Nobody restarts, and every rank
// ends with the same parameters. The job's store runs on the first node,
// and every worker of both is its client.
func TestWarmSpareHangOnAnotherNode(t *testing.T) {
	budgetAlongside(t, 60*time.Second)
	needTorch(t)
	j := newJob(t, "2", 0, 12, "--batch-size", "4", "--in-process", "--ckpt-every", "0", "--hang-rank", "3",
		"--hang-at-step", "7")
	j.args = append(j.args, "--hang-timeout", "4s", "--spares", "1")
	j.env = []string{"PYTHONPATH=" + filepath.Join(repoRoot, "python")}
	a := j.startHost()
	b := j.start()
	for _, r := range []*agentRun{a, b} {
		if code := r.wait(3 * time.Minute); code != 0 {
			t.Fatalf("exit code %d\n%s\n%s", code, a.logs(), b.logs())
		}
	}
	logs := a.logs() + "\n----\n" + b.logs()
	leader, follower := a, b
	if strings.Contains(b.stderr.String(), `msg="hang: the ranks that never arrived run on another node`) {
		leader, follower = b, a
	}
	switch out := a.stdout.String() + a.stderr.String() + b.stdout.String() + b.stderr.String(); {
	case !regexp.MustCompile(`msg="hang: the ranks that never arrived run on another node, whose agent kills them for its warm spares; the others keep their processes" component=ddp-agent ranks=\[3\]`).MatchString(leader.stderr.String()):
		t.Fatalf("the leader did not leave the hang to the other node\n%s", logs)
	case !strings.Contains(follower.stderr.String(), `msg="hang: killing the ranks that never arrived, for warm spares to take; the others keep their processes" component=ddp-agent ranks=[3]`):
		t.Fatalf("the other node did not kill rank 3 for its spare\n%s", logs)
	case !strings.Contains(out, "rank 3 joined re-formation 1 in process as a warm spare: resuming at step 7"):
		t.Fatalf("the spare did not join the survivors\n%s", logs)
	case !strings.Contains(leader.stderr.String(), `msg="job store started"`) || strings.Contains(follower.stderr.String(), `msg="job store started"`):
		t.Fatalf("want the store served on the first node only\n%s", logs)
	}
	for _, r := range []*agentRun{a, b} {
		if e := r.stderr.String(); strings.Count(e, `msg="workers started"`) != 1 || strings.Contains(e, "restarting worker group") {
			t.Fatalf("workers started more than once, or restarted\n%s", logs)
		}
	}
	d := paramDigests(a.stdout.String() + b.stdout.String())
	if len(d) != 4 || d[0] == "" || d[0] != d[1] || d[0] != d[2] || d[0] != d[3] {
		t.Fatalf("params digests %v, want ranks 0-3 equal\n%s", d, logs)
	}
}

// TestLostNodeShrinksInProcess: three nodes under --spares 1, the third
// agent SIGKILLed (its workers die with it). The other two agents keep
// their workers through the rendezvous and move them into the world of 4:
// the workers, waiting in their re-formation for the lost ranks, read
// their new ranks from the world file and re-form there in process.
// Nobody restarts, no checkpoint is read, at most one step is lost, and
// every rank ends with the same parameters.
//
// The script runs no collective of its own (no checkpoint barrier, no
// loss all-reduce) until its last step: a rank in a gloo collective with
// a survivor that left it for the re-formation waits out gloo's timeout
// (docs/in-process.md, limits).
func TestLostNodeShrinksInProcess(t *testing.T) {
	budget(t, 80*time.Second)
	shrinkInProcess(t, false)
}

// TestLostStoreNodeShrinksInProcess: the same with the node lost that
// serves the workers' store (group rank 0's, the first host, whose agent
// also started the rendezvous store). The survivors' workers find their
// store gone in their re-formation and wait for the world file; the
// survivor that becomes group rank 0 has its warm spare serve a new
// store, and the world file moves every worker to it, in process.
func TestLostStoreNodeShrinksInProcess(t *testing.T) {
	budget(t, 80*time.Second)
	a, b := shrinkInProcess(t, true)
	errs := a.stderr.String() + b.stderr.String()
	// One warm spare of that survivor serves it: it has imported torch.
	if n := regexp.MustCompile(`msg="warm spares: the node that served the workers' store left; this node serves the new generation's".* from_spare=true`).FindAllString(errs, -1); len(n) != 1 {
		t.Fatalf("%d survivors had a spare serve the new generation's store, want 1\n%s\n----\n%s", len(n), a.logs(), b.logs())
	}
	if n := strings.Count(errs, "moved to the workers' new store at 127.0.0.1:"); n != 4 {
		t.Fatalf("%d workers moved to the new store, want the 4 survivors\n%s\n----\n%s", n, a.logs(), b.logs())
	}
}

// shrinkInProcess runs three nodes of two workers under --spares 1 and
// SIGKILLs one agent once every rank completed step 10: the one serving
// the workers' store (store), or another. It checks that the other two
// carried their workers into the world of 4 in process (checkCarried),
// retried at most the step in progress, and finished within a loose
// bound; it returns the two.
func shrinkInProcess(t *testing.T, store bool) (*agentRun, *agentRun) {
	j, steps := carryJob(t, "1:3", 30)
	j.allJoin()
	all := []*agentRun{j.startHost(), j.start(), j.start()}
	logs := func() string { return all[0].logs() + "\n----\n" + all[1].logs() + "\n----\n" + all[2].logs() }
	waitFor(t, 2*time.Minute, func() bool { return lastStep(steps, 6) >= 10 }, logs)
	checkWorld(t, 6, all...)
	// Group rank 0's agent serves the workers' store.
	var victim *agentRun
	var others []*agentRun
	for _, a := range all {
		if serves := strings.Contains(a.stderr.String(), `msg="job store started"`); serves == store && victim == nil {
			victim = a
		} else {
			others = append(others, a)
		}
	}
	if victim == nil || len(others) != 2 {
		t.Fatalf("no agent to kill (store %v)\n%s", store, logs())
	}
	if victim == all[0] {
		// The first host started the rendezvous store: wait for it to have
		// its three members, as it does within seconds of the agents' start.
		waitFor(t, 30*time.Second, func() bool {
			return strings.Count(all[1].stderr.String()+all[2].stderr.String(), "joined the rendezvous store as a member") == 2
		}, logs)
	}
	done := lastStep(steps, 6) // every rank completed it before the kill
	hit := time.Now()
	victim.cmd.Process.Signal(syscall.SIGKILL)
	a, b := others[0], others[1]
	waitAll(t, 3*time.Minute, a, b)
	logs = func() string { return a.logs() + "\n----\n" + b.logs() }
	checkCarried(t, []*agentRun{a, b}, []*agentRun{a, b}, 30, 4, logs)
	errs := a.stderr.String() + b.stderr.String()
	m := regexp.MustCompile(`msg="re-formed in process: the workers kept their processes".* resume=(\d+) `).FindStringSubmatch(errs)
	if m == nil {
		t.Fatalf("no re-formation reported to the agents\n%s", logs())
	}
	// The step retried is at least the next after the last that every rank
	// had completed before the kill, and at most one past the last that
	// any rank logged in the world of 6: no step completed is redone, none
	// skipped. The second bound is read after the fact: the workers go on
	// between the test's read of the log and the SIGKILL's effect, steps
	// of 0.2 s, which a loaded machine can outlast (a CI run resumed at
	// 13 with 10 read before the kill).
	lo, hi := stepsIn(steps, 6, 6)
	if resume, _ := strconv.Atoi(m[1]); resume < max(done, lo)+1 || resume > hi+1 {
		t.Fatalf("resumed at step %d, with step %d completed everywhere before the kill, steps %d-%d the last logged in the world of 6\n%s", resume, done, lo, hi, logs())
	}
	// Loosely: 0.7-0.8 s on the idle VM; a restart's figure is 4-5 s,
	// torchrun's 40-50 s (docs/in-process.md).
	if at, ok := firstStepOf(steps, 4, hit); !ok || at.Sub(hit) > 20*time.Second {
		t.Fatalf("no step completed by every rank of the world of 4 within 20 s of the kill (%v)\n%s", at.Sub(hit), logs())
	} else {
		t.Logf("the SIGKILL to a step completed by every rank of the world of 4: %v", at.Sub(hit).Round(time.Millisecond))
	}
	return a, b
}

// carryJob is a job of nnodes nodes under --spares 1 whose train.py
// --in-process runs steps steps, paced, with no collective of its own
// until its last step, and logs each step to the file it returns. Its
// --max-restarts is 0: a node lost, or joining, that the workers carry on
// past is no restart (a lost node failed such a job, with restarts to
// spare only).
func carryJob(t *testing.T, nnodes string, steps int) (*job, string) {
	needTorch(t)
	j := newJob(t, nnodes, 0, steps, "--sleep-per-step", "0.1", "--in-process", "--ckpt-every", "0", "--log-every", "1000")
	j.args = append(j.args, "--spares", "1")
	log := filepath.Join(t.TempDir(), "steps.jsonl")
	j.env = []string{"PYTHONPATH=" + filepath.Join(repoRoot, "python"), "TRAIN_STEP_LOG=" + log}
	return j, log
}

// checkCarried checks a job whose nodes changed under --spares: the agents
// kept (the last generation's) kept their workers and carried them on
// into the new world, started once and never restarted; no checkpoint was
// read; the job finished steps in a world of world ranks, all of them
// (on all, the agents of the new generation) with the same parameters.
func checkCarried(t *testing.T, kept, all []*agentRun, steps, world int, logs func() string) {
	t.Helper()
	var out, errs strings.Builder
	for _, r := range all {
		out.WriteString(r.stdout.String())
	}
	for _, r := range kept {
		errs.WriteString(r.stderr.String())
		if e := r.stderr.String(); strings.Count(e, `msg="workers started"`) != 1 || strings.Contains(e, "restarting worker group") {
			t.Fatalf("workers started more than once, or restarted\n%s", logs())
		}
	}
	switch o, e := out.String(), errs.String(); {
	case strings.Count(e, `msg="warm spares: the job's nodes changed; the workers keep their processes`) != len(kept):
		t.Fatalf("want every agent of the last generation to keep its workers\n%s", logs())
	case strings.Count(e, `msg="workers carry on in process into the new generation"`) != len(kept):
		t.Fatalf("want every kept group of workers to carry on into the new generation\n%s", logs())
	case strings.Contains(o, "resumed from step"):
		t.Fatalf("a checkpoint was read\n%s", logs())
	case !strings.Contains(o, fmt.Sprintf("done: steps=%d", steps)) || !strings.Contains(o, fmt.Sprintf("world_size=%d", world)):
		t.Fatalf("training did not finish in a world of %d\n%s", world, logs())
	}
	d := paramDigests(out.String())
	for r := range world {
		if len(d) != world || d[r] != d[0] || d[0] == "" {
			t.Fatalf("params digests %v, want ranks 0-%d equal\n%s", d, world-1, logs())
		}
	}
}

// TestLateNodeJoinsInProcess: two nodes under --spares 1 train; a third
// joins. The first two agents keep their workers through the rescale and
// move them into the world of 6; the third starts its workers warm before
// it joins the rendezvous, and gives them their ranks to join the others'
// re-formation, with the state of a healthy peer. Nobody restarts, no
// checkpoint is read, and all six ranks end with the same parameters.
func TestLateNodeJoinsInProcess(t *testing.T) {
	budget(t, 80*time.Second)
	// The first two are held before step 10 until the third's workers have
	// imported torch (23 s in a CI run, under the suite's load) and it is
	// about to join: it then joins while they train, with 70 steps to go.
	h := startHeld(t, 80, "--hold-in-loop")
	a, b, steps := h.a, h.b, h.steps
	logs := func() string { return a.logs() + "\n----\n" + b.logs() }
	waitFor(t, 2*time.Minute, func() bool { return lastStep(steps, 4) >= 9 }, logs)
	c := h.start()
	logs = func() string { return a.logs() + "\n----\n" + b.logs() + "\n----\n" + c.logs() }
	waitFor(t, 2*time.Minute, func() bool {
		return strings.Contains(c.stderr.String(), `msg="workers started warm, before this node joins the running job" component=ddp-agent ready=2 nproc=2`)
	}, logs)
	released := h.release()
	waitAll(t, 3*time.Minute, a, b, c)
	checkCarried(t, []*agentRun{a, b}, []*agentRun{a, b, c}, 80, 6, logs)
	switch e := c.stderr.String(); {
	case !strings.Contains(e, `msg="warm spares: the other nodes' workers carry on from the last generation in process; these start to join their re-formation"`):
		t.Fatalf("the new node's workers did not start to join\n%s", logs())
	case strings.Count(e, "joined re-formation 1 in process as a new worker") != 2:
		t.Fatalf("want the new node's two workers to join in process\n%s", logs())
	case !strings.Contains(a.stderr.String(), `msg="workers start warm while this node joins the rendezvous"`):
		// The job's start does not wait for the imports: the nodes join
		// the first round as they start, not as their imports end.
		t.Fatalf("the first node waited for its workers' imports to join the job's first round\n%s", logs())
	case strings.Count(e, "(local rank 0, join)")+strings.Count(e, "(local rank 1, join)") != 2:
		t.Fatalf("want the two warm workers given their ranks to join\n%s", logs())
	}
	// Loosely: the third node joins as the hold ends, and the first four
	// re-form with its two.
	if at, ok := firstStepOf(steps, 6, released); !ok || at.Sub(released) > 30*time.Second {
		t.Fatalf("no step completed by every rank of the world of 6 within 30 s of the hold's end (%v)\n%s",
			at.Sub(released), logs())
	} else {
		t.Logf("the hold's end, as the third node joins, to a step completed by every rank of the world of 6: %v",
			at.Sub(released).Round(time.Millisecond))
	}
}

// TestNodeJoinsWhileWorkersStart: a third node joins while the first two
// nodes' workers are still starting (held after init_process_group, before
// InProcess opens their communicators), and the agents move them into the
// world of 6 before they reach it. Their first open finds the agent's
// generation moved on, and they re-form in process as after a failed step
// (step 0), with the new node's workers: nobody restarts. Before, that
// open's error ended the workers, and the job restarted (a CI run, where a
// node joined seconds after the job's start).
func TestNodeJoinsWhileWorkersStart(t *testing.T) {
	budget(t, 80*time.Second)
	h := startHeld(t, 20, "--hold-before-loop")
	a, b := h.a, h.b
	logs := func() string { return a.logs() + "\n----\n" + b.logs() }
	waitFor(t, 2*time.Minute, func() bool {
		return len(ranksSeen(a.stdout.String())[4])+len(ranksSeen(b.stdout.String())[4]) == 4
	}, logs)
	c := h.start()
	logs = func() string { return a.logs() + "\n----\n" + b.logs() + "\n----\n" + c.logs() }
	h.releaseMoved(c, logs)
	waitAll(t, 3*time.Minute, a, b, c)
	checkCarried(t, []*agentRun{a, b}, []*agentRun{a, b, c}, 20, 6, logs)
	if n := regexp.MustCompile(`re-formed in process, re-formation 1: rank \d's step 0 failed \(ShimError: `).FindAllString(a.stderr.String()+b.stderr.String(), -1); len(n) != 4 {
		t.Fatalf("%d of the first four workers re-formed from their first open, want 4\n%s", len(n), logs())
	}
	if n := strings.Count(c.stderr.String(), "joined re-formation 1 in process as a new worker"); n != 2 {
		t.Fatalf("%d of the new node's workers joined in process, want 2\n%s", n, logs())
	}
}

// TestNodeJoinsAsJobEnds: a third node joins as the first two nodes'
// workers finish (held after their training loop until the agents have
// moved them into the world of 6). They complete the job without
// re-forming, and their store goes with them: the new node's workers,
// started to join them, fail on it. The job finished without that node,
// and its agent says so and exits 0, as the others do. Before, it
// restarted its workers and waited out the join timeout, to exit 1.
func TestNodeJoinsAsJobEnds(t *testing.T) {
	budget(t, 60*time.Second)
	c, logs := joinAsJobEnds(t)
	// Its workers failed on the others' store: the fault that ended them
	// is theirs, not the watch's (TestJoinedWorkersNeverConnect).
	if strings.Contains(c.stderr.String(), watchFault) {
		t.Fatalf("the new node's workers did not fail on the others' store\n%s", logs())
	}
}

// TestJoinedWorkersNeverConnect: the same, with the new node's workers
// held before init_process_group, so they never reach the others' store
// and fail on nothing (as a client that never connected waits out its
// 60 s timeout). The agent's own watch of the store's done markers finds
// the other nodes done, gives its workers othersDoneWait to end, and ends
// the attempt: the job finished without this node, and it exits 0.
func TestJoinedWorkersNeverConnect(t *testing.T) {
	budgetAlongside(t, 60*time.Second)
	never := filepath.Join(t.TempDir(), "never")
	c, logs := joinAsJobEnds(t, "--hold-before-init", never)
	if !strings.Contains(c.stderr.String(), watchFault) {
		t.Fatalf("the agent's watch did not end the new node's attempt\n%s", logs())
	}
	if strings.Contains(c.stdout.String()+c.stderr.String(), "moved to the workers' new store") || strings.Contains(c.stderr.String(), "joined re-formation") {
		t.Fatalf("the new node's workers went past their hold\n%s", logs())
	}
}

// watchFault is the fault the agent's watch reports (watchOthersDone), as
// its log line gives it.
const watchFault = `fault="the other nodes' workers finished the job before this node's joined them"`

// joinAsJobEnds runs the jobs of TestNodeJoinsAsJobEnds: a third node
// joins, with script the extra arguments of its train.py, as the first
// two nodes' workers finish. It checks that every agent exits 0, the
// first two having completed the job, and that the third says the job
// finished without it, its workers never restarted; it returns the third.
func joinAsJobEnds(t *testing.T, script ...string) (*agentRun, func() string) {
	h := startHeld(t, 10, "--hold-after-loop")
	a, b := h.a, h.b
	logs := func() string { return a.logs() + "\n----\n" + b.logs() }
	waitFor(t, 2*time.Minute, func() bool { return lastStep(h.steps, 4) >= 10 }, logs)
	third := *h.job
	third.script = append(slices.Clone(h.script), script...)
	c := third.start()
	logs = func() string { return a.logs() + "\n----\n" + b.logs() + "\n----\n" + c.logs() }
	h.releaseMoved(c, logs)
	for _, r := range []*agentRun{a, b, c} {
		if code := r.waitHint(time.Minute, "(the job ends within seconds of the hold's end)"); code != 0 {
			t.Fatalf("an agent exited %d, want 0\n%s", code, logs())
		}
	}
	switch e := c.stderr.String(); {
	case !strings.Contains(e, `msg="the job finished without this node: the other nodes' workers completed it before this node's joined them"`):
		t.Fatalf("the new node did not say the job finished without it\n%s", logs())
	case strings.Contains(e, "restarting worker group"):
		t.Fatalf("the new node restarted its workers\n%s", logs())
	}
	if !strings.Contains(a.stdout.String()+b.stdout.String(), "done: steps=10") {
		t.Fatalf("the first two nodes did not finish the job\n%s", logs())
	}
	return c, logs
}

// heldJob is carryJob's job with nnodes 2:3 whose train.py holds its
// workers at a point (a --hold-* flag) until the test releases them, its
// first two agents started.
type heldJob struct {
	*job
	steps, hold string // train.py's step log; the file that releases the workers
	a, b        *agentRun
}

func startHeld(t *testing.T, steps int, flag string) *heldJob {
	j, log := carryJob(t, "2:3", steps)
	h := &heldJob{job: j, steps: log, hold: filepath.Join(t.TempDir(), "go")}
	j.script = append(j.script, flag, h.hold)
	h.a = j.startHost()
	h.b = j.start()
	return h
}

// releaseMoved releases the workers once the first two agents have moved
// theirs into the round that c joined, and c has started its own.
func (h *heldJob) releaseMoved(c *agentRun, logs func() string) {
	h.t.Helper()
	waitFor(h.t, time.Minute, func() bool {
		return strings.Count(h.a.stderr.String()+h.b.stderr.String(), `msg="workers carry on in process into the new generation"`) == 2 &&
			strings.Contains(c.stderr.String(), `msg="workers started"`)
	}, logs)
	h.release()
}

// release lets the held workers go on, and says when.
func (h *heldJob) release() time.Time {
	h.t.Helper()
	if err := os.WriteFile(h.hold, nil, 0o644); err != nil {
		h.t.Fatal(err)
	}
	return time.Now()
}

// stepLine is one line of train.py's $TRAIN_STEP_LOG.
type stepLine struct {
	Event string  `json:"event"`
	Rank  int     `json:"rank"`
	Step  int     `json:"step"`
	World int     `json:"world"`
	T     float64 `json:"t"`
}

func readSteps(path string) []stepLine {
	b, _ := os.ReadFile(path)
	var lines []stepLine
	for _, l := range strings.Split(string(b), "\n") {
		var s stepLine
		if json.Unmarshal([]byte(l), &s) == nil && s.Event == "step" {
			lines = append(lines, s)
		}
	}
	return lines
}

// lastStep is the last step that ranks 0..world-1 have all completed, per
// the step log; 0 when none.
func lastStep(path string, world int) int {
	lo, _ := stepsIn(path, world, 0)
	return lo
}

// stepsIn is the lowest and highest of the last steps that ranks
// 0..ranks-1 logged, in a world of size world (0: any).
func stepsIn(path string, ranks, world int) (lo, hi int) {
	last := map[int]int{}
	for _, s := range readSteps(path) {
		if world == 0 || s.World == world {
			last[s.Rank] = max(last[s.Rank], s.Step)
		}
	}
	lo = -1
	for r := range ranks {
		if lo < 0 || last[r] < lo {
			lo = last[r]
		}
		hi = max(hi, last[r])
	}
	return lo, hi
}

// firstStepOf is when ranks 0..world-1 had all completed a step they
// completed after since.
func firstStepOf(path string, world int, since time.Time) (time.Time, bool) {
	at := map[int]map[int]float64{} // step -> rank -> time
	for _, s := range readSteps(path) {
		if s.T < float64(since.UnixNano())/1e9 || s.Rank >= world {
			continue
		}
		if at[s.Step] == nil {
			at[s.Step] = map[int]float64{}
		}
		at[s.Step][s.Rank] = s.T
	}
	best := 0.0
	for _, ranks := range at {
		if len(ranks) < world {
			continue
		}
		latest := 0.0
		for _, t := range ranks {
			latest = max(latest, t)
		}
		if best == 0 || latest < best {
			best = latest
		}
	}
	return time.Unix(0, int64(best*1e9)), best > 0
}

// TestNodeWithoutSparesJoins: two nodes under --spares 1 train; a third
// joins without --spares. Its workers cannot join the others'
// re-formation in process (its agent starts no warm workers and serves no
// store), so the round that takes it in does not carry the others'
// workers on: every agent says which node lacks --spares, and the job
// restarts its workers at once, as without spares, rather than leaving the
// first two nodes' workers to wait out InProcess's timeout (60 s) for
// workers that never come.
func TestNodeWithoutSparesJoins(t *testing.T) {
	budgetAlongside(t, 60*time.Second) // 31-48 s in CI runs beside the others
	h := startHeld(t, 20, "--hold-in-loop")
	a, b := h.a, h.b
	logs := func() string { return a.logs() + "\n----\n" + b.logs() }
	waitFor(t, 2*time.Minute, func() bool { return lastStep(h.steps, 4) >= 9 }, logs)
	third := *h.job
	i := slices.Index(third.args, "--spares")
	third.args = slices.Delete(slices.Clone(third.args), i, i+2)
	c := third.start()
	logs = func() string { return a.logs() + "\n----\n" + b.logs() + "\n----\n" + c.logs() }
	waitFor(t, time.Minute, func() bool { return strings.Contains(c.stderr.String(), `msg="workers started"`) }, logs)
	released := h.release()
	waitAll(t, 3*time.Minute, a, b, c)
	var out strings.Builder
	for _, r := range []*agentRun{a, b, c} {
		out.WriteString(r.stdout.String())
	}
	why := regexp.MustCompile(`msg="warm spares: the workers cannot carry on into the new generation in process; restarting them" component=ddp-agent why="node \S+ runs without --spares: its workers cannot join the others' re-formation"`)
	for _, r := range []*agentRun{a, b} {
		if !why.MatchString(r.stderr.String()) {
			t.Fatalf("want the first two agents to restart their workers, naming the node without --spares\n%s", logs())
		}
	}
	plain := regexp.MustCompile(`msg="the job's nodes differ in --spares: a change of its nodes restarts every worker, as without spares; give every node the same --spares" component=ddp-agent without="node \S+" this_node=(\d)`)
	for i, r := range []*agentRun{a, b, c} {
		if m := plain.FindStringSubmatch(r.stderr.String()); m == nil || (m[1] == "0") != (r == c) {
			t.Fatalf("agent %d did not say which node runs without --spares: %q\n%s", i, m, logs())
		}
	}
	switch o := out.String(); {
	case !strings.Contains(o, "done: steps=20") || !strings.Contains(o, "world_size=6"):
		t.Fatalf("training did not finish in a world of 6\n%s", logs())
	case strings.Contains(o, "ReformError"):
		t.Fatalf("a worker waited out its re-formation\n%s", logs())
	}
	if d := paramDigests(out.String()); len(d) != 6 || slices.ContainsFunc(slices.Collect(maps.Values(d)), func(v string) bool { return v != d[0] }) {
		t.Fatalf("params digests %v, want ranks 0-5 equal\n%s", d, logs())
	}
	if strings.Contains(out.String(), "restart_count 1") {
		t.Fatalf("the restart was counted as a fault\n%s", logs())
	}
	t.Logf("the hold's end to the job's end: %v", time.Since(released).Round(time.Millisecond))
}
