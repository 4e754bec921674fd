package disk

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

// smallTmpfs mounts a 4 MiB tmpfs with 64 inodes, unmounted in t.Cleanup.
func smallTmpfs(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a small tmpfs to fill")
	}
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	mount(t, "-t", "tmpfs", "-o", "size=4m,nr_inodes=64", "tmpfs", dir)
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

func mount(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("mount", args...).CombinedOutput(); err != nil {
		t.Fatalf("mount %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// watching runs the disk detector and returns its verdicts.
func watching(t *testing.T, cfg plugins.Config) <-chan detector.Finding {
	t.Helper()
	d := New()
	if _, err := d.Configure(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan detector.Finding, 64)
	done := make(chan error, 1)
	go func() {
		done <- d.Watch(ctx, func(f detector.Finding) error {
			select {
			case out <- f:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	t.Cleanup(func() { // before the unmount: cleanups run last first
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	})
	return out
}

// next returns the first verdict of severity sev, failing after 10s.
func next(t *testing.T, c <-chan detector.Finding, sev detector.Severity, what string) detector.Finding {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case f := <-c:
			if f.Severity == sev {
				return f
			}
		case <-timeout:
			t.Fatalf("no %s verdict (%s) within 10s", sev, what)
		}
	}
}

// The detector on a real, small tmpfs: filled to under 5% free space it
// warns, then under 10% free inodes, then remounted read-only it finds
// the path not writable; each time the fix brings a healthy verdict.
func TestTmpfsFilled(t *testing.T) {
	dir := smallTmpfs(t)
	c := watching(t, plugins.Config{"paths": dir, "interval": "100ms", "min-inodes": "10%"})
	next(t, c, detector.SeverityOK, "empty tmpfs")

	// 4 MiB less 128 KiB: 3.1% free, under min-free's 5%, yet room for the probe.
	big := filepath.Join(dir, "checkpoint")
	if err := os.WriteFile(big, make([]byte, 4<<20-128<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	f := next(t, c, detector.SeverityWarning, "space filled")
	if f.Action != detector.ActionWarn || !strings.Contains(f.Message, "checkpoints to "+dir+" may fail: 128.0 KiB free") {
		t.Errorf("space: %s %q", f.Action, f.Message)
	}
	if err := os.Remove(big); err != nil {
		t.Fatal(err)
	}
	next(t, c, detector.SeverityOK, "space freed")

	// 64 inodes, the root takes one: 60 files leave 3, under 10% (7), yet
	// one for the probe.
	for i := range 60 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprint("f", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f = next(t, c, detector.SeverityWarning, "inodes used")
	if !strings.Contains(f.Message, "3 inodes free") {
		t.Errorf("inodes: %q", f.Message)
	}
	for i := range 60 {
		if err := os.Remove(filepath.Join(dir, fmt.Sprint("f", i))); err != nil {
			t.Fatal(err)
		}
	}
	next(t, c, detector.SeverityOK, "inodes freed")

	mount(t, "-o", "remount,ro", dir)
	f = next(t, c, detector.SeverityError, "read-only")
	if f.Action != detector.ActionWarn || !strings.Contains(f.Message, "is not writable") || !strings.Contains(f.Message, "read-only file system") {
		t.Errorf("read-only: %s %q", f.Action, f.Message)
	}
	mount(t, "-o", "remount,rw", dir)
	next(t, c, detector.SeverityOK, "writable again")
}

// A path missing from the start is an error that asks for no restart.
func TestMissingPath(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "not-yet")
	c := watching(t, plugins.Config{"paths": missing, "interval": "100ms"})
	f := next(t, c, detector.SeverityError, "missing")
	if f.Action != detector.ActionWarn || f.Subject != missing || !strings.Contains(f.Message, "is missing") {
		t.Errorf("missing: %s %s %q", f.Action, f.Subject, f.Message)
	}
	if err := os.Mkdir(missing, 0o755); err != nil {
		t.Fatal(err)
	}
	next(t, c, detector.SeverityOK, "made")
}
