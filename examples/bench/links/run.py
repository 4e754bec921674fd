"""The shim's TCP ring and gloo over real, rate-limited links between simulated hosts.

    /usr/bin/python3 examples/bench/links/run.py [--rates 1000,2500] [--ranks 2,3] [--shim bin/libddpshim.so]

As root, with iproute2. For each link rate and rank count it
  1. builds the hosts as network namespaces on one switch (netlab.py: veth
     pairs to a bridge, tc's token bucket on both directions of every link,
     sch_netem's delay where the kernel has it and --delay-us asks);
  2. measures what the links really deliver: a plain TCP stream from every
     host to the next at once, both directions of every link busy as in a
     ring (stream.py), for --stream-s seconds, --stream-runs times;
  3. runs examples/bench/mpi/ranks.py with --impls tcp,gloo, one rank per
     host under `ip netns exec`: the shim's TCP ring and gloo alternate round
     by round in the same processes, each size checked against the exact sum
     first (GLOO_SOCKET_IFNAME=eth0, MASTER_ADDR is host 0).
It prints a Markdown table of busbw in Gbit/s, median (min-max) of the
rounds; for a ring of n ranks on links of rate R the ideal busbw is R (each
byte crosses each link 2(n-1)/n times; busbw = 2(n-1)/n * bytes / time).
The columns: the ring over the nominal link rate and over the measured
stream, and the ring over gloo. --json keeps everything.
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)
import netlab  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rates", default="1000,2500", help="link rates, Mbit/s, comma-separated")
    p.add_argument("--ranks", default="2,3", help="hosts, comma-separated")
    p.add_argument("--per-host", type=int, default=1,
                   help="ranks per host; above 1 the shim's hierarchical all-reduce runs beside the flat ring")
    p.add_argument("--delay-us", type=int, default=0, help="one-way delay per hop (needs sch_netem)")
    p.add_argument("--sizes", default=",".join(str(64 << 10 << 2 * i) for i in range(6)), help="bytes, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--target-s", type=float, default=0.3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--min-iters", type=int, default=2)
    p.add_argument("--stream-s", type=float, default=2.0)
    p.add_argument("--stream-runs", type=int, default=2)
    p.add_argument("--shim", default=os.path.join(REPO, "bin", "libddpshim.so"))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--json", help="write every measurement here")
    return p.parse_args()


def streams(lab, secs):
    """Runs a TCP stream from every host to the next at once; returns each one's Gbit/s."""
    n, port, exe = len(lab.hosts), 5201, os.path.join(HERE, "stream.py")
    recvs = []
    for i in range(n):
        p = subprocess.Popen(lab.cmd(i, [sys.executable, exe, "recv", lab.ips[i], str(port)]),
                             stdout=subprocess.PIPE, text=True)
        p.stdout.readline()  # listening
        recvs.append(p)
    senders = [subprocess.Popen(lab.cmd(i, [sys.executable, exe, "send", lab.ips[(i + 1) % n], str(port), str(secs)]))
               for i in range(n)]
    for p in senders:
        p.wait()
    return [float(p.communicate()[0].split()[-1]) for p in recvs]


def ranks(args, lab, tmp):
    """Runs ranks.py on every host of lab, --per-host ranks each; returns rank 0's JSON.

    With several ranks per host, each rank runs in a UTS namespace of its own
    named after its host, so that the shim's HostID (boot id, hostname,
    /dev/shm) tells the hosts apart while a host's ranks agree: the default
    config then goes hierarchical.
    """
    n, k = len(lab.hosts), args.per_host
    out = os.path.join(tmp, "ranks-%d-%d.json" % (lab.rate_mbit, n))
    env = dict(os.environ, MASTER_ADDR=lab.ips[0], MASTER_PORT="29517", WORLD_SIZE=str(n * k),
               DDP_AGENT_SHIM=args.shim, GLOO_SOCKET_IFNAME="eth0")
    env.pop("DDP_AGENT_SOCKET", None)  # the shim bootstraps through torch's store
    impls = "tcp,gloo" if k == 1 else "hierarchical,tcp,gloo"
    cmd = [args.python, os.path.join(REPO, "examples", "bench", "mpi", "ranks.py"), "--impls", impls,
           "--sizes", args.sizes, "--rounds", str(args.rounds), "--target-s", str(args.target_s),
           "--warmup", str(args.warmup), "--min-iters", str(args.min_iters), "--json", out]
    procs = []
    for r in range(n * k):
        host = r // k
        argv = cmd if k == 1 else ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                                   "%s-host%d" % (lab.id, host)] + cmd
        procs.append(subprocess.Popen(lab.cmd(host, argv), env=dict(env, RANK=str(r))))
    rcs = [p.wait() for p in procs]
    if any(rcs):
        raise SystemExit("ranks.py on %d hosts at %d Mbit/s failed: exit %s" % (n, lab.rate_mbit, rcs))
    with open(out) as f:
        return json.load(f)


def gbits(size, world, sec):
    return 2 * (world - 1) / world * size * 8 / sec / 1e9


