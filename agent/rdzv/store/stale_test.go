package store

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// TestRemoveStale: of the temp data dirs a store finds, it removes those
// whose agent was SIGKILLed (the kernel dropped its lock) and those left
// without a lock file long ago, and keeps a live agent's, a dir being
// created right now, and anything not its own.
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
	// flock(2) on the file, as lockDir does; --close keeps the lock out of
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
	k := holder(killed)
	holder(alive)
	time.Sleep(300 * time.Millisecond) // both hold their locks
	if err := k.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = k.Wait()
	past := time.Now().Add(-2 * unlockedGrace)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}

	got := removeStale(parent, time.Now(), slog.New(slog.DiscardHandler))
	slices.Sort(got)
	if want := []string{killed, old}; !slices.Equal(got, want) {
		t.Errorf("removed %q, want %q", got, want)
	}
	for _, dir := range []string{alive, young, other} {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("%s: %v, want it kept", dir, err)
		}
	}
	for _, dir := range []string{killed, old} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s still there (%v)", dir, err)
		}
	}
}

// TestStartLocksItsDir: a store's own temp dir is locked while it runs,
// so another agent's sweep keeps it, and gone after Close.
func TestStartLocksItsDir(t *testing.T) {
	srv := startServer(t, ServerConfig{})
	dir := srv.tempDir
	if stale, err := staleDir(dir, time.Now().Add(time.Hour)); err != nil || stale {
		t.Errorf("a running store's dir judged stale (%v, %v)", stale, err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still there after Close (%v)", dir, err)
	}
}
