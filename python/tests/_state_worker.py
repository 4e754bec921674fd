"""A rank of test_state.py: moves a state from rank 1 with ddp_agent._state, prints a digest of what it holds."""

import hashlib
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_agent
from ddp_agent import _state


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    hook = ddp_agent.register(DDP(torch.nn.Linear(2, 2)))
    comm = hook._comms.open("host")
    src = 1
    g = torch.Generator().manual_seed(7 if rank == src else 100 + rank)  # the others hold other values
    floats = torch.randn(1000, generator=g)
    floats[:4] = torch.tensor([-0.0, 0.0, float("inf"), float("-inf")])
    tied = torch.randn(300, generator=g)
    tensors = [
        floats,
        torch.randn(5, 7, generator=g, dtype=torch.float64),
        torch.randint(-9, 9, (64,), generator=g),  # int64: a counter
        tied,
        tied,  # a tied weight: the state dict has it twice
        torch.randn(10, generator=g) > 0,  # bool: its bytes, packed
        torch.randn(6, 4, generator=g).t(),  # not contiguous: torch's broadcast
        torch.randn(300, 100, generator=g),  # 120 KB: over shared memory the source writes part of it
        torch.empty(0),  # no bytes: left out of the broadcast's table
        torch.randn(40001, generator=g).half(),  # 80002 bytes: not whole 4-byte words, packed
        torch.randint(0, 255, (70001,), generator=g, dtype=torch.uint8),  # an odd number of bytes: packed
        torch.randn((), generator=g),  # 0-dim
        torch.randn(20, generator=g, dtype=torch.complex64),
    ]
    nbytes, ms = _state.move(tensors, src, rank, comm, label_step=0)
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    print(f"rank {rank} digest {h.hexdigest()[:16]} bytes {nbytes} signbit0 {bool(torch.signbit(floats[0]))} "
          f"signbit1 {bool(torch.signbit(floats[1]))}", flush=True)
    hook.close()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
