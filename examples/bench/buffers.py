"""A model's buffers broadcast before each forward under InProcess, through the shim, against DDP's own broadcast.

DDP broadcasts a model's buffers (BatchNorm's running statistics) from rank 0
at the start of every forward under broadcast_buffers=True, its default.
Under ddp_agent.InProcess that broadcast goes through the shim's host
communicator (python/ddp_agent/_buffers.py), which a failing rank can abort;
DDP's own goes through gloo, which nothing aborts. This measures what the
change costs: two ranks on this machine (gloo on 127.0.0.1, torchrun's
environment, no launcher) each train two identical models of --layers
Linear + BatchNorm1d + ReLU blocks, side by side, one step of each in turn
(the order alternating every step, so drift in machine load hits both):

  shim  DDP model made by InProcess's wrap: the buffers go through the shim
  ddp   the same DDP model registered with ddp_agent.register alone: DDP's
        own gloo broadcast

Both all-reduce gradients through the hook. Every step starts at a barrier;
each rank times DDP's _sync_buffers, which its forward calls first: the
same method both ways, reaching the shim's broadcast or gloo's. Rounds
of --steps steps give the spread.

    /usr/bin/python3 examples/bench/buffers.py --rounds 5 --steps 40

Prints a Markdown table: per rank, the median of the rounds' median
broadcast times (min-max), and shim / ddp. Needs PyTorch and `make build`
(libddpshim.so from bin/, or $DDP_AGENT_SHIM).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=40, help="timed steps per round, per model")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before the rounds")
    p.add_argument("--layers", type=int, default=53, help="blocks, each with a BatchNorm1d (ResNet-50 has 53)")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


def worker(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ddp_agent

    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def model():
        torch.manual_seed(0)
        blocks = []
        for _ in range(args.layers):
            blocks += [nn.Linear(args.width, args.width), nn.BatchNorm1d(args.width), nn.ReLU()]
        m = nn.Sequential(*blocks)
        return m, torch.optim.SGD(m.parameters(), lr=0.01)

    def wrap(m):
        ddp = DDP(m)
        return ddp, ddp_agent.register(ddp)

    m_shim, o_shim = model()
    loop = ddp_agent.InProcess(m_shim, o_shim, wrap)
    if "_sync_module_buffers" not in vars(loop.ddp):
        raise SystemExit("InProcess did not take the buffers' broadcast (DDP's _sync_module_buffers)")
    m_ddp, o_ddp = model()
    ddp_plain, hook_plain = wrap(m_ddp)
    x = torch.randn(args.batch, args.width)
    times = {"shim": [], "ddp": []}
    timing = [False]

    def timed(which, ddp):
        # DDP's forward calls its _sync_buffers: both ways, the same method,
        # one reaching InProcess's broadcast, the other gloo's.
        sync = ddp._sync_buffers

        def run():
            t = time.perf_counter()
            sync()
            if timing[0]:
                times[which][-1].append(time.perf_counter() - t)
        ddp._sync_buffers = run

    timed("shim", loop.ddp)
    timed("ddp", ddp_plain)

    def step(which):
        ddp, opt = (loop.ddp, o_shim) if which == "shim" else (ddp_plain, o_ddp)
        dist.barrier()
        ddp(x).sum().backward()
        opt.step()

    n = 0  # InProcess's step
    for i in range(args.warmup + args.rounds * args.steps):
        timing[0] = i >= args.warmup
        if timing[0] and (i - args.warmup) % args.steps == 0:
            for v in times.values():
                v.append([])
        order = ("shim", "ddp") if i % 2 == 0 else ("ddp", "shim")
        for which in order:
            if which == "shim":
                with loop.step(n):
                    step(which)
                n += 1
            else:
                step(which)
    medians = {k: [statistics.median(r) * 1e6 for r in v] for k, v in times.items()}
    buf = sum(b.numel() * b.element_size() for b in m_shim.buffers())
    print("RESULT " + json.dumps({"rank": rank, "buffers": buf, **medians}), flush=True)
    dist.barrier()
    loop.close()
    hook_plain.close()
    dist.destroy_process_group()


def fmt(xs):
    return f"{statistics.median(xs):.0f} ({min(xs):.0f}-{max(xs):.0f})"


def main():
    args = parse_args()
    if args.worker:
        worker(args)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
               PYTHONPATH=os.pathsep.join(filter(None, [os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH")])))
    env.setdefault("DDP_AGENT_SHIM", os.path.join(ROOT, "bin", "libddpshim.so"))
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", *sys.argv[1:]],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE, text=True)
             for r in range(2)]
    lines = []
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise SystemExit(f"a rank failed (exit {p.returncode})")
        lines += [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    print(f"{args.layers} blocks of Linear({args.width}) + BatchNorm1d + ReLU, batch {args.batch}, 2 ranks; "
          f"the buffers' broadcast (DDP's _sync_buffers) in µs, median of {args.rounds} rounds' medians of {args.steps} steps (min-max)\n")
    print("| rank | buffers (bytes) | through the shim (InProcess) | DDP's gloo broadcast | shim / ddp |")
    print("|---|---|---|---|---|")
    for f in sorted((json.loads(ln[len("RESULT "):]) for ln in lines), key=lambda f: f["rank"]):
        shim, ddp = f["shim"], f["ddp"]
        ratio = statistics.median(shim) / statistics.median(ddp)
        print(f"| {f['rank']} | {f['buffers']} | {fmt(shim)} | {fmt(ddp)} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
