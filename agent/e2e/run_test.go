package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/syncbuf"
)

func TestTrainToCompletion(t *testing.T) {
	budget(t, 20*time.Second)
	needTorch(t)
	ckpt := t.TempDir()
	r := startAgent(t, nil, "--standalone", "--nproc-per-node", "2", filepath.Join(repoRoot, "examples", "train.py"),
		"--steps", "10", "--log-every", "5", "--ckpt-dir", ckpt)
	if code := r.wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit code %d, want 0\n%s", code, r.logs())
	}
	out := r.stdout.String()
	for _, want := range []string{"[rank0]:rank 0/2 local_rank 0 restart_count 0", "[rank1]:rank 1/2 local_rank 1 restart_count 0", "[rank0]:done: steps=10"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q\n%s", want, r.logs())
		}
	}
}

// TestEnvMatchesTorchrun runs one script under torchrun and under ddp-agent
// and compares every variable the launcher adds.
func TestEnvMatchesTorchrun(t *testing.T) {
	budget(t, 10*time.Second)
	needTorch(t)
	compat := os.Getenv("DDP_AGENT_TORCHRUN_COMPAT")
	if compat == "" {
		compat = filepath.Join(repoRoot, "scripts", "torchrun_compat.py")
	}
	if _, err := os.Stat(compat); err != nil {
		t.Fatalf("torchrun wrapper: %v (scripts/torchrun_compat.py, or DDP_AGENT_TORCHRUN_COMPAT)", err)
	}
	script := filepath.Join(repoRoot, "agent", "e2e", "testdata", "dumpenv.py")
	torchOut := t.TempDir()
	tr := exec.Command(python, compat, "--standalone", "--nproc_per_node", "2", "--max_restarts", "2", script)
	tr.Env = append(os.Environ(), "E2E_OUT="+torchOut)
	if out, err := tr.CombinedOutput(); err != nil {
		t.Fatalf("torchrun: %v\n%s", err, out)
	}
	r := startAgent(t, nil, "--standalone", "--nproc_per_node", "2", "--max_restarts", "2", script)
	if code := r.wait(time.Minute); code != 0 {
		t.Fatalf("exit code %d\n%s", code, r.logs())
	}
	base := map[string]bool{}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		base[k] = true
	}
	// Values that differ by design: ports and ids are picked per run; torchrun
	// names the host where ddp-agent uses loopback on one node; torchrun's
	// workers use the agent's store, ddp-agent's rank 0 hosts it.
	differ := map[string]bool{"MASTER_PORT": true, "MASTER_ADDR": true, "TORCHELASTIC_RUN_ID": true,
		"TORCHELASTIC_ERROR_FILE": true, "TORCHELASTIC_USE_AGENT_STORE": true, "E2E_OUT": true}
	for rank := 0; rank < 2; rank++ {
		want, got := readEnv(t, torchOut, rank), readEnv(t, r.out, rank)
		for k, v := range want {
			if base[k] || k == "E2E_OUT" {
				continue
			}
			g, ok := got[k]
			switch {
			case !ok:
				t.Errorf("rank %d: ddp-agent does not set %s (torchrun: %q)", rank, k, v)
			case !differ[k] && g != v:
				t.Errorf("rank %d: %s: got %q, want torchrun's %q", rank, k, g, v)
			}
		}
		for _, k := range []string{"DDP_AGENT_SOCKET", "DDP_AGENT_GENERATION", "TORCHELASTIC_ERROR_FILE"} {
			if got[k] == "" {
				t.Errorf("rank %d: %s not set", rank, k)
			}
		}
	}
}

