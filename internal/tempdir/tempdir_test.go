package tempdir

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// TestRemoveStale: of the dirs a sweep finds, it removes those whose
// agent was SIGKILLed (the kernel dropped its lock) and etcd dirs left
// without a lock file long ago, and keeps a live agent's, a dir being
// created right now, a lockless dir of another kind, and anything not
// its own.
func TestRemoveStale(t *testing.T) {
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("flock(1) not installed")
	}
	parent := t.TempDir()
	mk := func(name string, lock bool) string {
		dir := filepath.Join(parent, name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if lock {
			if err := os.WriteFile(filepath.Join(dir, ownerLock), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "member"), []byte("wal"), 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	// An agent: a real process holding the dir's lock (flock(1) takes
	// flock(2) on the file, as Lock does; --close keeps the lock out of
	// its child, so killing flock releases it).
	holder := func(dir string) *exec.Cmd {
		cmd := exec.Command("flock", "--nonblock", "--close", filepath.Join(dir, ownerLock), "sleep", "60")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
		return cmd
	}
	killed := mk("ddp-agent-etcd-killed", true)
	alive := mk("ddp-agent-etcd-alive", true)
	young := mk("ddp-agent-etcd-young", false)
	old := mk("ddp-agent-etcd-old", false)
	other := mk("not-ours", true)
	runKilled := mk("ddp-agent-run-killed", true)
	runAlive := mk("ddp-agent-ctl-alive", true)
	runOld := mk("ddp-agent-run-old", false)
	k := holder(killed)
	k2 := holder(runKilled)
	holder(alive)
	holder(runAlive)
	time.Sleep(300 * time.Millisecond) // both hold their locks
	for _, h := range []*exec.Cmd{k, k2} {
		if err := h.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = h.Wait()
	}
	past := time.Now().Add(-2 * unlockedGrace)
	for _, dir := range []string{old, runOld} {
		if err := os.Chtimes(dir, past, past); err != nil {
			t.Fatal(err)
		}
	}

	got, err := RemoveStale(parent, Kinds(), time.Now())
	if err != nil {
		t.Error(err)
	}
	slices.Sort(got)
	if want := []string{killed, old, runKilled}; !slices.Equal(got, want) {
		t.Errorf("removed %q, want %q", got, want)
	}
	for _, dir := range []string{alive, young, other, runAlive, runOld} {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("%s: %v, want it kept", dir, err)
		}
	}
	for _, dir := range []string{killed, old, runKilled} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s still there (%v)", dir, err)
		}
	}
}
