"""All-reduce bandwidth of libddpshim.so's host transport against gloo, nccl-tests style.

Run it with two (or more) workers on one machine, under ddp-agent or torchrun:

    bin/ddp-agent run --standalone --nproc-per-node 2 --python /usr/bin/python3 examples/bench/allreduce.py
    torchrun --standalone --nproc_per_node 2 examples/bench/allreduce.py

For each size (float32, sum, in place; 64 KiB to 256 MiB, x4) every rank first
checks one all-reduce of each implementation against the exact expected sum,
then times the shim (ddpshim_allreduce + ddpshim_work_wait, one collective at a
time) and gloo (torch.distributed.all_reduce on the default gloo group, which
also blocks until done), alternating them for --rounds rounds so that drift in
machine load hits both alike. A round runs a few warm-up collectives, then as
many timed ones as fit in --target-s (within --min-iters and --max-iters; every
rank runs the same count). The time of a round is the slowest rank's mean per
collective; the table shows the median round. As in nccl-tests:
algbw = bytes / time, busbw = algbw * 2(n-1)/n.

Rank 0 prints a Markdown table. The shim is called through the ddp_agent
package's binding (python/ on sys.path if it is not installed), which finds it
through DDP_AGENT_SHIM (ddp-agent sets it for its workers) or next to the
package. Under ddp-agent the
shim bootstraps through the agent's control socket (DDP_AGENT_SOCKET); under
torchrun the ranks exchange the shim's bootstrap blobs through torch's store.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:
    from ddp_agent import _shim  # the package's ctypes binding of shim/ddpshim.h
except ImportError:
    sys.path.insert(0, os.path.join(REPO, "python"))
    from ddp_agent import _shim


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--min-bytes", type=int, default=64 << 10)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds per size; the median is shown")
    p.add_argument("--warmup", type=int, default=3, help="untimed collectives before each round")
    p.add_argument("--target-s", type=float, default=0.4, help="timed seconds per round, roughly")
    p.add_argument("--min-iters", type=int, default=3)
    p.add_argument("--max-iters", type=int, default=2000)
    p.add_argument("--shim-config", default="{}",
                   help='extra JSON for ddpshim_open, e.g. \'{"shm": false}\' for the TCP ring')
    p.add_argument("--timeout-ms", type=int, default=120000)
    p.add_argument("--json", help="rank 0 also writes the results here")
    return p.parse_args()


def allreduce(comm, t, step):
    """One blocking all-reduce through the shim, as the hook issues it (minus the waiter thread)."""
    work = comm.allreduce(t.data_ptr(), t.numel(), _shim.DType.FLOAT32, _shim.Op.SUM, step=step)
    try:
        work.wait()
    finally:
        work.free()


def open_comm(rank, world, extra, timeout_ms):
    config = {"rank": rank, "world_size": world, "transport": "host", "timeout_ms": timeout_ms,
              "name": "allreduce-bench", "master_addr": os.environ.get("MASTER_ADDR", "127.0.0.1")}
    sock = os.environ.get("DDP_AGENT_SOCKET")
    if sock:  # under ddp-agent: bootstrap through its control socket
        config.update(bootstrap="agent", socket=sock, generation=int(os.environ.get("DDP_AGENT_GENERATION", "0")),
                      local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    else:  # under torchrun: exchange the blobs through torch's store
        config.update(bootstrap="external")
    config.update(extra)
    comm = _shim.Comm.open(config)
    if config["bootstrap"] == "external":
        blobs = [None] * world
        dist.all_gather_object(blobs, comm.bootstrap_info())
        comm.connect(blobs)
    return comm


def fill_pattern(t, rank):
    # Small integers: every partial sum is exact in float32, whatever the reduction order.
    torch.remainder(torch.arange(t.numel(), dtype=torch.float32), 251, out=t)
    t.add_(rank)


def expected(numel, world):
    e = torch.remainder(torch.arange(numel, dtype=torch.float32), 251).mul_(world)
    return e.add_(world * (world - 1) / 2)


def agree_max(x):
    """Returns the largest x over all ranks (through gloo: a tiny collective)."""
    t = torch.tensor([float(x)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def time_round(run, args, step0):
    """Runs one round of one implementation; returns the slowest rank's seconds per collective."""
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(args.warmup):
        run(step0 + i)
    per = agree_max((time.perf_counter() - t0) / max(args.warmup, 1))
    iters = int(min(args.max_iters, max(args.min_iters, args.target_s / max(per, 1e-9))))
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(iters):
        run(step0 + args.warmup + i)
    return agree_max((time.perf_counter() - t0) / iters), iters


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return "%d %s" % (n, unit) if n == int(n) else "%.1f %s" % (n, unit)
        n /= 1024


