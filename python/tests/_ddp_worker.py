"""One rank of a test world: real DDP on gloo, with DDP's built-in all-reduce and with ddp_agent's hook.

    python _ddp_worker.py SCENARIO --out DIR [options]

Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment (as
torchrun sets them) and writes DIR/rank<RANK>.pt, which the test compares
across ranks and against the built-in run. Scenarios:

    parity      every mode of MODES, built-in all-reduce and hook, same seed and data
    join        uneven inputs under DDP.join(), built-in and hook
    dataloader  a DataLoader with forked workers feeding the hooked model
    die         --die-rank kills (or stops) itself mid-training; the others record how the hook failed
    nccl        the built-in all-reduce, then the hook with --transport (nccl over the fake NCCL, or
                host) for each of --compressions, and emulations of the compressed runs with gloo;
                torch.cuda must not be touched
    nccl_fail   the hook with --transport where NCCL fails (the fake's knobs, or no NCCL):
                records how the step failed and how the hook's next call did
    stale       the hook on a store that holds an earlier attempt's bootstrap keys

The process leaves with os._exit after a barrier: on PyTorch 1.13, tearing
down gloo at interpreter exit can hang (see examples/train.py).
"""

import argparse
import logging
import os
import signal
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_agent

STEPS = 6
BATCH = 8
IN = 128
BUCKET_CAP_MB = 0.5
# No bfloat16 mode: gloo on PyTorch 1.13 cannot broadcast bfloat16, so DDP
# cannot even be constructed (test_shim covers the shim's bfloat16).
MODES = ("default", "bucket_view", "static_graph", "find_unused", "float64", "float16")


class MLP(nn.Module):
    """About 600k parameters (2.4 MB in float32): more than DDP's 1 MiB first bucket, so rebuilt buckets split."""

    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        self.a = nn.Linear(IN, 512)
        self.b = nn.Linear(512, 512)
        self.c = nn.Linear(512, 512)
        self.d = nn.Linear(512, 10)
        self.unused = nn.Linear(100, 100) if unused else None  # never called: its gradient stays unset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.d(torch.relu(self.c(torch.relu(self.b(torch.relu(self.a(x)))))))


