"""Per-bucket host cost of the ddp_agent hook (transport "nccl", fake NCCL) against PyTorch's allreduce_hook (gloo).

A regression figure for CI machines without a GPU. It builds the fake NCCL
of shim/nccl/testdata/fakenccl.c with gcc, as python/tests/test_nccl.py
does, points the shim at it ($DDP_AGENT_NCCL_LIB), and starts two ranks on
this machine (gloo on 127.0.0.1, torchrun's environment, no launcher). Each
rank trains three identical DDP models on the CPU, side by side, one step of
each in turn (the order rotating every step, so drift in machine load hits
them alike):

  nccl  ddp_agent.register(ddp, transport="nccl"): the shim's NCCL path on
        the fake, a real 2-rank NCCL communicator
  nccl-thread  the same with launch="thread": the autograd thread only queues
        the bucket (and waits for the launcher thread at a step's last one);
        its timed call is what backward pays
  gloo  DDP with PyTorch's built-in default_hooks.allreduce_hook on the gloo
        process group: what a user would otherwise run
  host  ddp_agent.register(ddp, transport="host"): the shim's host transport

The function each model registers is wrapped so that every call DDP makes to
it (one per bucket) is timed with time.perf_counter_ns: the host time from
the hook's entry to the Future it returns. Inside that, the calls into the
shim's binding (Comm.enqueue for the NCCL transport; Comm.allreduce, and
Work.free where the hook itself frees, for the host transport)
are timed as well; the rest is the hook's Python. DDP's own cost of calling
a Python hook (the GIL, wrapping the bucket for Python) is outside it and
the same for all three.

The three are not the same kind of call. gloo's hook and the host transport
only start the all-reduce and return; the NCCL transport with a CPU bucket
returns once the fake has reduced it (on a GPU the same call returns once
NCCL has enqueued the kernel). The fake exchanges buckets through files and
waits for its peer in 1 ms sleeps, so the "nccl" figure is mostly the fake
and the other rank. That is why the run also times the shim alone: on a
communicator of its own, an all-reduce of count 0, which the fake answers at
once, costs what the shim adds per bucket whatever the NCCL (ctypes, the
cgo call into Go, the handle table, the call into NCCL and the polling of
its state), next to a call into the .so that stays in C (ddpshim_version)
and one that enters Go and does nothing (ddpshim_work_test). Hook Python
plus that count-0 call is the estimated host cost of the hook on a real
NCCL, before NCCL's own enqueue.

Buckets are small (--bucket-mb 0.25, a model of --layers Linear(--width,
--width) layers: one layer a bucket, but DDP's first bucket, of up to 1 MiB,
takes four): the host cost of a call hardly depends on the size, but the
fake and gloo move the bytes on the CPU, and the fake keeps a file per
bucket (removed here after every step).

    /usr/bin/python3 examples/bench/hook_cost.py --steps 50 --warmup 5

Prints Markdown tables, then one JSON line with every figure (also written
to --json). Needs gcc, PyTorch, and `make build` (libddpshim.so from bin/,
or $DDP_AGENT_SHIM).
"""

import argparse
import ctypes
import functools
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ranks as rankrun  # noqa: E402  (examples/bench/ranks.py)
FAKE_SOURCE = os.path.join(REPO, "shim", "nccl", "testdata", "fakenccl.c")
MODES = ("nccl", "nccl-thread", "gloo", "host")
NAMES = {
    "nccl": 'ddp_agent hook, transport "nccl" (fake NCCL)',
    "nccl-thread": 'the same with launch="thread" (the autograd thread\'s part only)',
    "gloo": "PyTorch allreduce_hook (gloo)",
    "host": 'ddp_agent hook, transport "host"',
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=50, help="timed steps per model")
    p.add_argument("--warmup", type=int, default=5,
                   help="untimed steps first (the first opens the communicators; DDP rebuilds its buckets after it)")
    p.add_argument("--bucket-mb", type=float, default=0.25, help="DDP's bucket_cap_mb")
    p.add_argument("--layers", type=int, default=16, help="Linear layers in the model")
    p.add_argument("--width", type=int, default=256, help="their width (256: 257 KiB of float32 gradients a layer)")
    p.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    p.add_argument("--probe-iters", type=int, default=2000, help="calls per probe of the shim alone")
    p.add_argument("--timeout", type=float, default=300, help="seconds for the whole run")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # the ranks: their output directory
    return p.parse_args()


