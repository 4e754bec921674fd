"""A small real DDP training job for ddp-agent (and torchrun).

It reads torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, TORCHELASTIC_RESTART_COUNT), trains an MLP of about 5M parameters
on synthetic data, checkpoints, resumes after a restart, and can inject
failures for tests and demos.

    torchrun --standalone --nproc_per_node 2 examples/train.py --steps 60
    torchrun --standalone --nproc_per_node 2 --max_restarts 1 examples/train.py \\
        --fail-rank 1 --fail-at-step 30      # fails once, resumes from step 20

Works on PyTorch 1.13 (CPU, gloo) and 2.x (CUDA, nccl).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

IN, HIDDEN, OUT = 256, 2048, 10


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60, help="last step to train (steps count from 1)")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-dir", default=os.environ.get("DDP_AGENT_CKPT_DIR", "./checkpoints"))
    p.add_argument("--ckpt-every", type=int, default=20, help="steps; 0 disables checkpoints")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--cpu", action="store_true", help="use gloo on CPU even when CUDA is available")
    p.add_argument("--comm-hook", choices=["none"], default="none", help="DDP gradient communication hook")
    p.add_argument("--fail-rank", type=int, default=-1, help="rank that fails (default: none)")
    p.add_argument("--fail-at-step", type=int, default=-1, help="step at which --fail-rank fails")
    p.add_argument("--fail-attempts", type=int, default=1,
                   help="fail while TORCHELASTIC_RESTART_COUNT is below this (default: the first attempt only)")
    p.add_argument("--exit-code", type=int, default=None,
                   help="fail with os._exit(CODE) instead of raising RuntimeError")
    p.add_argument("--sleep-per-step", type=float, default=0.0, help="seconds")
    return p.parse_args()


def make_model():
    return nn.Sequential(
        nn.Linear(IN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, 256), nn.ReLU(),
        nn.Linear(256, OUT),
    )


def batch(args, teacher, step, rank, device):
    """Returns the batch of (step, rank): the same in a resumed run as in an uninterrupted one."""
    g = torch.Generator().manual_seed(args.seed * 1000003 + step * 1009 + rank)
    x = torch.randn(args.batch_size, IN, generator=g)
    y = (x @ teacher).argmax(dim=1)
    return x.to(device), y.to(device)


def mean_loss(loss, world_size):
    """Returns the loss averaged over all ranks."""
    t = loss.detach().clone()
    dist.all_reduce(t)
    return t.item() / world_size


def save_checkpoint(path, model, optimizer, step, loss):
    """Writes the checkpoint atomically: readers see the old file or the whole new one."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "loss": loss}, tmp)
    os.replace(tmp, path)


@record
def main():
    args = parse_args()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ["WORLD_SIZE"])
    restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    if torch.cuda.is_available() and not args.cpu:
        backend, device = "nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
    print(f"rank {rank}/{world_size} local_rank {local_rank} restart_count {restart_count} "
          f"backend {backend} device {device}", flush=True)
    dist.init_process_group(backend, init_method="env://")

    torch.manual_seed(args.seed)  # the same initial weights and teacher on every rank
    model = make_model().to(device)
    teacher = torch.randn(IN, OUT)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    ckpt = os.path.join(args.ckpt_dir, "checkpoint.pt")
    first, loss_value = 1, float("nan")
    if restart_count > 0 and os.path.exists(ckpt):
        state = torch.load(ckpt, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first, loss_value = state["step"] + 1, state["loss"]
        if rank == 0:
            print(f"resumed from step {state['step']}", flush=True)

    ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(first, args.steps + 1):
        if rank == args.fail_rank and step == args.fail_at_step and restart_count < args.fail_attempts:
            msg = f"injected failure on rank {rank} at step {step} (restart_count {restart_count})"
            if args.exit_code is not None:
                print(f"{msg}: exiting with code {args.exit_code}", flush=True)
                os._exit(args.exit_code)
            raise RuntimeError(msg)

        x, y = batch(args, teacher, step, rank, device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        optimizer.step()

        checkpoint = args.ckpt_every > 0 and step % args.ckpt_every == 0
        if step % args.log_every == 0 or step == args.steps or checkpoint:
            loss_value = mean_loss(loss, world_size)
            if rank == 0 and step % args.log_every == 0:
                print(f"step {step} loss {loss_value:.4f}", flush=True)
        if checkpoint:
            if rank == 0:
                save_checkpoint(ckpt, model, optimizer, step, loss_value)
            dist.barrier()  # no rank runs ahead to a failure before the file is complete
        if args.sleep_per_step > 0:
            time.sleep(args.sleep_per_step)

    if rank == 0:
        print(f"done: steps={args.steps} final_loss={loss_value:.4f} world_size={world_size}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    # Leave without tearing down the DDP model. On PyTorch 1.13, freeing it
    # runs ~Reducer -> ~ProcessGroupGloo, which joins gloo's worker threads
    # while holding the GIL; a worker thread still freeing a tensor that has
    # a Python object waits for the GIL, and the rank hangs forever after
    # training finished (seen under load, stacks taken with gdb).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
