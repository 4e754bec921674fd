"""One rank of a test world training under ddp_agent.InProcess, with faults injected on some ranks.

    python _inprocess_worker.py --out DIR [--faults STEP:RANK:HOW,...] [--steps N] [--max-reforms N] [--shared-store]
                                [--batchnorm [--ddp-buffers]] [--dropout]

The i-th fault fires in generation i only (after i re-formations), so each
is retried once. HOW is where rank RANK's step STEP raises:
    data       before its forward (its data failed): the others run their forward without it
    forward    before its backward: the others are blocked in the all-reduce or reach it
    backward   after its backward: the others wait in the script's all-reduce (--log before)
    optimizer  after its optimizer step: the others have completed the step, it has not
    corrupt    its weights are scribbled on, then it raises: its state must come from a peer
    always     before its backward, in every generation: past --max-reforms the error is raised

--log before|after all-reduces the loss in each step through loop.all_reduce,
before or after the optimizer's step (after: past the fault "optimizer").

--batchnorm puts a BatchNorm1d and a module that replaces its buffer in the
model: buffers, which DDP broadcasts from rank 0 before the forward
(broadcast_buffers=True; not with --no-broadcast-buffers), through the shim,
or with --ddp-buffers through DDP's own broadcast. Every fourth step ends with
a forward in eval mode (the last one does not), after which DDP broadcasts
nothing in the next step.
After the loop, closed, a last forward.

--optimizer data-sgd steps through p.data, which advances no version counter.

--dropout puts a Dropout in the model: each step draws from torch's generator.

Writes DIR/rank<RANK>.pt: the digest of the parameters and buffers, the re-formations and the
pid at the start and the end (the same: nobody restarted).
"""

import argparse
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_agent

IN, HIDDEN, OUT, BATCH = 64, 256, 10, 16


def batch(step: int, rank: int):
    g = torch.Generator().manual_seed(step * 1009 + rank)
    x = torch.randn(BATCH, IN, generator=g)
    return x, (x[:, :OUT] * 3).argmax(dim=1)


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for p in list(model.parameters()) + list(model.buffers()):
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class Injected(RuntimeError):
    pass


class Seen(nn.Module):
    """Counts the samples it saw in training, in a buffer it replaces rather than updates (DDP allows both)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(1))

    def forward(self, x):
        if self.training:
            self.seen = self.seen + x.shape[0]
        return x


class DataSGD(torch.optim.Optimizer):
    """Plain SGD that writes through p.data, as older code does: no version counter moves."""

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    p.data.add_(p.grad, alpha=-g["lr"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--faults", default="", help="STEP:RANK:HOW,... (see above)")
    p.add_argument("--max-reforms", type=int, default=3)
    p.add_argument("--timeout", type=float, default=30)
    p.add_argument("--shared-store", action="store_true",
                   help="say that the launcher's agent serves the store, as torchrun 2.5+ does, and leave in it "
                        "the first re-formation of an earlier attempt, whose ranks had completed step 50")
    p.add_argument("--log", choices=["before", "after"], help="the loss's all-reduce, before or after opt.step()")
    p.add_argument("--batchnorm", action="store_true", help="a BatchNorm1d in the model (buffers)")
    p.add_argument("--ddp-buffers", action="store_true",
                   help="leave the buffers to DDP's own broadcast (ddp_agent keeps nothing): the yardstick")
    p.add_argument("--no-broadcast-buffers", action="store_true", help="DDP(broadcast_buffers=False)")
    p.add_argument("--optimizer", choices=["sgd", "data-sgd"], default="sgd")
    p.add_argument("--dropout", action="store_true", help="a Dropout in the model (torch's random numbers)")
    args = p.parse_args()
    if args.ddp_buffers:
        from ddp_agent import _buffers
        _buffers.track = lambda ddp, module, hook, labels: None
    faults = [(int(a), int(b), how) for a, b, how in (f.split(":") for f in args.faults.split(",") if f)]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.shared_store:
        # Set after init_process_group, which would otherwise take the store for one a launcher serves.
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        if rank == 0:
            store, prefix = dist.distributed_c10d._get_default_store(), "ddp_agent/inprocess/generation_0/1"
            for r in range(dist.get_world_size()):
                store.set(f"{prefix}/rank{r}", "50 50")
                store.add(f"{prefix}/in{r}", 1)
                store.add(f"{prefix}/arrived", 1)
        dist.barrier()
    torch.manual_seed(0)
    norm = [nn.BatchNorm1d(HIDDEN), Seen()] if args.batchnorm else []
    drop = [nn.Dropout(0.3)] if args.dropout else []
    model = nn.Sequential(nn.Linear(IN, HIDDEN), *norm, nn.ReLU(), *drop, nn.Linear(HIDDEN, OUT))
    if args.optimizer == "data-sgd":
        opt = DataSGD(model.parameters(), lr=0.05)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def wrap(m):
        ddp = DDP(m, bucket_cap_mb=0.05, broadcast_buffers=not args.no_broadcast_buffers)  # several buckets
        return ddp, ddp_agent.register(ddp, timeout=args.timeout)

    loop = ddp_agent.InProcess(model, opt, wrap, timeout=args.timeout, max_reforms=args.max_reforms)
    out = {"pid_start": os.getpid(), "error": None, "completed_at": {}}
    loss_fn = nn.CrossEntropyLoss()
    try:
        for step in loop.steps(1, args.steps + 1):
            with loop.step(step) as ddp:
                how = next((h for i, (st, r, h) in enumerate(faults) if st == step and r == rank
                            and (i == loop.generation or h == "always")), None)
                if how == "data":
                    raise Injected(f"rank {rank} fails at step {step} before its forward")
                x, y = batch(step, rank)
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(ddp(x), y)
                if how in ("forward", "always"):
                    raise Injected(f"rank {rank} fails at step {step} before its backward")
                loss.backward()
                if how == "backward":
                    raise Injected(f"rank {rank} fails at step {step} after its backward")
                if args.log == "before":
                    loop.all_reduce(loss.detach().clone(), "avg")
                opt.step()
                if how == "corrupt":
                    with torch.no_grad():
                        for q in model.parameters():
                            q.add_(1.0)
                if how is not None:
                    raise Injected(f"rank {rank} fails at step {step} after its optimizer step")
                if args.log == "after":
                    loop.all_reduce(loss.detach().clone(), "avg")
                if args.batchnorm and step % 4 == 0 and step < args.steps:
                    ddp.eval()
                    with torch.no_grad():
                        ddp(x)
                    ddp.train()
            out["completed_at"][step] = time.monotonic()
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out.update(digest=digest(model), reforms=loop.reforms, generation=loop.generation, pid_end=os.getpid(),
               shim_buffers=loop.ddp is not None and "_sync_module_buffers" in vars(loop.ddp))
    torch.save(out, os.path.join(args.out, f"rank{rank}.pt"))
    if out["error"] is None:
        dist.barrier()
        loop.close()
        if args.batchnorm:  # an evaluation after the loop: the buffers' broadcast is DDP's own again
            with torch.no_grad():
                loop.ddp(batch(0, rank)[0])
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