func readEnv(t *testing.T, dir string, rank int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "env_"+string(rune('0'+rank))+".json"))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// torchrun 2.x's console flags: --local-ranks-filter keeps the other
// ranks off the console but not out of their log files, and
// --log-line-prefix-template's macros name each line's worker.
func TestConsoleFilterAndPrefix(t *testing.T) {
	budget(t, 5*time.Second)
	logs := t.TempDir()
	r := startAgent(t, nil, "--standalone", "--nproc-per-node", "3", "--role", "trainer", "--log-dir", logs, "--rdzv-id", "console",
		"--local-ranks-filter", "1", "--log-line-prefix-template", "<${role_name}/${local_rank}/${rank}> ", "timed.py", "0")
	if code := r.wait(time.Minute); code != 0 {
		t.Fatalf("exit code %d\n%s", code, r.logs())
	}
	out := r.stdout.String()
	if !strings.Contains(out, "<trainer/1/1> ready restart_count=0\n") || strings.Count(out, "ready") != 1 {
		t.Errorf("the console shows other ranks than local rank 1, or not its line with the prefix:\n%s", out)
	}
	for lr := 0; lr < 3; lr++ {
		b, err := os.ReadFile(filepath.Join(logs, "console", "attempt_0", strconv.Itoa(lr), "stdout.log"))
		if err != nil || string(b) != "ready restart_count=0\n" {
			t.Errorf("local rank %d's stdout.log: %q, %v (want its line, unprefixed)", lr, b, err)
		}
	}
}

func TestRestartPolicy(t *testing.T) {
	budget(t, 10*time.Second)
	tests := []struct {
		name        string
		maxRestarts string
		wantCode    int
		want        []string
	}{
		{"restart then succeed", "1", 0, []string{"[rank1]:rank 1 attempt 1 done", "restarting worker group"}},
		{"no restarts left", "0", 1, []string{"job failed after 1 attempt(s)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logDir := t.TempDir()
			r := startAgent(t, nil, "--nproc-per-node", "2", "--max-restarts", tc.maxRestarts, "--log-dir", logDir, "--run-id", "flaky", "flaky.py")
			if code := r.wait(time.Minute); code != tc.wantCode {
				t.Fatalf("exit code %d, want %d\n%s", code, tc.wantCode, r.logs())
			}
			all := r.stdout.String() + r.stderr.String()
			// The root-cause report names the rank, its exit code, and its last words.
			for _, want := range append(tc.want, "root cause", "worker rank 1 (local rank 1, pid", "exited with code 7",
				"flaky: giving up on attempt 0", "workers at failure:", "rank 0 pid", "node: mem") {
				if !strings.Contains(all, want) {
					t.Errorf("output lacks %q\n%s", want, r.logs())
				}
			}
			// Logs are kept per attempt; nothing is overwritten.
			b, err := os.ReadFile(filepath.Join(logDir, "flaky", "attempt_0", "1", "stderr.log"))
			if err != nil || !strings.Contains(string(b), "giving up") {
				t.Errorf("attempt 0 rank 1 stderr.log: %q, %v", b, err)
			}
			if tc.wantCode == 0 {
				b, err := os.ReadFile(filepath.Join(logDir, "flaky", "attempt_1", "1", "stdout.log"))
				if err != nil || !strings.Contains(string(b), "attempt 1 done") {
					t.Errorf("attempt 1 rank 1 stdout.log: %q, %v", b, err)
				}
			}
		})
	}
}

// TestTrainFaultResume: a real DDP job whose rank 1 raises at step 12 is
// restarted, resumes from the step 10 checkpoint and finishes; the report
// carries the Python exception from TORCHELASTIC_ERROR_FILE.
func TestTrainFaultResume(t *testing.T) {
	budgetAlongside(t, 30*time.Second)
	needTorch(t)
	ckpt := t.TempDir()
	r := startAgent(t, nil, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
		filepath.Join(repoRoot, "examples", "train.py"), "--steps", "16", "--ckpt-every", "5", "--log-every", "4", "--ckpt-dir", ckpt, "--fail-rank", "1", "--fail-at-step", "12")
	if code := r.wait(3 * time.Minute); code != 0 {
		t.Fatalf("exit code %d, want 0\n%s", code, r.logs())
	}
	all := r.stdout.String() + r.stderr.String()
	for _, want := range []string{"error file: RuntimeError", "traceback:", "resumed from step 10", "restart_count 1", "[rank0]:done: steps=16"} {
		if !strings.Contains(all, want) {
			t.Errorf("output lacks %q\n%s", want, r.logs())
		}
	}
}

