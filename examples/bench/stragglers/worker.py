"""A DDP job with a controlled step time and an injected straggler, for examples/bench/stragglers.

Each step: an input phase (--input-ms), forward of a small MLP, a compute
phase (--compute-ms, slept: the step time stays the same run to run, so the
benchmark measures the detector, not this machine's noise), backward with
the gradients all-reduced by ddp_agent's comm hook, optimizer step.
--straggler-rank is slower by --extra-pct percent of the base step, in its
input phase (--kind input) or its compute phase (--kind compute), every
--every steps. Rank 0 prints "STEP <n> <unix time>" after each step, which
the benchmark reads to convert detection times into steps.

Runs under ddp-agent (or torchrun) with torch.distributed's environment;
gloo on the CPU.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python"))
import ddp_agent  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--input-ms", type=float, default=5)
    p.add_argument("--compute-ms", type=float, default=100)
    p.add_argument("--straggler-rank", type=int, default=-1)
    p.add_argument("--extra-pct", type=float, default=0)
    p.add_argument("--kind", choices=["compute", "input"], default="compute")
    p.add_argument("--every", type=int, default=1)
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)))
    hook = ddp_agent.register(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 64), torch.randn(16, 64)
    base = (args.input_ms + args.compute_ms) / 1000
    extra = base * args.extra_pct / 100
    for step in range(1, args.steps + 1):
        slow = rank == args.straggler_rank and step % args.every == 0
        time.sleep(args.input_ms / 1000 + (extra if slow and args.kind == "input" else 0))
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        time.sleep(args.compute_ms / 1000 + (extra if slow and args.kind == "compute" else 0))
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"STEP {step} {time.time():.6f}", flush=True)
    hook.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
