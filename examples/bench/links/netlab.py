"""Simulated hosts on one switch, as network namespaces: the benchmark's links.

One namespace per host, each joined by a veth pair to a bridge in one more
namespace (the switch), with tc's token bucket (tbf) shaping both directions
of every host's link to the same rate: each host has one NIC of rate R, as in
a cluster, so gloo's full mesh gets no more bandwidth than the ring's
neighbours. Host i is 10.214.0.(i+1) on its "eth0". A delay, when asked for,
is sch_netem's (on kernels that have it) under the token bucket.

The same topology as shim/host/netlab_test.go, which the tests use.
"""

import os
import subprocess
import uuid

PREFIX = "ddplinks-"  # then the creating pid, so that a crashed run's leftovers can be told apart


def sh(*args, check=True):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(args), r.returncode, r.stderr.strip()))
    return r


def have_netem():
    """Whether the kernel has sch_netem (tried on a dummy namespace's loopback)."""
    ns = "%s%d-probe" % (PREFIX, os.getpid())
    sh("ip", "netns", "add", ns)
    try:
        return sh("tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms", check=False).returncode == 0
    finally:
        sh("ip", "netns", "del", ns, check=False)


def remove_leftovers():
    """Deletes the namespaces of earlier runs whose process is gone."""
    for line in sh("ip", "netns", "list").stdout.splitlines():
        name = line.split(" ")[0]
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX):].split("-")[0]
        if pid.isdigit() and not os.path.exists("/proc/" + pid):
            sh("ip", "netns", "del", name, check=False)


class Lab:
    """n hosts with links of rate_mbit each way (and delay_us one way per hop, 0 for none)."""

    def __init__(self, n, rate_mbit, delay_us=0):
        remove_leftovers()
        self.id = "%s%d-%s" % (PREFIX, os.getpid(), uuid.uuid4().hex[:6])
        self.switch = self.id + "-sw"
        self.hosts, self.ips, self.rate_mbit, self.delay_us = [], [], rate_mbit, delay_us
        self.made = []
        try:
            self._build(n)
        except BaseException:
            self.close()
            raise

    def _build(self, n):
        self._ns(self.switch)
        sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i in range(n):
            ns, ip, port = "%s-h%d" % (self.id, i), "10.214.0.%d" % (i + 1), "p%d" % i
            self._ns(ns)
            sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", self.switch)
            sh("ip", "-n", self.switch, "link", "set", port, "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", ip + "/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            self._shape(ns, "eth0")
            self._shape(self.switch, port)
            self.hosts.append(ns)
            self.ips.append(ip)

    def _ns(self, ns):
        sh("ip", "netns", "add", ns)
        self.made.append(ns)

    def _shape(self, ns, dev):
        # A bucket of 2 ms of the rate (at least 128 KiB: one 64 KiB GSO packet
        # always fits), a queue of 20 ms.
        burst = max(128 << 10, self.rate_mbit * 1000 * 1000 // 8 // 500)
        tbf = ["tbf", "rate", "%dmbit" % self.rate_mbit, "burst", str(burst), "latency", "20ms"]
        if self.delay_us:
            sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay",
               "%dus" % self.delay_us, "limit", "100000")
            sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf)
        else:
            sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", *tbf)

    def cmd(self, i, argv):
        """argv as a command line that runs in host i's namespace."""
        return ["ip", "netns", "exec", self.hosts[i]] + list(argv)

    def close(self):
        for ns in reversed(self.made):
            sh("ip", "netns", "del", ns, check=False)
        self.made = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