func TestAgentSIGKILLLeavesNoWorkers(t *testing.T) {
	budget(t, 10*time.Second)
	r := startAgent(t, nil, "--nproc-per-node", "2", "sleeper.py")
	pids := r.workerPIDs(2)
	r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.done
	killed := time.Now()
	waitFor(t, time.Second, func() bool { return !processAlive(pids[0]) && !processAlive(pids[1]) }, r.logs)
	t.Logf("workers gone %v after the agent's SIGKILL", time.Since(killed).Round(time.Millisecond))
}

func TestAgentSignalsStopWorkers(t *testing.T) {
	budget(t, 10*time.Second)
	tests := []struct {
		name     string
		sig      syscall.Signal
		script   []string
		grace    string
		wantCode int
		minTime  time.Duration
		maxTime  time.Duration
	}{
		{"SIGTERM", syscall.SIGTERM, []string{"sleeper.py"}, "10s", 143, 0, 2 * time.Second},
		{"SIGINT", syscall.SIGINT, []string{"sleeper.py"}, "10s", 130, 0, 2 * time.Second},
		{"SIGHUP", syscall.SIGHUP, []string{"sleeper.py"}, "10s", 129, 0, 2 * time.Second},
		{"SIGQUIT", syscall.SIGQUIT, []string{"sleeper.py"}, "10s", 131, 0, 2 * time.Second},
		{"worker ignores SIGTERM", syscall.SIGTERM, []string{"sleeper.py", "--ignore-term"}, "1s", 143, time.Second, 3 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := startAgent(t, nil, append([]string{"--nproc-per-node", "2", "--stop-timeout", tc.grace}, tc.script...)...)
			pids := r.workerPIDs(2)
			waitFor(t, 5*time.Second, func() bool { return strings.Count(r.stdout.String(), "ready") == 2 }, r.logs)
			sent := time.Now()
			r.cmd.Process.Signal(tc.sig)
			code := r.wait(10 * time.Second)
			took := time.Since(sent)
			if code != tc.wantCode {
				t.Errorf("exit code %d, want %d\n%s", code, tc.wantCode, r.logs())
			}
			if took < tc.minTime || took > tc.maxTime {
				t.Errorf("agent took %v to stop, want %v..%v", took, tc.minTime, tc.maxTime)
			}
			for _, pid := range pids {
				if processAlive(pid) {
					t.Errorf("worker pid %d alive after the agent exited", pid)
				}
			}
			// Ctrl-C reaches Python as KeyboardInterrupt, as under torchrun.
			if interrupted := strings.Count(r.stdout.String(), "interrupted"); (tc.sig == syscall.SIGINT) != (interrupted == 2) {
				t.Errorf("%d workers saw KeyboardInterrupt after %v\n%s", interrupted, tc.sig, r.logs())
			}
		})
	}
}

// TestSignalWhileDiallingTheStore: a signal while the agent still dials
// the rendezvous store (nobody serves it yet) exits 128+N, as it does once
// the job runs. Before, the cancelled dial was an "agent error", exit 1.
func TestSignalWhileDiallingTheStore(t *testing.T) {
	budget(t, 15*time.Second)
	endpoint := fmt.Sprintf("127.0.0.1:%d", freePort(t)) // nothing listens there
	r := startAgent(t, nil, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
		"--rdzv-conf", "is_host=false", "--no-python", "--", "/bin/true")
	waitFor(t, 20*time.Second, func() bool { return strings.Contains(r.stderr.String(), "rendezvous store not reachable yet") }, r.logs)
	r.cmd.Process.Signal(syscall.SIGTERM)
	if code := r.wait(10 * time.Second); code != 143 {
		t.Fatalf("exit code %d, want 143\n%s", code, r.logs())
	}
	if !strings.Contains(r.stderr.String(), `msg="agent stopped by signal" component=ddp-agent signal=terminated`) {
		t.Fatalf("the agent did not say the signal stopped it\n%s", r.logs())
	}
}

