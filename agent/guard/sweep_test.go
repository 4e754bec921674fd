package guard

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/envname"
)

func TestCarries(t *testing.T) {
	for env, want := range map[string]bool{
		"A=1\x00" + envname.Instance + "=00aa\x00B=2":     true,
		envname.Instance + "=11bb,00aa":                   true,
		envname.Instance + "=00aab":                       false,
		"X" + envname.Instance + "=00aa":                  false,
		"A=" + envname.Instance + "=00aa\x00":             false,
		"":                                                false,
		envname.Instance + "=\x00" + envname.Instance[:5]: false,
	} {
		if got := carries([]byte(env), "00aa"); got != want {
			t.Errorf("carries(%q) = %v, want %v", env, got, want)
		}
	}
}

// TestSweepKillsOnlyTheMarked: of two real processes, the sweep kills
// the one whose environment carries the id, and leaves the other.
func TestSweepKillsOnlyTheMarked(t *testing.T) {
	start := func(env string) *exec.Cmd {
		c := exec.Command("sleep", "60")
		c.Env = append(os.Environ(), env)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c
	}
	marked := start(envname.Instance + "=ffff,0123456789abcdef")
	other := start(envname.Instance + "=0123456789abcdee")
	done := make(chan error, 1)
	go func() { done <- marked.Wait() }()
	killed, err := sweep("0123456789abcdef", os.Getpid(), 50, 20*time.Millisecond)
	if err != nil || len(killed) != 1 || killed[0] != marked.Process.Pid {
		t.Fatalf("sweep killed %v, %v; want [%d]", killed, err, marked.Process.Pid)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "killed") {
			t.Errorf("the marked process ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the marked process is still running")
	}
	if other.ProcessState != nil {
		t.Error("the unmarked process was killed")
	}
}
