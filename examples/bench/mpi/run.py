"""All-reduce of the shim against gloo, OpenMPI and the memory-bandwidth ceiling, in one run.

    examples/bench/mpi/deps.sh            # OpenMPI and mpi4py from Debian (once)
    /usr/bin/python3 examples/bench/mpi/run.py [--ranks 2,4] [--shim bin/libddpshim.so]

For each rank count it
  1. builds examples/bench/memceiling (gcc -O2) and measures the memory
     ceiling of an all-reduce at 64 and 256 MiB (memceiling.c says what that
     is);
  2. launches ranks.py under mpirun three times, once per OpenMPI allreduce
     algorithm: the default decision, then forced ring and Rabenseifner
     (coll_tuned_allreduce_algorithm 4 and 6: the numbering of OpenMPI 4.1's
     coll_tuned_allreduce_decision.c, which `ompi_info --param coll tuned
     --level 9` prints too). The first launch alternates the shim's shared
     memory, the shim's TCP ring, gloo and MPI; the other two alternate the
     shim's shared memory and MPI, so the shim's figure pools every launch.
Without mpirun or mpi4py it launches ranks.py itself, without the MPI column.

It prints a Markdown table: busbw GB/s as median (min-max) of the rounds,
the ratios of the shim's shared memory to the best OpenMPI algorithm and to
the ceiling, and the time of a 64 KiB all-reduce. --json keeps everything.
"""

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))

# name, extra mpirun arguments, implementations run beside it.
MPI_VARIANTS = [
    ("default", [], "shm,tcp,gloo,mpi"),
    ("ring", ["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm", "4"], "shm,mpi"),
    ("rabenseifner", ["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm", "6"],
     "shm,mpi"),
]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--shim", default=os.path.join(REPO, "bin", "libddpshim.so"))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--sizes", default=",".join(str(64 << 10 << 2 * i) for i in range(7)), help="bytes, comma-separated")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--target-s", type=float, default=0.25)
    p.add_argument("--ceiling-reps", type=int, default=7)
    p.add_argument("--ceiling-mib", default="64,256", help="sizes of the memory ceiling, MiB")
    p.add_argument("--memceiling", help="a built examples/bench/memceiling (default: build it with gcc)")
    p.add_argument("--no-mpi", action="store_true", help="skip OpenMPI even when installed")
    p.add_argument("--bind-to", default="", help="mpirun --bind-to (core, none, ...; default: mpirun's own)")
    p.add_argument("--json", help="write every measurement here")
    return p.parse_args()


def have_mpi(python):
    if not shutil.which("mpirun"):
        return False
    return subprocess.run([python, "-c", "import mpi4py"], capture_output=True).returncode == 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ceiling(world, reps, mib, tmp, exe=None):
    exe = exe or os.path.join(tmp, "memceiling")
    if not os.path.exists(exe):
        subprocess.run(["gcc", "-O2", "-o", exe, os.path.join(HERE, "..", "memceiling", "memceiling.c")], check=True)
    out = subprocess.run([exe, "-n", str(world), "-r", str(reps)] + mib.split(","),
                         check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def launch(args, world, variant, tmp):
    """Runs ranks.py on world ranks; returns rank 0's JSON."""
    name, mca, impls = variant
    out = os.path.join(tmp, "ranks-%d-%s.json" % (world, name))
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), DDP_AGENT_SHIM=args.shim)
    env.pop("DDP_AGENT_SOCKET", None)  # the shim bootstraps through torch's store here
    cmd = [args.python, os.path.join(HERE, "ranks.py"), "--impls", impls, "--sizes", args.sizes,
           "--rounds", str(args.rounds), "--target-s", str(args.target_s), "--json", out]
    if mca is None:  # no OpenMPI: start the ranks ourselves
        procs = [subprocess.Popen(cmd, env=dict(env, RANK=str(r), WORLD_SIZE=str(world))) for r in range(world)]
        rcs = [p.wait() for p in procs]
    else:
        mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(world),
                  "-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "DDP_AGENT_SHIM"] + mca
        if args.bind_to:
            mpirun += ["--bind-to", args.bind_to]
        rcs = [subprocess.run(mpirun + cmd, env=env).returncode]
    if any(rcs):
        raise SystemExit("ranks.py on %d ranks (%s) failed: exit %s" % (world, name, rcs))
    with open(out) as f:
        return json.load(f)


def busbw(size, world, sec):
    return 2 * (world - 1) / world * size / sec / 1e9


