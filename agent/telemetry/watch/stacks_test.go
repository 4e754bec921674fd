package watch

import (
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestMainThreadFirst(t *testing.T) {
	waiter := "Thread 0x00007f01 (most recent call first):\n  File \"/x/_waiter.py\", line 70 in _run\n  File \"/usr/lib/python3.11/threading.py\", line 975 in run"
	main := "Current thread 0x00007f02 (most recent call first):\n  File \"train.py\", line 310 in main\n  File \"train.py\", line 355 in <module>"
	module := "Thread 0x00007f03 (most recent call first):\n  File \"/x/train.py\", line 9 in <module>\n  File \"<frozen runpy>\", line 88 in _run_code\n  File \"<frozen runpy>\", line 198 in _run_module_as_main"
	for _, c := range []struct{ name, in, want string }{
		{"waiter first", waiter + "\n\n" + main + "\n", main + "\n\n" + waiter + "\n"},
		{"main first already", main + "\n\n" + waiter + "\n", main + "\n\n" + waiter + "\n"},
		{"one thread", main + "\n", main + "\n"},
		{"no main thread", waiter + "\n", waiter + "\n"},
		{"three threads", waiter + "\n\n" + waiter + "\n\n" + main + "\n", main + "\n\n" + waiter + "\n\n" + waiter + "\n"},
		{"python -m", waiter + "\n\n" + module + "\n", module + "\n\n" + waiter + "\n"},
	} {
		if got := mainThreadFirst(c.in); got != c.want {
			t.Errorf("%s: got\n%s\nwant\n%s", c.name, got, c.want)
		}
	}
}

// TestWhyNoStack reads the state of a real process: running, stopped,
// exited.
func TestWhyNoStack(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	// Asleep in nanosleep (S) once exec has loaded it (D a moment before).
	waitState(t, func() bool { return whyNoStack(pid) == "" })
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitState(t, func() bool { return strings.Contains(whyNoStack(pid), "stopped") })
	_ = syscall.Kill(pid, syscall.SIGKILL)
	waitState(t, func() bool { return strings.Contains(whyNoStack(pid), "exited") }) // a zombie until Wait
	if got := whyNoStack(0); got != "" {
		t.Errorf("pid 0: %q", got)
	}
}

func waitState(t *testing.T, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the process never reached the state")
		}
	}
}