// TestWarnsWhenPythonHasNoTorch: workers' interpreter that finds no torch
// package (a python3 from PATH that is not the job's: a pyenv shim) draws
// one warning naming it and --python before the workers start; one that
// has torch draws none.
func TestWarnsWhenPythonHasNoTorch(t *testing.T) {
	budget(t, 10*time.Second)
	needTorch(t)
	bare := filepath.Join(t.TempDir(), "python-without-site")
	if err := os.WriteFile(bare, []byte("#!/bin/sh\nexec "+python+" -S \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	const warning = `level=WARN msg="the workers' Python finds no torch package: if the script uses PyTorch, give --python (or DDP_AGENT_PYTHON) the interpreter that has it"`
	for _, tc := range []struct {
		python string
		warns  bool
	}{{bare, true}, {python, false}} {
		r := startAgent(t, nil, "--python", tc.python, "--standalone", "--nproc-per-node", "1", "dumpenv.py")
		if code := r.wait(20 * time.Second); code != 0 {
			t.Fatalf("--python %s: exit code %d, want 0\n%s", tc.python, code, r.logs())
		}
		if got := strings.Contains(r.stderr.String(), warning+" component=ddp-agent python="+tc.python); got != tc.warns {
			t.Fatalf("--python %s: warned %v, want %v\n%s", tc.python, got, tc.warns, r.logs())
		}
	}
}

// TestFastFailure: a worker that fails at once still fails the job.
func TestFastFailure(t *testing.T) {
	budget(t, 10*time.Second)
	r := startAgent(t, nil, "--nproc-per-node", "2", "--no-python", "--", "/bin/sh", "-c", "exit 3")
	if code := r.wait(10 * time.Second); code != 1 {
		t.Errorf("exit code %d, want 1\n%s", code, r.logs())
	}
	if !strings.Contains(r.stderr.String(), "exited with code 3") {
		t.Errorf("report lacks the exit code\n%s", r.logs())
	}
}

// TestClosedStdout: the agent's stdout going away (`| head`, a log shipper
// restarting) costs the console, not the job.
func TestClosedStdout(t *testing.T) {
	budget(t, 10*time.Second)
	cmd := exec.Command(agentBin, "run", "--nproc-per-node", "1", "--no-python", "--", "/bin/sh", "-c",
		"i=0; while [ $i -lt 20000 ]; do echo line $i; i=$((i+1)); done; echo finished >&2")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb syncbuf.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 100)
	if _, err := stdout.Read(buf); err != nil {
		t.Fatal(err)
	}
	stdout.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("agent: %v (want exit 0 despite the closed stdout)\n%s", err, errb.String())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("agent still running 30s after its stdout closed")
	}
	if !strings.Contains(errb.String(), "[rank0]:finished") {
		t.Errorf("stderr lacks the worker's last line\n%s", errb.String())
	}
}

// TestSpammingWorker: workers flooding stdout neither block the agent's
// reaction to a signal nor garble the console: every line is whole and
// prefixed.
func TestSpammingWorker(t *testing.T) {
	budget(t, 10*time.Second)
	r := startAgent(t, nil, "--nproc-per-node", "2", "sleeper.py", "--spam")
	r.workerPIDs(2)
	time.Sleep(time.Second)
	sent := time.Now()
	r.cmd.Process.Signal(syscall.SIGTERM)
	if code := r.wait(5 * time.Second); code != 143 {
		t.Errorf("exit code %d, want 143", code)
	}
	if took := time.Since(sent); took > 2*time.Second {
		t.Errorf("agent took %v to stop under spam", took)
	}
	out := r.stdout.String()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(out) < 1<<20 {
		t.Errorf("only %d bytes of spam reached the console in a second", len(out))
	}
	good := regexp.MustCompile(`^\[rank[01]\]:(ready|spam z{200})$`)
	for i, l := range lines {
		if !good.MatchString(l) {
			t.Fatalf("line %d of %d garbled: %.80q", i, len(lines), l)
		}
	}
	t.Logf("%d MiB of worker output in %v", len(out)>>20, time.Since(r.started).Round(time.Millisecond))
}

