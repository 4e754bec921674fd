"""A Hugging Face Accelerate job with ddp_agent's comm hook: the line that
changes is ``ddp_agent.register`` on the model ``prepare`` returns, and
``hook.close()`` at the end (docs/accelerate.md).

    ddp-agent run --standalone --nproc-per-node 2 examples/frameworks/accelerate_train.py
    accelerate launch --multi_gpu --num_processes 2 examples/frameworks/accelerate_train.py   # beside a sidecar (on a CPU too: --cpu starts one process)

CPU and gloo. The faults the tests inject: --fail-rank raises at
--fail-at-step on the first attempt; --slow-rank sleeps --slow-seconds in
every step, before its backward (a persistent straggler).
"""

import argparse
import hashlib
import os
import sys
import time

import torch
from accelerate import Accelerator
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

try:
    import ddp_agent
except ImportError:  # not installed: the checkout's python/ (as a user has it installed)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import ddp_agent


def say(line):
    """Prints line in one write(2): ranks that share a stdout (srun's, torchrun's, a pipe) then
    never run two lines together, as print's separate writes of the text and the newline can."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--comm-hook", choices=["ddp-agent", "none"], default="ddp-agent")
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-at-step", type=int, default=-1)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-seconds", type=float, default=0.05)
    return p.parse_args()


def main():
    args = parse_args()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.steps * args.batch_size * 4, 32, generator=g)
    data = DataLoader(TensorDataset(x, (x[:, :4] @ torch.randn(4, 4, generator=g)).argmax(1)), batch_size=args.batch_size)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    hook = None
    if args.comm_hook == "ddp-agent":
        if not isinstance(model, DistributedDataParallel):
            raise SystemExit(f"accelerate_train.py: prepare gave a {type(model).__name__}, not DDP: launch 2 processes or more")
        hook = ddp_agent.register(model)  # the one line: on the model prepare returns
    rank = accelerator.process_index
    say(f"rank {rank}/{accelerator.num_processes} comm hook: {args.comm_hook} "
          f"restart_count {os.environ.get('TORCHELASTIC_RESTART_COUNT', '?')}")
    step = 0
    while step < args.steps:
        for xb, yb in data:
            if step == args.steps:
                break
            if rank == args.fail_rank and step == args.fail_at_step and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
                raise RuntimeError(f"rank {rank} fails at step {step} on purpose")
            loss = nn.functional.cross_entropy(model(xb), yb)
            if rank == args.slow_rank:
                time.sleep(args.slow_seconds)  # between forward and backward: compute
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
    if hook is not None:
        hook.close()  # before the process group goes
    params = accelerator.unwrap_model(model).parameters()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in params)).hexdigest()
    say(f"params rank={rank} sha256={digest}")
    say(f"rank {rank} done: steps={step}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
