package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func needRoot(t *testing.T, what string, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: " + what)
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %s", tool, what)
		}
	}
}

func mustRun(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// The nic plugin on a veth pair whose other end, in a network namespace
// of the test's, goes down: the node's port lost its carrier, and the
// agent drains the node (exit 3) with the port named.
func TestPluginNICDrains(t *testing.T) {
	budget(t, 10*time.Second)
	needRoot(t, "creates a network namespace and a veth pair", "ip")
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	host, peer, ns := "ddpe2e"+id+"h", "ddpe2e"+id+"p", "ddp-e2e-nic-"+id
	mustRun(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	mustRun(t, "ip", "link", "add", host, "type", "veth", "peer", "name", peer, "netns", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", host).Run() })
	mustRun(t, "ip", "link", "set", "dev", host, "up")
	mustRun(t, "ip", "-n", ns, "link", "set", "dev", peer, "up")
	waitFor(t, 5*time.Second, func() bool {
		c, err := os.ReadFile("/sys/class/net/" + host + "/carrier")
		return err == nil && strings.TrimSpace(string(c)) == "1"
	}, func() string { return host + " has no carrier" })

	r := startAgent(t, nil, "--standalone", "--nproc-per-node", "1", "--max-restarts", "3",
		"--plugin", "nic,interfaces="+host+",interval=500ms", "sleeper.py")
	r.workerPIDs(1)
	time.Sleep(time.Second) // healthy verdicts first
	if strings.Contains(r.stderr.String(), "health finding") {
		t.Fatalf("a healthy port was reported\n%s", r.logs())
	}
	down := time.Now()
	mustRun(t, "ip", "-n", ns, "link", "set", "dev", peer, "down")
	if code := r.wait(30 * time.Second); code != 3 {
		t.Fatalf("exit %d, want 3 (drained)\n%s", code, r.logs())
	}
	if d := time.Since(down); d > 10*time.Second {
		t.Errorf("drained %v after the port went down", d)
	}
	if !strings.Contains(r.stderr.String(), host) {
		t.Errorf("the port is not named in the log\n%s", r.logs())
	}
}

// The disk plugin on a small tmpfs that fills up: a warning, told once,
// and the job goes on and finishes.
func TestPluginDiskWarns(t *testing.T) {
	budgetAlongside(t, 10*time.Second)
	needRoot(t, "mounts a small tmpfs", "mount", "umount")
	dir := t.TempDir()
	mustRun(t, "mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", dir)
	t.Cleanup(func() { _ = exec.Command("umount", dir).Run() })
	r := startAgent(t, nil, "--standalone", "--nproc-per-node", "1",
		"--plugin", "disk,paths="+dir+",interval=500ms,min-free=25%", "timed.py", "5")
	r.workerPIDs(1)
	if err := os.WriteFile(filepath.Join(dir, "checkpoint.pt"), make([]byte, 3<<20+512<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	if code := r.wait(60 * time.Second); code != 0 {
		t.Fatalf("exit %d, want 0: a full disk warns, it stops nothing\n%s", code, r.logs())
	}
	logs := r.stderr.String()
	if _, ok := logTime(logs, `health finding.*plugin=disk.*may fail`); !ok {
		t.Errorf("no warning about the full disk\n%s", r.logs())
	}
	if n := strings.Count(logs, "plugin=disk"); n > 3 {
		t.Errorf("%d lines about the disk: a standing finding is told once\n%s", n, r.logs())
	}
}

// ddp-agent plugins lists the bundled plugins, each started and asked.
func TestPluginsList(t *testing.T) {
	budget(t, 10*time.Second)
	out, err := exec.Command(agentBin, "plugins").CombinedOutput()
	if err != nil {
		t.Fatalf("ddp-agent plugins: %v\n%s", err, out)
	}
	for _, want := range []string{"exec (detector", "nic (detector", "disk (detector", "webhook (notifier", "command", "interfaces", "paths", "url"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("ddp-agent plugins: no %q in\n%s", want, out)
		}
	}
}
