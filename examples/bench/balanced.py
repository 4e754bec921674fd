"""A balanced DDP job, nothing slow on purpose: the workload of the
persistent-straggler false-alarm count (straggler_false_alarms.py).

2+ ranks, gloo on CPU, an MLP of width 256 with ddp_agent's hook, --steps
steps, each with the same --step-ms wait on every rank (as a data loader's)
and a few ms of compute.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import ddp_agent  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--step-ms", type=float, default=25.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)))
    hook = ddp_agent.register(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(args.steps):
        # The same fixed wait on every rank, as a data loader's. (Padding
        # each step to --step-ms from its own start would keep a rank that
        # once started late, late: a straggler made by the script.)
        time.sleep(args.step_ms / 1000)
        x = torch.randn(32, 256, generator=g)
        loss = nn.functional.cross_entropy(model(x), torch.randint(0, 10, (32,), generator=g))
        opt.zero_grad()
        loss.backward()
        opt.step()
    hook.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