class Elementwise(nn.Module):
    """Elementwise ops only: PyTorch 1.13 has no float16 matmul on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.ParameterList([nn.Parameter(torch.randn(IN) * 0.1) for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w in self.w:
            x = (x * w) ** 2 + x
        return x


def make_model(mode: str) -> nn.Module:
    torch.manual_seed(0)
    if mode == "float16":
        return Elementwise().to(torch.float16)
    model = MLP(unused=mode == "find_unused")
    if mode == "float64":
        model = model.to(torch.float64)
    return model


def make_batch(mode: str, step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(BATCH, IN, generator=g)
    dtype = {"float64": torch.float64, "float16": torch.float16}.get(mode, torch.float32)
    return x.to(dtype)


def ddp_kwargs(mode: str) -> dict:
    return dict(
        bucket_cap_mb=BUCKET_CAP_MB,
        gradient_as_bucket_view=mode == "bucket_view",
        static_graph=mode == "static_graph",
        find_unused_parameters=mode == "find_unused",
    )


def params_of(ddp: DDP) -> list:
    return [p.detach().clone() for p in ddp.module.parameters()]


def plain_schedule(hook) -> dict:
    """hook.schedule with plain tuples, so the test can load it without importing ddp_agent."""
    return {step: [tuple(b) for b in buckets] for step, buckets in hook.schedule.items()}


def train(mode: str, use_hook: bool, keep: list, steps: int = STEPS, hook_kwargs=None, reference=None) -> dict:
    """Trains a fresh model: with ddp_agent's hook (register(**hook_kwargs)), with the
    hook function reference (DDP's register_comm_hook), or with DDP's built-in all-reduce."""
    rank = dist.get_rank()
    ddp = DDP(make_model(mode), **ddp_kwargs(mode))
    keep.append(ddp)  # freed at exit only, never mid-run
    hook = ddp_agent.register(ddp, timeout=60, **(hook_kwargs or {})) if use_hook else None
    if reference is not None:
        ddp.register_comm_hook(None, reference)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        ddp(make_batch(mode, step, rank)).float().pow(2).mean().backward()
        opt.step()
    out = {"params": params_of(ddp)}
    if hook is not None:
        out.update(schedule=plain_schedule(hook), steps=hook.step, info=hook.info(), name=hook.name,
                   launch=hook.launch, launcher_ran=getattr(hook._nccl._launcher, "_thread", None) is not None)
        hook.close()
    return out


def scenario_parity(args, keep: list) -> dict:
    result = {}
    for mode in args.modes.split(","):
        result[mode] = {"builtin": train(mode, False, keep), "hook": train(mode, True, keep)}
    result["subgroups"] = subgroups(keep)
    return result


def split(world_size: int) -> list:
    """The ranks split in two groups: [0] [1]; [0] [1, 2]; [0, 1] [2, 3]."""
    return [list(range(world_size // 2)), list(range(world_size // 2, world_size))]


def subgroups(keep: list) -> dict:
    """DDP on one of two process groups at once: the hook works in group ranks."""
    rank = dist.get_rank()
    members = split(dist.get_world_size())
    groups = [dist.new_group(m) for m in members]  # every rank creates both, in order
    group = groups[0 if rank in members[0] else 1]
    out = {}
    for use_hook in (False, True):
        ddp = DDP(make_model("default"), bucket_cap_mb=BUCKET_CAP_MB, process_group=group)
        keep.append(ddp)
        hook = ddp_agent.register(ddp, timeout=60) if use_hook else None
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        for step in range(STEPS):
            opt.zero_grad(set_to_none=True)
            ddp(make_batch("default", step, rank)).pow(2).mean().backward()
            opt.step()
        r = {"params": params_of(ddp)}
        if hook is not None:
            r.update(name=hook.name, rank=hook.rank, world_size=hook.world_size, info=hook.info())
            hook.close()
        out["hook" if use_hook else "builtin"] = r
    # A hook of the first group, registered on its ranks only, and then one
    # of the world on every rank: the world's has the same name on every
    # rank (names count registrations per group), and trains.
    if rank in members[0]:
        first = DDP(make_model("default"), bucket_cap_mb=BUCKET_CAP_MB, process_group=groups[0])
        keep.append(first)
        ddp_agent.register(first, timeout=60).close()
    world = DDP(make_model("default"), bucket_cap_mb=BUCKET_CAP_MB)
    keep.append(world)
    hook = ddp_agent.register(world, timeout=60)
    opt = torch.optim.SGD(world.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        world(make_batch("default", step, rank)).pow(2).mean().backward()
        opt.step()
    out["world_after"] = {"params": params_of(world), "name": hook.name}
    hook.close()
    return out


def scenario_join(args, keep: list) -> dict:
    rank = dist.get_rank()
    batches = 3 + 2 * rank  # uneven: rank 0 joins first
    result = {"batches": batches}
    for use_hook in (False, True):
        ddp = DDP(make_model("default"), bucket_cap_mb=BUCKET_CAP_MB)
        keep.append(ddp)
        hook = ddp_agent.register(ddp, timeout=60) if use_hook else None
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        with ddp.join():
            for step in range(batches):
                opt.zero_grad(set_to_none=True)
                ddp(make_batch("default", step, rank)).pow(2).mean().backward()
                opt.step()
        r = {"params": params_of(ddp)}
        if hook is not None:
            r.update(schedule=plain_schedule(hook), steps=hook.step)
            hook.close()
        result["hook" if use_hook else "builtin"] = r
    return result


class ForkCheckingDataset(torch.utils.data.Dataset):
    """Samples of one rank; each records whether the shim refused to run in the (forked) loader worker."""

    def __init__(self, rank: int, n: int) -> None:
        g = torch.Generator().manual_seed(rank)
        self.x = torch.randn(n, IN, generator=g)
        self.parent = os.getpid()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        refused = -1  # -1: not in a child; 1: ShimError as expected; 0: the call went through
        if os.getpid() != self.parent:
            try:
                ddp_agent.shim_version()
                refused = 0
            except ddp_agent.ShimError as e:
                refused = 1 if e.code == ddp_agent.Status.UNAVAILABLE and "forked" in e.message else 0
        return self.x[i], refused


def scenario_dataloader(args, keep: list) -> dict:
    rank = dist.get_rank()
    ddp = DDP(make_model("default"), bucket_cap_mb=BUCKET_CAP_MB)
    keep.append(ddp)
    hook = ddp_agent.register(ddp, timeout=60)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(
        ForkCheckingDataset(rank, 32), batch_size=BATCH, num_workers=2, multiprocessing_context="fork"
    )
    refused = []
    for _epoch in range(2):  # the second epoch forks again, with the communicator open and the waiter running
        for x, flags in loader:
            refused.extend(flags.tolist())
            opt.zero_grad(set_to_none=True)
            ddp(x).pow(2).mean().backward()
            opt.step()
    out = {"params": params_of(ddp), "steps": hook.step, "refused": refused, "info": hook.info()}
    hook.close()
    hook.close()  # idempotent
    try:  # a closed hook refuses buckets instead of queueing them for a waiter that is gone
        ddp(x).pow(2).mean().backward()
        out["after_close"] = "no error"
    except Exception as e:
        out["after_close"] = f"{type(e).__name__}: {e}"
    return out


class InjectedFailure(Exception):
    pass


def scenario_die(args, keep: list) -> dict:
    rank = dist.get_rank()
    ddp = DDP(make_model("default"), bucket_cap_mb=BUCKET_CAP_MB)
    keep.append(ddp)
    hook = ddp_agent.register(ddp, timeout=args.timeout)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    out = {"error": None}
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = ddp(make_batch("default", step, rank)).pow(2).mean()
        if rank == args.die_rank and step == args.die_step:
            # Mid-step, after forward: SIGKILL closes its sockets (the others
            # see the peer go away); SIGSTOP leaves them open (the others see
            # nothing arrive, and the timeout must end the wait); an exception
            # ends the interpreter normally, through ddp_agent's exit handler,
            # which must not wait for the others.
            if args.die_how == "raise":
                raise InjectedFailure(f"rank {rank} fails at step {step}")
            os.kill(os.getpid(), signal.SIGKILL if args.die_how == "kill" else signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            loss.backward()
        except Exception as e:  # what a training script would see
            out.update(
                error=f"{type(e).__name__}: {e}",
                seconds=time.monotonic() - t0,
                step=step,
                hook_error=repr(hook.error),
                hook_error_code=getattr(hook.error, "code_name", None),
            )
            break
        opt.step()
    t0 = time.monotonic()
    hook.close()
    out["close_seconds"] = time.monotonic() - t0
    return out


def scenario_absent(args, keep: list) -> dict:
    """Rank 1 never registers the hook: rank 0's bootstrap must give up within the timeout."""
    rank = dist.get_rank()
    ddp = DDP(make_model("default"), bucket_cap_mb=BUCKET_CAP_MB)  # collective: on every rank
    keep.append(ddp)
    if rank != 0:
        time.sleep(args.timeout + 5)
        return {}
    hook = ddp_agent.register(ddp, timeout=args.timeout)
    t0 = time.monotonic()
    out = {"error": None}
    try:
        ddp(make_batch("default", 0, rank)).pow(2).mean().backward()
    except Exception as e:
        out.update(error=f"{type(e).__name__}: {e}", hook_error_code=getattr(hook.error, "code_name", None))
    out["seconds"] = time.monotonic() - t0
    hook.close()
    return out


def emulated_compression(dtype: torch.dtype):
    """A DDP hook that does in gloo what the hook with compression does over the fake NCCL.

    Each rank casts its bucket to dtype and divides by the world size; the
    fake sums the ranks' halves in float32, in rank order from 0, and rounds
    once; the result is copied back into the bucket. The same operations in
    the same order give the same bits.
    """

    def hook(state, bucket):
        buf = bucket.buffer()
        n = dist.get_world_size()
        mine = buf.to(dtype).div_(n).float()  # exact in float32
        parts = [torch.empty_like(mine) for _ in range(n)]
        dist.all_gather(parts, mine)
        total = torch.zeros_like(mine)
        for part in parts:
            total += part
        buf.copy_(total.to(dtype))
        fut = torch.futures.Future()
        fut.set_result(buf)
        return fut

    return hook


class CudaTouched(AssertionError):
    pass


def forbid_cuda() -> list:
    """Replaces the torch.cuda calls a hook could make with ones that record and raise."""
    touched: list = []
    for name in ("Stream", "current_stream", "stream", "device", "synchronize", "set_device", "init"):
        def refuse(*args, _name=name, **kwargs):
            touched.append(_name)
            raise CudaTouched(f"torch.cuda.{_name} called on a CPU-only run")

        setattr(torch.cuda, name, refuse)
    return touched


def scenario_nccl(args, keep: list) -> dict:
    touched = forbid_cuda()
    result = {"info": ddp_agent.info(args.transport), "builtin": train("default", False, keep)}
    for name in args.compressions.split(","):
        compression = None if name == "none" else name
        result[name] = train("default", True, keep,
                             hook_kwargs=dict(transport=args.transport, compression=compression, launch=args.launch))
    for name in args.compressions.split(","):
        if name != "none":
            dtype = ddp_agent.hook.COMPRESSIONS[name]
            result[f"{name}_emulated"] = train("default", False, keep, reference=emulated_compression(dtype))
    result["cuda_touched"] = touched
    return result


def scenario_stale(args, keep: list) -> dict:
    """An attempt on a store that an earlier attempt left its keys in, as torchrun 2.5 and later hand
    every restart their agent's store: each rank leaves the bootstrap key that a dead communicator of
    its left, then trains with the hook, rank 1 late, so that rank 0 finds its stale key first."""
    from ddp_agent import _bootstrap

    rank, world_size = dist.get_rank(), dist.get_world_size()
    result = {"builtin": train("default", False, keep)}
    name = "ddp_agent-0"  # the hook's name: this process's first registration
    dead = ddp_agent._shim.Comm.open(_bootstrap.Communicators(name, rank, world_size, 5000).config("host"))
    _bootstrap._store(name).set(f"rank_{rank}", dead.bootstrap_info())
    dead.close()
    dist.barrier()
    if rank == 1:
        time.sleep(3)
    result["hooked"] = train("default", True, keep, hook_kwargs=dict(transport="host"))
    return result


class Bucket:
    """What the hook reads of a dist.GradBucket, for calling it outside DDP."""

    def __init__(self, buf: torch.Tensor) -> None:
        self.buf = buf

    def buffer(self) -> torch.Tensor:
        return self.buf

    def index(self) -> int:
        return 0

    def is_last(self) -> bool:
        return True


def scenario_nccl_fail(args, keep: list) -> dict:
    """Trains with the hook until a step fails; then calls the hook once more, outside DDP.

    After an exception inside backward, DDP's reducer (1.13) cannot run
    another iteration, so the second call goes to the hook directly.
    """
    rank = dist.get_rank()
    ddp = DDP(make_model("default"), bucket_cap_mb=BUCKET_CAP_MB)
    keep.append(ddp)
    compression = None if args.compressions == "none" else args.compressions
    hook = ddp_agent.register(ddp, transport=args.transport, compression=compression, timeout=args.timeout,
                              launch=args.launch)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    out = {"error": None, "steps_done": 0}
    start = time.monotonic()
    for step in range(args.steps):
        time.sleep(args.step_sleep)
        opt.zero_grad(set_to_none=True)
        loss = ddp(make_batch("default", step, rank)).pow(2).mean()
        t0 = time.monotonic()
        try:
            loss.backward()
        except Exception as e:  # what a training script would see
            out.update(error=f"{type(e).__name__}: {e}", seconds=time.monotonic() - t0, step=step,
                       since_start=time.monotonic() - start)
            break
        opt.step()
        out["steps_done"] = step + 1
    out.update(
        hook_error=repr(hook.error),
        hook_error_code=getattr(hook.error, "code_name", None),
        hook_error_message=str(hook.error),
    )
    if out["error"] is not None:
        t0 = time.monotonic()
        try:
            ddp_agent.hook._comm_hook(hook, Bucket(torch.ones(10)))
            out["later"] = "no error"
        except Exception as e:
            out["later"] = f"{type(e).__name__}: {e}"
            out["later_code"] = getattr(e, "code_name", None)
        out["later_seconds"] = time.monotonic() - t0
    t0 = time.monotonic()
    hook.close()
    out["close_seconds"] = time.monotonic() - t0
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["parity", "join", "dataloader", "die", "absent", "nccl", "nccl_fail", "stale"])
    p.add_argument("--out", required=True)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--die-rank", type=int, default=1)
    p.add_argument("--die-step", type=int, default=3)
    p.add_argument("--die-how", choices=["kill", "stop", "raise"], default="kill")
    p.add_argument("--transport", default="nccl")
    p.add_argument("--launch", default="inline", choices=["inline", "thread"], help="register(launch=...)")
    p.add_argument("--compressions", default="none", help="comma-separated: none, fp16, bf16")
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--step-sleep", type=float, default=0.0, help="nccl_fail: seconds between steps")
    p.add_argument("--shared-store", action="store_true",
                   help="say that the launcher's agent serves the store, as torchrun 2.x does (after init)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    dist.init_process_group("gloo")
    if args.shared_store:
        # Set after init_process_group, which would otherwise take the store for one a launcher serves.
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    rank = dist.get_rank()
    keep: list = []
    try:
        result = globals()[f"scenario_{args.scenario}"](args, keep)
        torch.save(result, os.path.join(args.out, f"rank{rank}.pt"))
        if args.scenario not in ("die", "absent"):
            dist.barrier()
    except InjectedFailure:
        raise  # leave through the interpreter's normal exit, atexit handlers included
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
