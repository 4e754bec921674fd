package e2e

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// hookStopTimeout is the agent's grace period for a worker to stop in TestHookWorkerDiesAgentRestarts.
const hookStopTimeout = 20 * time.Second

// TestHookWorkerDiesAgentRestarts: with the hook registered, rank 1 fails at
// step 12 while rank 0 is in the step's all-reduce.
//
// raise: RuntimeError, so the interpreter exits normally (atexit handlers,
// ddp_agent's included, run; none may wait for the peer). exit:
// os._exit(3), an abrupt death. Either way the agent sees the failure at
// once, the survivor stops within the grace period, and attempt 1 resumes
// from the step 10 checkpoint and finishes, the hook working again.
func TestHookWorkerDiesAgentRestarts(t *testing.T) {
	budget(t, 20*time.Second)
	tests := []struct {
		name string
		fail []string
	}{
		{"raise", nil},
		{"exit", []string{"--exit-code", "3"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			needTorch(t)
			args := append([]string{"--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
				"--stop-timeout", hookStopTimeout.String(),
				trainPy(), "--steps", "14", "--ckpt-every", "5", "--log-every", "5", "--ckpt-dir", t.TempDir(),
				"--comm-hook", "ddp-agent", "--fail-rank", "1", "--fail-at-step", "12"}, tc.fail...)
			r := startAgent(t, nil, args...)
			code := r.waitHint(90*time.Second,
				"(a normal run takes ~15 s: does a rank hang at exit, e.g. in an atexit handler waiting for its peer?)")
			if code != 0 {
				t.Fatalf("exit code %d, want 0\n%s", code, r.logs())
			}
			out := r.stdout.String() + r.stderr.String()
			for _, want := range []string{"injected failure on rank 1 at step 12", "restarting worker group",
				"resumed from step 10", "[rank0]:done: steps=14"} {
				if !strings.Contains(out, want) {
					t.Fatalf("output lacks %q\n%s", want, r.logs())
				}
			}
			// The survivor, blocked in the hook's all-reduce when its peer died, stopped within the grace period.
			if strings.Contains(out, "did not stop within the grace period") {
				t.Fatalf("a worker did not stop within the grace period\n%s", r.logs())
			}
			stderr := r.stderr.String()
			failed, ok1 := logTime(stderr, `msg="worker failed"`)
			restarted, ok2 := logTime(stderr, `msg="workers started".*attempt=1`)
			if !ok1 || !ok2 {
				t.Fatalf("no `worker failed` or attempt 1's `workers started` line\n%s", r.logs())
			}
			if gap := restarted.Sub(failed); gap >= hookStopTimeout/2 {
				t.Fatalf("restart took %v after the failure, want under %v\n%s", gap, hookStopTimeout/2, r.logs())
			}
			checkSameDigests(t, r.stdout.String(), r.logs())
			// Both attempts' hooks reached the agent.
			received := map[int]int{}
			for _, e := range collectiveEvents(stderr) {
				received[e.generation] = e.received
			}
			if received[0] <= 0 || received[1] <= 0 {
				t.Fatalf("events received by generation %v, want some in 0 and 1\n%s", received, r.logs())
			}
		})
	}
}

// logTime returns the time= of the agent's first log line matching pattern.
func logTime(stderr, pattern string) (time.Time, bool) {
	re, ts := regexp.MustCompile(pattern), regexp.MustCompile(`time=(\S+)`)
	for _, line := range strings.Split(stderr, "\n") {
		if !re.MatchString(line) {
			continue
		}
		m := ts.FindStringSubmatch(line)
		if m == nil {
			return time.Time{}, false
		}
		t, err := time.Parse(time.RFC3339Nano, m[1])
		return t, err == nil
	}
	return time.Time{}, false
}