def main():
    args = parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://")
    version = _shim.version()
    comm = open_comm(rank, world, json.loads(args.shim_config), args.timeout_ms)
    info = comm.info()
    launcher = "ddp-agent" if os.environ.get("DDP_AGENT_SOCKET") else "torchrun"
    if rank == 0:
        print("# %s; comm %s; %d ranks under %s; torch %s; %s, %d CPUs; load average %.2f"
              % (version, json.dumps(info, sort_keys=True), world, launcher, torch.__version__,
                 platform.machine(), os.cpu_count(), os.getloadavg()[0]), flush=True)

    sizes = []
    n = args.min_bytes
    while n <= args.max_bytes:
        sizes.append(n)
        n *= args.factor
    buf = torch.empty(args.max_bytes // 4, dtype=torch.float32)
    factor = 2 * (world - 1) / world
    rows, step, failed = [], 0, False
    for size in sizes:
        t = buf[: size // 4]
        want = expected(t.numel(), world)
        ok = {}
        for name, run in (("shim", lambda s: allreduce(comm, t, s)), ("gloo", lambda s: dist.all_reduce(t))):
            fill_pattern(t, rank)
            run(step)
            step += 1
            ok[name] = bool(torch.equal(t, want))
        bad = agree_max(0 if all(ok.values()) else 1) > 0
        if bad:
            failed = True
            print("rank %d: WRONG RESULT at %s: %s" % (rank, human(size), ok), file=sys.stderr, flush=True)
        t.zero_()  # timed collectives sum zeros: no overflow however many run
        times = {"shim": [], "gloo": []}
        iters = {"shim": 0, "gloo": 0}
        for _ in range(args.rounds):
            for name, run in (("shim", lambda s: allreduce(comm, t, s)), ("gloo", lambda s: dist.all_reduce(t))):
                sec, it = time_round(run, args, step)
                step += args.warmup + it
                times[name].append(sec)
                iters[name] += it
        row = {"bytes": size, "count": t.numel(), "correct": not bad}
        for name in ("shim", "gloo"):
            sec = statistics.median(times[name])
            algbw = size / sec / 1e9
            row[name] = {"time_us": sec * 1e6, "algbw": algbw, "busbw": algbw * factor,
                         "iters": iters[name], "rounds_us": [x * 1e6 for x in times[name]]}
        row["ratio"] = row["shim"]["busbw"] / row["gloo"]["busbw"]
        rows.append(row)
        if rank == 0:
            print("# %s: shim %.1f us, gloo %.1f us, ratio %.2f%s" % (human(size), row["shim"]["time_us"],
                  row["gloo"]["time_us"], row["ratio"], "" if row["correct"] else " WRONG RESULT"),
                  file=sys.stderr, flush=True)

    if rank == 0:
        print()
        print("| size | count (float32) | shim time (µs) | shim algbw (GB/s) | shim busbw (GB/s) "
              "| gloo time (µs) | gloo algbw (GB/s) | gloo busbw (GB/s) | busbw ratio shim/gloo | correct |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|")
        for r in rows:
            s, g = r["shim"], r["gloo"]
            print("| %s | %d | %.1f | %.3f | %.3f | %.1f | %.3f | %.3f | %.2f | %s |" % (
                human(r["bytes"]), r["count"], s["time_us"], s["algbw"], s["busbw"],
                g["time_us"], g["algbw"], g["busbw"], r["ratio"], "yes" if r["correct"] else "**NO**"))
        print()
        print("%d ranks, float32 sum in place; time: median of %d alternating rounds of the slowest rank's "
              "mean per collective; busbw = algbw * 2(n-1)/n. Shim transport: %s. Load average at the end: %.2f "
              "(other work on the machine skews the figures)." % (
                  world, args.rounds, info.get("transport", "?"), os.getloadavg()[0]), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"shim_version": version, "comm_info": info, "world_size": world,
                           "launcher": launcher, "torch": torch.__version__, "rows": rows}, f, indent=1)

    dist.barrier()
    comm.close()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if failed else 0)  # no teardown of gloo's threads (the hang train.py describes)


if __name__ == "__main__":
    main()
