package e2e

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// procResult is how a process run by runProc ended.
type procResult struct {
	args           []string
	code           int
	stdout, stderr string
	elapsed        time.Duration
}

func (r procResult) logs() string {
	return fmt.Sprintf("command: %s\nexit code %d after %v\nstdout:\n%s\nstderr:\n%s",
		strings.Join(r.args, " "), r.code, r.elapsed.Round(100*time.Millisecond), tail(r.stdout), tail(r.stderr))
}

// runProc runs args from the repository root, with extraEnv added to the
// launcher-free environment, in a process group of its own. Past timeout
// it SIGKILLs the whole group (a launcher and its workers) and fails the
// test, saying hint.
func runProc(t *testing.T, timeout time.Duration, extraEnv []string, hint string, args ...string) procResult {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = repoRoot
	cmd.Env = append(launcherFreeEnv(), extraEnv...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	timedOut := false
	select {
	case <-done:
	case <-time.After(timeout):
		timedOut = true
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	r := procResult{args: args, code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String(), elapsed: time.Since(start)}
	if timedOut {
		t.Fatalf("timed out after %v and killed %s\n%s", timeout, hint, r.logs())
	}
	return r
}
