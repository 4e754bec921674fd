"""Where the time of a small shim all-reduce goes, layer by layer, as the ranks see it from Python.

    DDP_AGENT_SHIM=bin/libddpshim.so /usr/bin/python3 examples/bench/mpi/latency.py [--ranks 2] [--bytes 65536]

It starts --ranks copies of itself (torch's store bootstraps the shim, over
gloo) and, with the ranks in step, times per collective, as medians of
--rounds rounds of the slowest rank's mean:
  call        one ctypes call into the library that does nothing
              (ddpshim_work_test on a finished work): ctypes + cgo + handle table
  ar0+wait    ddpshim_allreduce of 0 elements + ddpshim_work_wait + free: the
              whole stack's synchronisation with no data
  ar+wait     the same with --bytes of float32 (the benchmark's case), split
              into its three calls (enqueue, wait, free)
  ar+poll     the same, but polling ddpshim_work_test instead of blocking in
              ddpshim_work_wait: no wake-up of the calling thread
The Go-side layers below the C ABI (host.Comm, shm.Comm alone) are
BenchmarkAllReduce in shim/host/shm; docs/benchmarks.md puts them together.
"""

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # examples/bench: allreduce.py's helpers
import allreduce as base  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

_shim = base._shim


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--bytes", type=int, default=64 << 10)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--shim-config", default="{}")
    p.add_argument("--cases", default="", help="comma-separated subset of the cases (default: all)")
    p.add_argument("--bind", action="store_true",
                   help="pin rank r to CPU r, as mpirun's default --bind-to core does for 2 ranks")
    return p.parse_args()


def spawn(args):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000),
               WORLD_SIZE=str(args.ranks))
    env.pop("DDP_AGENT_SOCKET", None)
    procs = [subprocess.Popen([sys.executable] + sys.argv, env=dict(env, RANK=str(r))) for r in range(args.ranks)]
    return max(p.wait() for p in procs)


def main():
    args = parse_args()
    if "RANK" not in os.environ:
        sys.exit(spawn(args))
    import json

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.bind:
        os.sched_setaffinity(0, {rank % os.cpu_count()})  # before the library starts its threads
    dist.init_process_group("gloo", init_method="env://")
    comm = base.open_comm(rank, world, json.loads(args.shim_config), 60000)
    lib = _shim._library()
    h = comm.handle
    t = torch.zeros(args.bytes // 4, dtype=torch.float32)
    ptr, n = t.data_ptr(), t.numel()
    work, done = ctypes.c_int64(0), ctypes.c_int(0)

    def ok(rc):  # a failed call returns at once: its time would mean nothing
        if rc:
            raise SystemExit("rank %d: shim call failed (%d): %s" % (rank, rc, lib.ddpshim_last_error()))
    F32, SUM = int(_shim.DType.FLOAT32), int(_shim.Op.SUM)

    ok(lib.ddpshim_allreduce(h, ptr, 0, F32, SUM, None, 0, 0, ctypes.byref(work)))
    ok(lib.ddpshim_work_wait(work.value))
    finished = work.value  # kept: the null call's target

    def call():
        lib.ddpshim_work_test(finished, ctypes.byref(done))

    def ar_wait(count):
        def run():
            ok(lib.ddpshim_allreduce(h, ptr, count, F32, SUM, None, 0, 0, ctypes.byref(work)))
            ok(lib.ddpshim_work_wait(work.value))
            ok(lib.ddpshim_work_free(work.value))
        return run

    split = {"enqueue": [], "wait": [], "free": []}

    def ar_split():
        t0 = time.perf_counter()
        ok(lib.ddpshim_allreduce(h, ptr, n, F32, SUM, None, 0, 0, ctypes.byref(work)))
        t1 = time.perf_counter()
        ok(lib.ddpshim_work_wait(work.value))
        t2 = time.perf_counter()
        ok(lib.ddpshim_work_free(work.value))
        t3 = time.perf_counter()
        split["enqueue"].append(t1 - t0)
        split["wait"].append(t2 - t1)
        split["free"].append(t3 - t2)

    def ar_poll():
        ok(lib.ddpshim_allreduce(h, ptr, n, F32, SUM, None, 0, 0, ctypes.byref(work)))
        w = work.value
        while True:
            lib.ddpshim_work_test(w, ctypes.byref(done))
            if done.value:
                break
        ok(lib.ddpshim_work_wait(w))
        ok(lib.ddpshim_work_free(w))

    cases = [("call", call), ("ar0+wait", ar_wait(0)), ("ar+wait", ar_wait(n)), ("ar+poll", ar_poll),
             ("ar+wait (split)", ar_split)]
    if args.cases:
        cases = [c for c in cases if c[0] in args.cases.split(",")]
    res = {name: [] for name, _ in cases}
    for _ in range(args.rounds):
        for name, fn in cases:  # alternating, as the other benchmarks do
            for _ in range(20):
                fn()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                fn()
            res[name].append(base.agree_max((time.perf_counter() - t0) / args.iters))
    if rank == 0:
        print("# %s: %d ranks%s, %d bytes, transport %s; µs per collective, median (min–max) of %d rounds of %d"
              % (_shim.library_path(), world, " bound to a CPU each" if args.bind else "", args.bytes,
                 comm.info().get("transport"), args.rounds, args.iters))
        for name, v in res.items():
            print("%-16s %8.1f  (%.1f–%.1f)" % (name, 1e6 * statistics.median(v), 1e6 * min(v), 1e6 * max(v)))
        for name, v in split.items():
            if not v:
                continue
            print("  split %-8s %8.1f  (p10 %.1f, p90 %.1f) this rank" % (
                name, 1e6 * statistics.median(v), 1e6 * sorted(v)[len(v) // 10], 1e6 * sorted(v)[9 * len(v) // 10]))
        info = comm.info()
        print("  collectives %d, run by a waiter %s" % (info.get("collectives", 0), info.get("run_by_waiter", "n/a")))
        sys.stdout.flush()
    dist.barrier()
    ok(lib.ddpshim_work_free(finished))
    comm.close()
    os._exit(0)


if __name__ == "__main__":
    main()
