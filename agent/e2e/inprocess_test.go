package e2e

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
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
	reformed := regexp.MustCompile(`re-formed in process, generation 1: rank \d's step 9 failed .*; resuming at step 9 with rank (\d)'s state`)
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
