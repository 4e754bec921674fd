package nic

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

// vethPair makes a network namespace and a veth pair, one end (host) in
// this process's namespace, the other (peer) in the new one, both up, so
// that the host end's carrier follows the peer: what a NIC's port does
// with its switch. Both go away in t.Cleanup.
func vethPair(t *testing.T) (host, ns, peer string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace and a veth pair")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip to create a network namespace and a veth pair")
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b) // interface names are at most 15 bytes
	host, peer, ns = "ddpnic"+id+"h", "ddpnic"+id+"p", "ddp-nic-test-"+id
	ipCmd(t, "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	ipCmd(t, "link", "add", host, "type", "veth", "peer", "name", peer, "netns", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", host).Run() }) // already gone with the namespace, or by the test
	ipCmd(t, "link", "set", "dev", host, "up")
	ipCmd(t, "-n", ns, "link", "set", "dev", peer, "up")
	waitUp(t, host)
	return host, ns, peer
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// waitUp waits for the kernel to report an interface up with carrier
// (operstate goes through linkwatch, which can lag by a second).
func waitUp(t *testing.T, name string) portState {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st := readPort("/sys", netPort(name))
		if st.Up {
			return st
		}
		if time.Now().After(end) {
			t.Fatalf("%s not up after 5s: %+v", name, st)
		}
	}
}

// watching runs the nic detector on the real /sys and returns its verdicts.
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
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	})
	return out
}

// next returns the first verdict that want accepts, failing after 10s.
func next(t *testing.T, c <-chan detector.Finding, what string, want func(detector.Finding) bool) detector.Finding {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case f := <-c:
			if want(f) {
				return f
			}
		case <-timeout:
			t.Fatalf("no %s verdict within 10s", what)
		}
	}
}

// The detector against real kernel objects: a veth whose host end goes
// down by admin, then loses its carrier when the peer in the other
// namespace goes down (a switch port going dark), then vanishes. Each is
// found within two intervals (by the verdict's time, so a slow test
// machine does not fail it), and each recovery is a healthy verdict.
func TestVethDownDrainsTheNode(t *testing.T) {
	host, ns, peer := vethPair(t)
	const interval = 200 * time.Millisecond
	c := watching(t, plugins.Config{"interfaces": host, "interval": interval.String()})
	healthy := func(f detector.Finding) bool { return f.Subject == host && f.Severity == detector.SeverityOK }
	drain := func(f detector.Finding) bool {
		return f.Subject == host && f.Severity == detector.SeverityError && f.Action == detector.ActionDrainNode
	}
	within := func(f detector.Finding, since time.Time) {
		t.Helper()
		if d := f.Time.Sub(since); d > 2*interval {
			t.Errorf("found %s after the change, want within 2 intervals (%s): %q", d, 2*interval, f.Message)
		}
	}
	next(t, c, "first healthy", healthy)

	at := time.Now()
	ipCmd(t, "link", "set", "dev", host, "down")
	f := next(t, c, "drain-node for admin down", drain)
	within(f, at)
	if !strings.Contains(f.Message, "is down (operstate down, no carrier)") {
		t.Errorf("admin down: message %q", f.Message)
	}
	ipCmd(t, "link", "set", "dev", host, "up")
	f = next(t, c, "healthy after up", func(f detector.Finding) bool { return f.Subject == host && f.Severity != detector.SeverityError })
	if f.Severity != detector.SeverityOK {
		t.Errorf("first verdict after coming back up: %s %q, want ok (a recovery is not a flap)", f.Severity, f.Message)
	}

	at = time.Now()
	ipCmd(t, "-n", ns, "link", "set", "dev", peer, "down")
	f = next(t, c, "drain-node for the peer down", drain)
	within(f, at)
	if !strings.Contains(f.Message, "no carrier") {
		t.Errorf("peer down: message %q, want no carrier", f.Message)
	}
	ipCmd(t, "-n", ns, "link", "set", "dev", peer, "up")
	next(t, c, "healthy after the peer is up", healthy)

	at = time.Now()
	ipCmd(t, "link", "del", host)
	f = next(t, c, "drain-node for a vanished interface", drain)
	within(f, at)
	if !strings.Contains(f.Message, "is gone") {
		t.Errorf("deleted: message %q", f.Message)
	}
}

// carrier_changes on a real veth: a down and up between two looks is a
// flap; seen down and then up is not.
func TestVethFlapping(t *testing.T) {
	host, ns, peer := vethPair(t)
	p := netPort(host)
	before := readPort("/sys", p)
	ipCmd(t, "-n", ns, "link", "set", "dev", peer, "down")
	ipCmd(t, "-n", ns, "link", "set", "dev", peer, "up")
	after := waitUp(t, host)
	f := judge(p, &before, after, 0)
	if f.Severity != detector.SeverityWarning || !strings.Contains(f.Message, "flapped: 2 carrier changes") {
		t.Fatalf("down and up between looks: %s %q (carrier_changes %d then %d), want a flap warning", f.Severity, f.Message, before.Changes, after.Changes)
	}
	if f := judge(p, &after, readPort("/sys", p), 0); f.Severity != detector.SeverityOK {
		t.Fatalf("no change: %s %q", f.Severity, f.Message)
	}
}