func TestCommandLine(t *testing.T) {
	budgetAlongside(t, 10*time.Second)
	tests := []struct {
		name     string
		args     []string
		wantCode int
		stdout   string
		stderr   string
	}{
		{"version", []string{"version"}, 0, "ddp-agent ", ""},
		{"help run", []string{"help", "run"}, 0, "--nproc-per-node", ""},
		{"run --help", []string{"run", "--help"}, 0, "--max-restarts", ""},
		{"unknown command", []string{"frob"}, 2, "", "unknown command \"frob\""},
		{"unknown flag", []string{"run", "--nprocs", "2", "x.py"}, 2, "", "unknown flag --nprocs"},
		{"contradiction", []string{"run", "-m", "--no-python", "x"}, 2, "", "contradict"},
		{"no script", []string{"run", "--nproc-per-node", "2"}, 2, "", "missing the training script"},
		{"flags without run", []string{"--standalone", "--nproc-per-node", "2", "x.py"}, 2, "", "did you mean ddp-agent run --standalone"},
		{"script without run", []string{"x.py", "--lr", "0.1"}, 2, "", "x.py is a script, not a command: did you mean ddp-agent run x.py"},
		{"program not executable", []string{"run", "--no-python", "testdata/dumpenv.py"}, 2, "", "testdata/dumpenv.py is not executable"},
		{"no interpreter", []string{"run", "--python", "/nonexistent/python3", "x.py"}, 2, "", "--python /nonexistent/python3: not found"},
		{"no program", []string{"run", "--no-python", "no-such-program-here"}, 2, "", "no-such-program-here: not found in $PATH"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(agentBin, tc.args...)
			var out, errb syncbuf.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			_ = cmd.Run()
			if code := cmd.ProcessState.ExitCode(); code != tc.wantCode {
				t.Errorf("exit code %d, want %d", code, tc.wantCode)
			}
			if !strings.Contains(out.String(), tc.stdout) || !strings.Contains(errb.String(), tc.stderr) {
				t.Errorf("got stdout %q stderr %q, want %q and %q", out.String(), errb.String(), tc.stdout, tc.stderr)
			}
			if tc.wantCode == 2 && tc.args[0] == "run" && strings.Count(errb.String(), "\n") != 1 {
				t.Errorf("usage error is not one line: %q", errb.String())
			}
		})
	}
}

// TestMissingScriptFailsCleanly: a script that is not there is one line
// and exit 2, before any worker starts (it was every worker failing and
// the job's exit 1).
func TestMissingScriptFailsCleanly(t *testing.T) {
	budget(t, 10*time.Second)
	r := startAgent(t, nil, "--nproc-per-node", "2", "no_such_script.py")
	if code := r.wait(30 * time.Second); code != 2 {
		t.Errorf("exit code %d, want 2\n%s", code, r.logs())
	}
	if got := r.stderr.String(); got != "ddp-agent run: no_such_script.py: no such file (the training script, relative to the directory ddp-agent runs in)\n" {
		t.Errorf("want one line naming the script, got\n%s", r.logs())
	}
}

// TestTokenNotInWorkersEnv: a --rdzv-token given as DDP_AGENT_RDZV_TOKEN
// (to keep it out of argv) stays out of the workers' environment too: they
// and their children inherited it (issue 35).
func TestTokenNotInWorkersEnv(t *testing.T) {
	budget(t, 5*time.Second)
	r := startAgent(t, []string{"DDP_AGENT_RDZV_TOKEN=s3cret-s3cret-s3cret"}, "--standalone", "--nproc-per-node", "1", "dumpenv.py")
	if code := r.wait(time.Minute); code != 0 {
		t.Fatalf("exit code %d\n%s", code, r.logs())
	}
	env := readEnv(t, r.out, 0)
	if v, ok := env["DDP_AGENT_RDZV_TOKEN"]; ok {
		t.Errorf("the worker's environment holds the token (%q)", v)
	}
	if env["RANK"] != "0" {
		t.Errorf("not the worker's environment: RANK=%q", env["RANK"])
	}
}