def human(n):
    return "%d MiB" % (n >> 20) if n >= 1 << 20 else "%d KiB" % (n >> 10)


def cell(v):
    return "%.2f (%.2f–%.2f)" % (statistics.median(v), min(v), max(v))


def table(results):
    if results and results[0].get("per_host", 1) > 1:
        return hier_table(results)
    lines = ["| link | ranks | stream, Gbit/s | size | ring busbw, Gbit/s | gloo busbw, Gbit/s "
             "| ring / link rate | ring / stream | ring / gloo |", "|---:" * 9 + "|"]
    for res in results:
        rate, n, stream = res["rate_mbit"] / 1000, res["world"], statistics.median(res["streams"])
        for row in res["ranks"]["rows"]:
            ring = [gbits(row["bytes"], n, s) for s in row["seconds"]["tcp"]]
            gloo = [gbits(row["bytes"], n, s) for s in row["seconds"]["gloo"]]
            r, g = statistics.median(ring), statistics.median(gloo)
            lines.append("| %g Gbit/s | %d | %.2f | %s%s | %s | %s | %.2f | %.2f | %.2f |" % (
                rate, n, stream, human(row["bytes"]), "" if row["correct"] else " **WRONG**",
                cell(ring), cell(gloo), r / rate, r / stream, r / g))
    return "\n".join(lines)


def hier_table(results):
    """The hierarchical all-reduce beside the flat ring and gloo, all over the job's n*k ranks."""
    lines = ["| link | hosts × ranks | size | hierarchical, Gbit/s | flat ring, Gbit/s | gloo, Gbit/s "
             "| hierarchical / flat ring | hierarchical / gloo | hierarchical / ideal |", "|---:" * 9 + "|"]
    for res in results:
        rate, n, k = res["rate_mbit"] / 1000, res["world"], res["per_host"]
        world = n * k
        # Each host's link carries 2(n-1)/n of the buffer each way: busbw over world ranks then
        # tops out at rate * (2(world-1)/world) / (2(n-1)/n).
        ideal = rate * ((world - 1) / world) / ((n - 1) / n)
        for row in res["ranks"]["rows"]:
            h, f, g = ([gbits(row["bytes"], world, s) for s in row["seconds"][impl]] for impl in ("hierarchical", "tcp", "gloo"))
            mh = statistics.median(h)
            lines.append("| %g Gbit/s | %d × %d | %s%s | %s | %s | %s | %.2f | %.2f | %.2f |" % (
                rate, n, k, human(row["bytes"]), "" if row["correct"] else " **WRONG**", cell(h), cell(f), cell(g),
                mh / statistics.median(f), mh / statistics.median(g), mh / ideal))
    return "\n".join(lines)


def conditions(args, netem):
    cpu = ""
    with open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    delay = "%d us one way per hop (netem)" % args.delay_us if args.delay_us else (
        "no added delay" + ("" if netem else " (this kernel has no sch_netem)"))
    return "# %s; %s, %d CPUs; kernel %s; links: tbf, %s; load average %.2f" % (
        cpu, platform.machine(), os.cpu_count(), platform.release(), delay, os.getloadavg()[0])


def main():
    args = parse_args()
    missing = [t for t in ("ip", "tc") if not shutil.which(t)]
    if os.geteuid() != 0 or missing:  # make bench runs it: say so and go on
        print("# links benchmark skipped: needs root and iproute2 (ip, tc) to create network namespaces, "
              "veth pairs and qdiscs%s" % (", missing: " + " ".join(missing) if missing else ""), flush=True)
        return
    if not os.path.exists(args.shim):
        raise SystemExit("no shim at %s: make build first" % args.shim)
    netem = netlab.have_netem()
    if args.delay_us and not netem:
        raise SystemExit("--delay-us needs sch_netem, which this kernel lacks")
    print(conditions(args, netem), flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="ddp-bench-links-") as tmp:
        for rate in [int(x) for x in args.rates.split(",")]:
            for n in [int(x) for x in args.ranks.split(",")]:
                with netlab.Lab(n, rate, args.delay_us) as lab:
                    st = []
                    for _ in range(args.stream_runs):
                        st += streams(lab, args.stream_s)
                    print("# %d Mbit/s, %d hosts: streams %s Gbit/s" % (rate, n, " ".join("%.2f" % x for x in st)),
                          file=sys.stderr, flush=True)
                    t0 = time.time()
                    res = {"rate_mbit": rate, "world": n, "per_host": args.per_host, "streams": st,
                           "ranks": ranks(args, lab, tmp)}
                    res["seconds"] = time.time() - t0
                    results.append(res)
    print()
    print(table(results))
    print("\nfloat32 sum in place; busbw = 2(n-1)/n * bytes * 8 / time, median (min–max) of %d alternating rounds "
          "(a round: the slowest rank's mean per collective); stream: median Gbit/s of the plain TCP streams, one per "
          "link direction at once. Load average at the end: %.2f." % (args.rounds, os.getloadavg()[0]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"conditions": conditions(args, netem), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
