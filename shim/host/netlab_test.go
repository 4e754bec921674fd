package host

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// netLab is a few simulated hosts on one switch: a network namespace per
// host, each joined by a veth pair to a bridge in one more namespace, with
// tc's token bucket (tbf) shaping both directions of every host's link to
// rate. A bridge rather than a veth pair per pair of hosts, because that is
// what a cluster looks like: each host has one NIC of rate R, and gloo's
// full mesh gets no more bandwidth than the ring's neighbours. Host i is
// 10.213.0.(i+1) on its "eth0"; the bridge's end of its link is "p<i>".
//
// The kernels these tests run on need not have sch_netem (the CI VM has
// no modules), so the links have a rate and no added delay.
type netLab struct {
	bridge string   // the switch's namespace
	hosts  []string // one namespace per host
	ips    []string
}

// labPrefix starts the names of every namespace a netLab makes, followed by
// the creating process's pid, so that leftovers of a crashed run can be
// told from a running one's.
const labPrefix = "ddphost-"

// newNetLab makes n hosts with links of rateMbit Mbit/s each way; they go
// away in t.Cleanup. It skips the test unless it runs as root with ip and
// tc.
func newNetLab(t *testing.T, n, rateMbit int) *netLab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, veth pairs and tc qdiscs")
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs iproute2's %s (scripts/deps.sh installs it)", tool)
		}
	}
	removeLeftovers(t)
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	id := fmt.Sprintf("%s%d-%s", labPrefix, os.Getpid(), hex.EncodeToString(b))
	lab := &netLab{bridge: id + "-sw"}
	// What the kernel or the container may lack is a reason to skip, not a
	// failure: namespaces (a container without CAP_SYS_ADMIN), bridges,
	// veth pairs, tbf.
	if out, err := exec.Command("ip", "netns", "add", lab.bridge).CombinedOutput(); err != nil {
		t.Skipf("cannot create a network namespace: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", lab.bridge).Run() })
	for _, probe := range [][]string{
		{"ip", "-n", lab.bridge, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", lab.bridge, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1"},
		{"tc", "-n", lab.bridge, "qdisc", "add", "dev", "probe0", "root", "tbf", "rate", "1gbit", "burst", "128k", "latency", "20ms"},
	} {
		if out, err := exec.Command(probe[0], probe[1:]...).CombinedOutput(); err != nil {
			t.Skipf("%s: %v: %s", strings.Join(probe, " "), err, out)
		}
	}
	runTool(t, "ip", "-n", lab.bridge, "link", "del", "probe0")
	runTool(t, "ip", "-n", lab.bridge, "link", "set", "br0", "up")
	for i := range n {
		ns, ip, port := fmt.Sprintf("%s-h%d", id, i), fmt.Sprintf("10.213.0.%d", i+1), fmt.Sprintf("p%d", i)
		addNS(t, ns)
		runTool(t, "ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", lab.bridge)
		runTool(t, "ip", "-n", lab.bridge, "link", "set", port, "master", "br0", "up")
		runTool(t, "ip", "-n", ns, "addr", "add", ip+"/24", "dev", "eth0")
		runTool(t, "ip", "-n", ns, "link", "set", "eth0", "up")
		runTool(t, "ip", "-n", ns, "link", "set", "lo", "up")
		shape(t, ns, "eth0", rateMbit)
		shape(t, lab.bridge, port, rateMbit)
		lab.hosts, lab.ips = append(lab.hosts, ns), append(lab.ips, ip)
	}
	return lab
}

// cut takes host i's link down at the switch, as a dead port or a pulled
// cable does: nothing is reset, packets both ways are just lost.
func (l *netLab) cut(t *testing.T, i int) {
	t.Helper()
	runTool(t, "ip", "-n", l.bridge, "link", "set", fmt.Sprintf("p%d", i), "down")
}

// command runs exe with args as a process inside host i's namespace.
// With uts, the process also gets a UTS namespace of its own whose
// hostname is the host's namespace name: the shim's HostID (boot id,
// hostname, /dev/shm) then tells the simulated hosts apart, while the ranks
// of one host still agree, as on real machines.
func (l *netLab) command(i int, uts bool, exe string, args ...string) *exec.Cmd {
	argv := append([]string{"netns", "exec", l.hosts[i]}, exe)
	if uts {
		argv = append([]string{"netns", "exec", l.hosts[i], "unshare", "--uts", "sh", "-c", `hostname "$0" && exec "$@"`, l.hosts[i]}, exe)
	}
	cmd := exec.Command("ip", append(argv, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// shape limits what dev sends to rateMbit with a token bucket whose
// bucket holds 2 ms of the rate (at least 128 KiB, so that one GSO packet
// of 64 KiB always fits) and whose queue holds 20 ms.
func shape(t *testing.T, ns, dev string, rateMbit int) {
	t.Helper()
	burst := max(128<<10, rateMbit*1000*1000/8/500)
	runTool(t, "tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
		"rate", fmt.Sprintf("%dmbit", rateMbit), "burst", strconv.Itoa(burst), "latency", "20ms")
}

func addNS(t *testing.T, ns string) {
	t.Helper()
	runTool(t, "ip", "netns", "add", ns)
	// Deleting a namespace deletes its veth ends, and with them their peers.
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
}

// removeLeftovers deletes the namespaces of netLabs whose process is gone
// (a test binary killed before its cleanups ran).
func removeLeftovers(t *testing.T) {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		rest, ok := strings.CutPrefix(name, labPrefix)
		if !ok {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || syscall.Kill(pid, 0) == nil {
			continue // not ours, or its process is alive
		}
		t.Logf("removing namespace %s left by process %d", name, pid)
		_ = exec.Command("ip", "netns", "del", name).Run()
	}
}

func runTool(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}
