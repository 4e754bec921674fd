// Package e2e runs the real ddp-agent binary with real Python workers.
package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/syncbuf"
)

var (
	agentBin string // built by TestMain
	python   string // interpreter for workers (DDP_AGENT_PYTHON, default /usr/bin/python3)
	hasTorch bool
	repoRoot string
	shimLib  string // libddpshim.so, built by TestMain next to agentBin
)

func TestMain(m *testing.M) {
	if mode := os.Getenv("E2E_HELPER"); mode != "" {
		os.Exit(helper(mode))
	}
	os.Exit(setup(m))
}

func setup(m *testing.M) int {
	wd, _ := os.Getwd()
	repoRoot = filepath.Join(wd, "..", "..")
	dir, err := os.MkdirTemp("", "ddp-agent-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	agentBin = filepath.Join(dir, "ddp-agent")
	args := []string{"build", "-o", agentBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), append(args, "./agent/cmd/ddp-agent")...)
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build ddp-agent: %v\n%s", err, out)
		return 1
	}
	// examples/train.py uses the comm hook by default: the agent points its
	// workers at the libddpshim.so next to its executable, as in bin/.
	shimLib = filepath.Join(dir, "libddpshim.so")
	shim := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-buildmode=c-shared",
		"-o", shimLib, "./shim")
	shim.Dir = repoRoot
	shim.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := shim.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build libddpshim.so: %v\n%s", err, out)
		return 1
	}
	// The bundled plugins' binary, next to the agent as make build lays
	// them out (no race detector: it is a child of the agent, not code
	// under test here; plugins/ tests it under -race).
	plugins := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", filepath.Join(dir, "ddp-agent-plugins"),
		"./plugins/cmd/ddp-agent-plugins")
	plugins.Dir = repoRoot
	if out, err := plugins.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build ddp-agent-plugins: %v\n%s", err, out)
		return 1
	}
	python = os.Getenv("DDP_AGENT_PYTHON")
	if python == "" {
		python = "/usr/bin/python3"
	}
	hasTorch = exec.Command(python, "-c", "import torch").Run() == nil
	if !hasTorch && os.Getenv("DDP_AGENT_REQUIRE_TORCH") == "1" {
		fmt.Fprintf(os.Stderr, "DDP_AGENT_REQUIRE_TORCH=1 but %s cannot import torch (apt-get install python3-torch)\n", python)
		return 1
	}
	return m.Run()
}

// launcherFreeEnv returns the test's environment without what a launcher
// sets for its workers, so that a test run under one starts its own jobs clean.
func launcherFreeEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "DDP_AGENT_SOCKET"), strings.HasPrefix(k, "DDP_AGENT_GENERATION"),
			strings.HasPrefix(k, "TORCHELASTIC_"), strings.HasPrefix(k, "PET_"):
		case k == "RANK", k == "LOCAL_RANK", k == "WORLD_SIZE", k == "LOCAL_WORLD_SIZE", k == "GROUP_RANK",
			k == "ROLE_RANK", k == "MASTER_ADDR", k == "MASTER_PORT":
			// a launcher's: left out
		default:
			env = append(env, kv)
		}
	}
	// examples/train.py's MLP at a quarter of its width: the tests' steps
	// take their time from --sleep-per-step, and at full width the MLP's
	// compute was most of the suite's CPU (docs/testing.md).
	return append(env, "TRAIN_HIDDEN=512")
}

func needTorch(t *testing.T) {
	t.Helper()
	if !hasTorch {
		t.Skipf("%s cannot import torch", python)
	}
}

type agentRun struct {
	t       *testing.T
	cmd     *exec.Cmd
	out     string // E2E_OUT: where test scripts write pids and envs
	stdout  *syncbuf.Buffer
	stderr  *syncbuf.Buffer
	done    chan struct{}
	code    int
	started time.Time
	exited  time.Time // when Wait returned; set before done closes
}

// startAgent runs `ddp-agent run --python <python> args...` with E2E_OUT set
// to a fresh directory, from the test data directory.
func startAgent(t *testing.T, extraEnv []string, args ...string) *agentRun {
	t.Helper()
	r := &agentRun{t: t, out: t.TempDir(), stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{}, done: make(chan struct{})}
	r.cmd = exec.Command(agentBin, append([]string{"run", "--python", python}, args...)...)
	r.cmd.Dir = filepath.Join(repoRoot, "agent", "e2e", "testdata")
	r.cmd.Env = append(append(launcherFreeEnv(), "E2E_OUT="+r.out), extraEnv...)
	r.cmd.Stdout, r.cmd.Stderr = r.stdout, r.stderr
	r.started = time.Now()
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = r.cmd.Wait()
		r.exited = time.Now()
		addCPU(t, r.cmd.ProcessState)
		r.code = r.cmd.ProcessState.ExitCode()
		if ws, ok := r.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			r.code = 128 + int(ws.Signal())
		}
		close(r.done)
	}()
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			r.cmd.Process.Kill()
			<-r.done
		}
		if strings.Contains(r.stderr.String(), "WARNING: DATA RACE") {
			t.Errorf("the agent reported a data race\n%s", r.stderr.String())
		}
		if line, key, ok := repeatedKey(r.stderr.String()); ok {
			t.Errorf("the agent's log gives %s twice in a line:\n%s", key, line)
		}
		if os.Getenv("E2E_LOGS") != "" { // where a passing test's time went
			t.Logf("agent %s:\n%s", strings.Join(r.cmd.Args[1:], " "), r.stderr.String())
		}
	})
	return r
}

// wait returns the agent's exit code, failing the test if it runs past d.
func (r *agentRun) wait(d time.Duration) int {
	r.t.Helper()
	return r.waitHint(d, "")
}

// waitHint is wait with a hint on what to look at when the agent runs past d.
func (r *agentRun) waitHint(d time.Duration, hint string) int {
	r.t.Helper()
	select {
	case <-r.done:
		return r.code
	case <-time.After(d):
		r.cmd.Process.Kill()
		<-r.done
		if hint != "" {
			hint = " " + hint
		}
		r.t.Fatalf("agent still running after %v, killed%s\n%s", d, hint, r.logs())
		return -1
	}
}

func (r *agentRun) logs() string {
	return "stdout:\n" + tail(r.stdout.String()) + "\nstderr:\n" + tail(r.stderr.String())
}

// workerPIDs waits until n workers have written their pid files.
func (r *agentRun) workerPIDs(n int) []int {
	r.t.Helper()
	var pids []int
	waitFor(r.t, 10*time.Second, func() bool {
		pids = pids[:0]
		for rank := 0; rank < n; rank++ {
			b, err := os.ReadFile(filepath.Join(r.out, "pid_"+strconv.Itoa(rank)))
			if err != nil {
				return false
			}
			pid, _ := strconv.Atoi(string(b))
			pids = append(pids, pid)
		}
		return true
	}, r.logs)
	return pids
}

func tail(s string) string {
	lines := strings.Split(s, "\n")
	if len(lines) > 60 {
		lines = append([]string{"..."}, lines[len(lines)-60:]...)
	}
	return strings.Join(lines, "\n")
}

// waitMatch waits up to d for re to match what text returns (a process's
// log) and returns the match's first group.
func waitMatch(t *testing.T, d time.Duration, text func() string, re *regexp.Regexp, why func() string) string {
	t.Helper()
	var m []string
	waitFor(t, d, func() bool { m = re.FindStringSubmatch(text()); return m != nil }, why)
	return m[1]
}

func waitFor(t *testing.T, d time.Duration, cond func() bool, why func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v\n%s", d, why())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