def summarize(world, launches, ceil):
    """Returns {size: {column: [busbw of each round]}} and {column: 64 KiB seconds}."""
    cols = {}
    for variant, res in launches:
        for row in res["rows"]:
            c = cols.setdefault(row["bytes"], {})
            if not row["correct"]:
                c["wrong"] = True
            for impl, secs in row["seconds"].items():
                key = "mpi " + variant if impl == "mpi" else impl
                c.setdefault(key, []).extend(busbw(row["bytes"], world, s) for s in secs)
    for e in ceil:
        c = cols.setdefault(e["bytes"], {})
        if statistics.median(e["busbw"]) > statistics.median(c.get("ceiling", [0])):
            c["ceiling"] = e["busbw"]  # the faster way of reading and writing S bytes
    return cols


def cell(v):
    if not v:
        return "–"
    return "%.2f (%.2f–%.2f)" % (statistics.median(v), min(v), max(v))


def human(n):
    return "%d MiB" % (n >> 20) if n >= 1 << 20 else "%d KiB" % (n >> 10)


def table(world, cols, mpi):
    heads = ["shm", "tcp", "gloo"] + (["mpi " + v[0] for v in MPI_VARIANTS] if mpi else []) + ["ceiling"]
    names = {"shm": "shim shm", "tcp": "shim TCP ring", "gloo": "gloo", "ceiling": "memory ceiling"}
    lines = ["", "**%d ranks**, busbw GB/s, median (min–max) of the rounds:" % world, "",
             "| size | " + " | ".join(names.get(h, h.replace("mpi ", "OpenMPI ").replace("rabenseifner", "Rabenseifner")) for h in heads)
             + (" | shm / OpenMPI best" if mpi else "") + " | shm / ceiling |",
             "|---:" * (len(heads) + 1 + (1 if mpi else 0) + 1) + "|"]
    for size in sorted(cols):
        c = cols[size]
        med = {h: statistics.median(c[h]) for h in heads if c.get(h)}
        r = ["%s%s" % (human(size), " **WRONG**" if c.get("wrong") else "")] + [cell(c.get(h)) for h in heads]
        best = max((med[h] for h in med if h.startswith("mpi ")), default=0)
        if mpi:
            r.append("%.2f" % (med["shm"] / best) if best and "shm" in med else "–")
        r.append("%.2f" % (med["shm"] / med["ceiling"]) if "ceiling" in med and "shm" in med else "–")
        lines.append("| " + " | ".join(r) + " |")
    small = min(cols)
    lat = ", ".join("%s %.1f" % (names.get(h, h.replace("mpi ", "OpenMPI ").replace("rabenseifner", "Rabenseifner")),
                                 busbw(small, world, 1) / statistics.median(cols[small][h]) * 1e6)
                    for h in heads if cols[small].get(h))
    lines += ["", "Time of one %s all-reduce, µs (median round): %s." % (human(small), lat)]
    return "\n".join(lines)


def conditions(mpi):
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    ompi = ""
    if mpi:
        ompi = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    return "# %s; %s, %d CPUs; kernel %s; load average %.2f; %s" % (
        cpu, platform.machine(), os.cpu_count(), platform.release(), os.getloadavg()[0], ompi or "no OpenMPI")


def main():
    args = parse_args()
    if not os.path.exists(args.shim):
        raise SystemExit("no shim at %s: make build first" % args.shim)
    mpi = not args.no_mpi and have_mpi(args.python)
    if not mpi and not args.no_mpi:
        print("# OpenMPI or mpi4py missing: examples/bench/mpi/deps.sh installs them; running without", flush=True)
    print(conditions(mpi), flush=True)
    out = {"conditions": conditions(mpi), "worlds": {}}
    tables = []
    with tempfile.TemporaryDirectory(prefix="ddp-bench-mpi-") as tmp:
        for world in [int(x) for x in args.ranks.split(",")]:
            ceil = ceiling(world, args.ceiling_reps, args.ceiling_mib, tmp, args.memceiling)
            variants = MPI_VARIANTS if mpi else [("none", None, "shm,tcp,gloo")]
            launches = [(v[0], launch(args, world, v, tmp)) for v in variants]
            cols = summarize(world, launches, ceil)
            out["worlds"][world] = {"ceiling": ceil, "launches": dict(launches)}
            tables.append(table(world, cols, mpi))
            print(tables[-1], flush=True)
    print("\nfloat32 sum in place; busbw = 2(n-1)/n * bytes / time; a round is the slowest rank's mean time per "
          "collective; mpirun --oversubscribe, --bind-to %s. Load average at the end: %.2f."
          % (args.bind_to or "(mpirun's default: core for up to 2 ranks, else socket)", os.getloadavg()[0]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