def percentile(xs, q):
    """Nearest-rank percentile of a non-empty list."""
    s = sorted(xs)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


# -- the ranks ---------------------------------------------------------------

_tls = threading.local()  # .calls: shim call times (ns) of the hook invocation running on this thread
_recording = False


def _timed_shim_call(fn):
    """Wraps a method of the shim's binding: times it when a timed hook invocation on this thread made the call."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        calls = getattr(_tls, "calls", None)
        if calls is None:  # not inside a timed hook (the host waiter thread, the probes)
            return fn(*args, **kwargs)
        t0 = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            calls.append(time.perf_counter_ns() - t0)

    return wrapper


def _timed_hook(samples, fn):
    """Wraps a comm hook: one sample (total ns, shim ns, bucket bytes) per call while recording.

    functools.wraps keeps the signature DDP checks (a parameter named bucket).
    """

    @functools.wraps(fn)
    def hook(state, bucket):
        _tls.calls = []
        t0 = time.perf_counter_ns()
        try:
            fut = fn(state, bucket)
        finally:
            t1 = time.perf_counter_ns()
            calls, _tls.calls = _tls.calls, None
        if _recording:
            buf = bucket.buffer()
            samples.append((t1 - t0, sum(calls), buf.numel() * buf.element_size()))
        return fut

    return hook


def _register_timed(ddp, samples, register):
    """Runs register(ddp) with ddp.register_comm_hook wrapping whatever function it registers."""
    orig = ddp.register_comm_hook
    ddp.register_comm_hook = lambda state, fn: orig(state, _timed_hook(samples, fn))
    try:
        return register(ddp)
    finally:
        del ddp.register_comm_hook  # the instance attribute goes; the method shows again


def _clean_fake_files(fake_dir):
    """Removes the fake's per-collective files (ar.SEQ.RANK): it keeps every bucket, 4 MiB a step per rank here.

    Called only after a barrier that every rank reached after its backward,
    so no rank still waits for or reads any of them.
    """
    for sub in os.listdir(fake_dir):
        d = os.path.join(fake_dir, sub)
        if os.path.isdir(d):
            for f in os.listdir(d):
                if re.fullmatch(r"ar\.\d+\.\d+", f):
                    os.remove(os.path.join(d, f))


def _probe_shim(args, rank, world, dist, torch, _shim):
    """Times the shim alone: all-reduces of count 0 on an NCCL communicator of its own, raw and through the binding."""
    lib = _shim._library()  # the ctypes.CDLL the binding uses (argtypes and restype set)
    config = {"rank": rank, "world_size": world, "transport": "nccl", "timeout_ms": 60000,
              "name": "hook-cost-probe", "bootstrap": "external", "master_addr": "127.0.0.1",
              "nccl_lib": os.environ["DDP_AGENT_NCCL_LIB"]}
    comm = _shim.Comm.open(config)
    blobs = [None] * world
    dist.all_gather_object(blobs, comm.bootstrap_info())
    comm.connect(blobs)
    buf = torch.zeros(16)
    ptr, n = buf.data_ptr(), args.probe_iters
    f32, avg = int(_shim.DType.FLOAT32), int(_shim.Op.AVG)
    out = {k: [] for k in ("version", "work_test", "allreduce0_raw", "work_free_raw", "allreduce0_binding")}
    work, done = ctypes.c_int64(0), ctypes.c_int(0)
    clock = time.perf_counter_ns
    # Count 0: the fake records it and returns ncclSuccess without its file
    # exchange or thread, so this is the shim's own path. Every rank makes
    # the same calls, so the fake's sequence numbers stay in step.
    dist.barrier()
    for i in range(n):
        t0 = clock()
        lib.ddpshim_version()
        t1 = clock()
        rc = lib.ddpshim_allreduce(comm.handle, ptr, 0, f32, avg, None, i, 0, ctypes.byref(work))
        t2 = clock()
        if rc != 0:
            raise _shim.ShimError(rc, (lib.ddpshim_last_error() or b"").decode(), "ddpshim_allreduce")
        lib.ddpshim_work_test(work.value, ctypes.byref(done))
        t3 = clock()
        lib.ddpshim_work_free(work.value)
        t4 = clock()
        comm.enqueue(ptr, 0, f32, avg, None, step=i, bucket=0)  # what the hook's _enqueue calls
        t5 = clock()
        out["version"].append(t1 - t0)
        out["allreduce0_raw"].append(t2 - t1)
        out["work_test"].append(t3 - t2)
        out["work_free_raw"].append(t4 - t3)
        out["allreduce0_binding"].append(t5 - t4)
    # One real bucket's worth on the same communicator, for scale: the fake's own cost.
    real = torch.zeros(args.width * args.width + args.width)
    out["allreduce_bucket_binding"] = []
    for i in range(min(n, 50)):
        t0 = clock()
        comm.enqueue(real.data_ptr(), real.numel(), f32, avg, None, step=n + i, bucket=0)
        out["allreduce_bucket_binding"].append(clock() - t0)
    out["bucket_bytes"] = real.numel() * 4
    info = comm.info()
    dist.barrier()
    comm.close()
    return out, info


def worker(args):
    global _recording
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ddp_agent
    from ddp_agent import _shim

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://")
    # Every Comm.allreduce and Work.free inside a timed hook is timed too
    # (the class attributes, in this process only).
    _shim.Comm.allreduce = _timed_shim_call(_shim.Comm.allreduce)
    _shim.Comm.enqueue = _timed_shim_call(_shim.Comm.enqueue)
    _shim.Work.free = _timed_shim_call(_shim.Work.free)

    def make():
        torch.manual_seed(0)
        layers = []
        for _ in range(args.layers):
            layers += [torch.nn.Linear(args.width, args.width), torch.nn.Tanh()]
        return DDP(torch.nn.Sequential(*layers), bucket_cap_mb=args.bucket_mb)

    samples = {m: [] for m in MODES}
    models, hooks = {}, {}
    models["nccl"] = make()
    hooks["nccl"] = _register_timed(models["nccl"], samples["nccl"],
                                    lambda d: ddp_agent.register(d, transport="nccl", timeout=60))
    models["nccl-thread"] = make()
    hooks["nccl-thread"] = _register_timed(models["nccl-thread"], samples["nccl-thread"],
                                           lambda d: ddp_agent.register(d, transport="nccl", timeout=60, launch="thread"))
    models["gloo"] = make()
    _register_timed(models["gloo"], samples["gloo"],
                    lambda d: d.register_comm_hook(None, default_hooks.allreduce_hook))
    models["host"] = make()
    hooks["host"] = _register_timed(models["host"], samples["host"],
                                    lambda d: ddp_agent.register(d, transport="host", timeout=60))

    step_ms = {m: [] for m in MODES}
    buckets = {m: [] for m in MODES}
    g = torch.Generator().manual_seed(rank)
    fake_dir = os.environ["FAKE_NCCL_DIR"]
    for step in range(args.warmup + args.steps):
        _recording = step >= args.warmup
        x = torch.randn(args.batch, args.width, generator=g)
        k = step % len(MODES)
        for mode in MODES[k:] + MODES[:k]:
            ddp = models[mode]
            ddp.zero_grad(set_to_none=True)
            before = len(samples[mode])
            t0 = time.perf_counter()
            ddp(x).pow(2).mean().backward()
            if _recording:
                step_ms[mode].append((time.perf_counter() - t0) * 1e3)
                buckets[mode].append(len(samples[mode]) - before)
        dist.barrier()
        if rank == 0:
            _clean_fake_files(fake_dir)
    _recording = False

    infos = {m: hooks[m].info() for m in hooks}
    probe, probe_info = _probe_shim(args, rank, world, dist, torch, _shim)
    nccl_info = _shim.nccl_info()
    for h in hooks.values():
        h.close()
    result = {"rank": rank, "samples": samples, "step_ms": step_ms, "buckets": buckets, "probe": probe,
              "comm_info": infos, "probe_info": probe_info, "nccl_info": nccl_info,
              "shim": {"path": _shim.library_path(), "version": _shim.version()}, "torch": torch.__version__}
    rankrun.write_result(args.worker, rank, result)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no teardown of gloo's threads (the hang examples/train.py describes)


# -- the launcher --------------------------------------------------------------

def build_fake(tmp):
    """Builds the fake libnccl.so.2 with the command python/tests/test_nccl.py uses."""
    if shutil.which("gcc") is None:
        sys.exit("hook_cost: gcc is needed to build the fake NCCL (%s)" % FAKE_SOURCE)
    out = os.path.join(tmp, "libnccl.so.2")
    r = subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-pthread", "-o", out, FAKE_SOURCE],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        sys.exit("hook_cost: building the fake NCCL failed:\n%s" % r.stderr)
    return out


def run_ranks(args, tmp, fake_lib, fake_dir):
    env = rankrun.base_env()
    for k in [k for k in env if k.startswith(("FAKE_NCCL_", "FAKE_CUDA_"))]:
        del env[k]  # the fake's defaults (NCCL 2.20.5, non-blocking, no failures), no record file
    # The fake is the CUDA driver too: the shim records its two events per
    # bucket and runs its watchdog, as on a GPU.
    # LD_PRELOAD: PyTorch 2.x from PyPI loads its own libnccl.so.2 on import,
    # which the shim would take before $DDP_AGENT_NCCL_LIB; preloaded, the
    # fake is the NCCL in the process on every PyTorch.
    env["LD_PRELOAD"] = " ".join(p for p in (fake_lib, env.get("LD_PRELOAD", "")) if p)
    env.update(DDP_AGENT_NCCL_LIB=fake_lib, DDP_AGENT_CUDA_LIB=fake_lib, FAKE_NCCL_DIR=fake_dir)
    return rankrun.run("hook_cost", __file__, tmp, env, args.timeout)


def stats_us(ns):
    us = [x / 1e3 for x in ns]
    return {"median_us": statistics.median(us), "p90_us": percentile(us, 90), "mean_us": statistics.fmean(us),
            "n": len(us)}


def main():
    args = parse_args()
    if args.worker:
        return worker(args)
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hook-cost-") as tmp:
        fake_lib = build_fake(tmp)
        # The fake's unique id holds its directory's path (at most 128 bytes): a short one under /tmp.
        fake_dir = tempfile.mkdtemp(prefix="fakenccl-", dir="/tmp" if os.path.isdir("/tmp") else None)
        try:
            ranks = run_ranks(args, tmp, fake_lib, fake_dir)
        finally:
            shutil.rmtree(fake_dir, ignore_errors=True)
    wall = time.monotonic() - t0

    # Every rank's samples pooled: the nccl figure includes waiting for the peer, on either side.
    rows = {}
    for m in MODES:
        s = [x for r in ranks for x in r["samples"][m]]
        total, shim = [x[0] for x in s], [x[1] for x in s]
        rows[m] = {
            "total": stats_us(total),
            "shim": stats_us(shim) if m != "gloo" else None,  # gloo's hook makes no shim calls
            "python": stats_us([a - b for a, b in zip(total, shim)]),
            "bucket_kib_median": statistics.median(x[2] for x in s) / 1024,
            "buckets_per_step": statistics.median(b for r in ranks for b in r["buckets"][m]),
            "step_ms_median": statistics.median(t for r in ranks for t in r["step_ms"][m]),
        }
    probe = {k: stats_us([x for r in ranks for x in r["probe"][k]])
             for k in ranks[0]["probe"] if isinstance(ranks[0]["probe"][k], list)}
    nccl, gloo, host = rows["nccl"], rows["gloo"], rows["host"]
    thread = rows["nccl-thread"]
    # What the hook would cost the host on a real NCCL, before NCCL's own
    # enqueue: its Python, plus the shim's path with an NCCL that does nothing.
    est_us = nccl["python"]["median_us"] + probe["allreduce0_binding"]["median_us"]
    ratio = nccl["total"]["median_us"] / gloo["total"]["median_us"]
    ratio_est = est_us / gloo["total"]["median_us"]

    r0 = ranks[0]
    ni = r0["nccl_info"]
    print("# %s (%s); NCCL: fake %s, version %s; 2 ranks (gloo on 127.0.0.1); torch %s; %s, %d CPUs; "
          "load average %.2f" % (r0["shim"]["version"], r0["shim"]["path"], ni.get("source"), ni.get("version"),
                                 r0["torch"], platform.machine(), os.cpu_count(), load0))
    print("# model: %d x Linear(%d, %d), bucket_cap_mb %g, batch %d; %d timed steps per model after %d warm-up, "
          "rotating; samples of both ranks pooled" % (args.layers, args.width, args.width, args.bucket_mb,
                                                     args.batch, args.steps, args.warmup))
    print()
    print("| hook (per bucket, host time from entry to returned Future) | median (µs) | p90 (µs) | mean (µs) "
          "| shim calls, median (µs) | hook Python, median (µs) | buckets | buckets/step | bucket (KiB) "
          "| fwd+bwd step (ms) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, m in enumerate(MODES):
        r = rows[m]
        shim_cell = "—" if m == "gloo" else "%.1f" % r["shim"]["median_us"]
        py_cell = "%.1f" % r["python"]["median_us"]
        print("| (%d) %s | %.1f | %.1f | %.1f | %s | %s | %d | %g | %.0f | %.2f |" % (
            i + 1, NAMES[m], r["total"]["median_us"], r["total"]["p90_us"], r["total"]["mean_us"], shim_cell,
            py_cell, r["total"]["n"], r["buckets_per_step"], r["bucket_kib_median"], r["step_ms_median"]))
    print()
    print("| the shim alone (its own NCCL communicator on the fake) | median (µs) | p90 (µs) |")
    print("|---|---:|---:|")
    labels = [
        ("version", "ddpshim_version: ctypes into the .so, stays in C"),
        ("work_test", "ddpshim_work_test: ctypes, cgo into Go, a table lookup"),
        ("allreduce0_raw", "ddpshim_allreduce, count 0, raw ctypes (the fake returns at once)"),
        ("work_free_raw", "ddpshim_work_free, raw ctypes"),
        ("allreduce0_binding", "Comm.enqueue(count 0): the binding, as the hook calls it"),
        ("allreduce_bucket_binding", "the same with one %d KiB float32 bucket (the fake's file exchange)"
         % (r0["probe"]["bucket_bytes"] // 1024)),
    ]
    for k, label in labels:
        print("| %s | %.2f | %.2f |" % (label, probe[k]["median_us"], probe[k]["p90_us"]))
    print()
    print("ratio (1)/(3), median per-bucket host time: %.2f. The nccl hook on a CPU bucket returns with the bucket "
          "reduced (by the fake, through files, waiting for the other rank in 1 ms sleeps); gloo's hook and the "
          "host transport only start the all-reduce." % ratio)
    print("estimated host cost of (1) on a real NCCL, before NCCL's enqueue: hook Python %.1f µs + shim with count 0 "
          "%.1f µs = %.1f µs; against (3): %.2f." % (nccl["python"]["median_us"],
                                                    probe["allreduce0_binding"]["median_us"], est_us, ratio_est))
    print("(2), launch=\"thread\": the autograd thread's part of (1) is %.1f µs per bucket (median; p90 %.1f, the step's "
          "last bucket waits for the launcher), against (1)'s estimated %.1f µs on a real NCCL."
          % (thread["total"]["median_us"], thread["total"]["p90_us"], est_us))
    print("Load average %.2f at the start, %.2f at the end; run %.1fs (other work on the machine skews the figures)."
          % (load0, os.getloadavg()[0], wall), flush=True)

    result = {
        "bench": "hook_cost", "shim_version": r0["shim"]["version"], "torch": r0["torch"], "world_size": len(ranks),
        "nccl": {"source": ni.get("source"), "version": ni.get("version")}, "cpus": os.cpu_count(),
        "args": {k: v for k, v in vars(args).items() if k not in ("worker", "json")},
        "hooks": rows, "shim_alone": probe, "ratio_nccl_over_gloo": ratio,
        "estimated_nccl_host_us": est_us, "ratio_estimated_nccl_over_gloo": ratio_est,
        "load_average": [load0, os.getloadavg()[0]], "wall_s": wall,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(result, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