// TestSignalsToHandle: --signals-to-handle adds SIGUSR1 (Slurm's warning
// before a job's time limit): the agent stops on it and the workers get
// SIGUSR1 itself, as torchrun forwards it; without the flag SIGUSR1 is
// not the agent's to handle, and it dies of it (as torchrun would).
func TestSignalsToHandle(t *testing.T) {
	budget(t, 10*time.Second)
	r := startAgent(t, nil, "--standalone", "--nproc-per-node", "1", "--signals-to-handle", "SIGTERM,SIGINT,SIGUSR1", "signaled.py")
	waitFor(t, 20*time.Second, func() bool { return strings.Contains(r.stdout.String(), "ready") }, r.logs)
	r.cmd.Process.Signal(syscall.SIGUSR1)
	if code := r.wait(20 * time.Second); code != 128+int(syscall.SIGUSR1) {
		t.Errorf("exit %d, want %d", code, 128+int(syscall.SIGUSR1))
	}
	if !strings.Contains(r.stdout.String(), "got SIGUSR1") || !strings.Contains(r.stderr.String(), "agent stopped by signal") {
		t.Errorf("the worker did not get SIGUSR1 from an agent that stopped on it\n%s", r.logs())
	}
}

// TestVirtualLocalRank: every worker's LOCAL_RANK is 0 (on a CPU node no
// GPU to narrow).
func TestVirtualLocalRank(t *testing.T) {
	budget(t, 10*time.Second)
	r := startAgent(t, nil, "--standalone", "--nproc-per-node", "2", "--virtual-local-rank", "--no-python", "sh", "-c", `echo "local_rank=$LOCAL_RANK rank=$RANK"`)
	if code := r.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d\n%s", code, r.logs())
	}
	for _, want := range []string{"[rank0]:local_rank=0 rank=0", "[rank1]:local_rank=0 rank=1"} {
		if !strings.Contains(r.stdout.String(), want) {
			t.Errorf("stdout lacks %q\n%s", want, r.logs())
		}
	}
}

// TestDuplicateFilters: --duplicate-stdout-filters copies every rank's
// matching lines, prefixed, into the attempt's filtered_stdout.log; a
// ",," is a comma in a filter.
func TestDuplicateFilters(t *testing.T) {
	budget(t, 10*time.Second)
	logDir := t.TempDir()
	r := startAgent(t, nil, "--standalone", "--nproc-per-node", "2", "--log-dir", logDir, "--rdzv-id", "dup",
		"--duplicate-stdout-filters", "loss,,,apple", "--no-python", "sh", "-c", `echo "step 1 loss, 0.5"; echo "step 1 lr 0.1"; echo "apple $RANK"`)
	if code := r.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d\n%s", code, r.logs())
	}
	b, err := os.ReadFile(filepath.Join(logDir, "dup", "attempt_0", "filtered_stdout.log"))
	if err != nil {
		t.Fatalf("%v\n%s", err, r.logs())
	}
	got := strings.Split(strings.TrimSpace(string(b)), "\n")
	slices.Sort(got)
	want := []string{"[rank0]:apple 0", "[rank0]:step 1 loss, 0.5", "[rank1]:apple 1", "[rank1]:step 1 loss, 0.5"}
	if !slices.Equal(got, want) {
		t.Errorf("filtered_stdout.log holds %q, want %q", got, want)
	}
}

// TestCleanExitSweepsDaemons: a worker that succeeds leaving a daemon
// behind (setsid, out of its process group): the agent kills it before it
// exits, and says so.
func TestCleanExitSweepsDaemons(t *testing.T) {
	budget(t, 10*time.Second)
	// A sleep nobody else runs, to find the daemon in /proc.
	marker := "301." + strconv.Itoa(os.Getpid()) + strconv.FormatInt(time.Now().UnixNano()%1000, 10)
	r := startAgent(t, nil, "--standalone", "--nproc-per-node", "1", "--no-python", "sh", "-c",
		"setsid sleep "+marker+" </dev/null >/dev/null 2>&1 & sleep 0.5")
	if code := r.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d\n%s", code, r.logs())
	}
	t.Cleanup(func() {
		for _, pid := range sleepers(marker) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	if left := sleepers(marker); len(left) > 0 {
		t.Errorf("the daemon %v outlived the agent\n%s", left, r.logs())
	}
	if !strings.Contains(r.stderr.String(), "killed what the workers and plugins had left running") {
		t.Errorf("the agent did not say it killed the daemon\n%s", r.logs())
	}
}
