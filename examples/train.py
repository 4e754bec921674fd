"""A small real DDP training job for ddp-agent (and torchrun).

It reads torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, TORCHELASTIC_RESTART_COUNT), trains an MLP of about 5M parameters
on synthetic data, checkpoints, resumes after a restart, and can inject
failures for tests and demos. Gradients are all-reduced by ddp-agent's comm
hook (libddpshim.so) unless --comm-hook none picks DDP's built-in all-reduce.

    ddp-agent run --standalone --nproc-per-node 2 examples/train.py --steps 60
    torchrun --standalone --nproc_per_node 2 examples/train.py --steps 60 --comm-hook none
    torchrun --standalone --nproc_per_node 2 --max_restarts 1 examples/train.py \\
        --fail-rank 1 --fail-at-step 30      # fails once, resumes from step 20

At the end every rank prints a digest of its parameters (the same on every
rank), and rank 0 prints one line of step timings (forward, backward with the
gradient all-reduce, optimizer step; after --warmup-steps), for benchmarks:

    step_time comm_hook=ddp-agent steps=50 warmup=10 mean_ms=41.202 median_ms=40.871 ...

With --in-process a failed step is retried in the same processes
(ddp_agent.InProcess, docs/in-process.md) instead of by a restart:

    ddp-agent run --standalone --nproc-per-node 2 examples/train.py --in-process \
        --fail-rank 1 --fail-at-step 30      # re-forms in process, retries step 30

Works on PyTorch 1.13 (CPU, gloo) and 2.x (CUDA, nccl).
"""

import argparse
import atexit
import contextlib
import hashlib
import json
import os
import signal
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

IN, OUT = 256, 10


def say(line):
    """Prints line in one write(2): ranks that share a stdout (srun's, torchrun's, a pipe) then
    never run two lines together, as print's separate writes of the text and the newline can."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def step_log(event, rank, step, attempt, world=None):
    """Appends a line to $TRAIN_STEP_LOG, when set: a step completed or a fault injected, with the wall time
    (and the world's size, for a step).

    One write of a line opened with O_APPEND: the ranks share the file
    (examples/bench/inprocess_recovery.py reads it).
    """
    path = os.environ.get("TRAIN_STEP_LOG")
    if path:
        line = json.dumps({"event": event, "rank": rank, "step": step, "attempt": attempt, "world": world,
                           "t": time.time()}) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def import_ddp_agent():
    """Imports ddp_agent, from the repository's python/ directory when it is not installed."""
    try:
        import ddp_agent
        return ddp_agent
    except ImportError as e:
        err = e
    tree = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
    if os.path.isdir(os.path.join(tree, "ddp_agent")):
        if tree not in sys.path:
            sys.path.insert(0, tree)
        try:
            import ddp_agent
            return ddp_agent
        except ImportError as e:
            err = e
    raise SystemExit(
        f"train.py: --comm-hook ddp-agent needs the ddp_agent package ({err}; also looked in {tree}). "
        f"Install it or set PYTHONPATH to the repository's python/ directory, run `make build` for "
        f"libddpshim.so, or pass --comm-hook none for DDP's built-in all-reduce.")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60, help="last step to train (steps count from 1)")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    # The end-to-end tests set TRAIN_HIDDEN=512: their steps' times come from
    # --sleep-per-step, and at 2048 the MLP's compute was most of their CPU.
    p.add_argument("--hidden", type=int, default=int(os.environ.get("TRAIN_HIDDEN", "2048")),
                   help="width of the MLP's hidden layers (default 2048, about 5.2 M parameters; $TRAIN_HIDDEN)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--lr-step", type=int, default=0,
                   help="halve the learning rate every this many steps (torch's StepLR; default 0: never)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-dir", default=os.environ.get("DDP_AGENT_CKPT_DIR", "./checkpoints"))
    p.add_argument("--ckpt-every", type=int, default=20, help="steps; 0 disables checkpoints")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--cpu", action="store_true", help="use gloo on CPU even when CUDA is available")
    p.add_argument("--comm-hook", choices=["ddp-agent", "none"], default="ddp-agent",
                   help="gradient all-reduce: ddp-agent's hook (default) or none (DDP's built-in, on the process group)")
    p.add_argument("--transport", default="auto", help="ddp_agent.register(transport=...) (default: auto)")
    p.add_argument("--bucket-cap-mb", type=float, default=25, help="DDP bucket size in MiB (DDP's default: 25)")
    p.add_argument("--warmup-steps", type=int, default=5,
                   help="steps of each attempt left out of the step_time line (default: 5)")
    p.add_argument("--fail-rank", type=int, default=-1, help="rank that fails (default: none)")
    p.add_argument("--fail-at-step", type=int, default=-1, help="step at which --fail-rank fails")
    p.add_argument("--fail-attempts", type=int, default=1,
                   help="fail while TORCHELASTIC_RESTART_COUNT is below this (default: the first attempt only)")
    p.add_argument("--exit-code", type=int, default=None,
                   help="fail with os._exit(CODE) instead of raising RuntimeError")
    p.add_argument("--fail-signal", default=None,
                   help="fail by sending itself this signal (e.g. KILL) instead of raising RuntimeError")
    p.add_argument("--exit-delay", type=float, default=0.0,
                   help="seconds --fail-rank lingers at interpreter exit after its raise, once its comm hook "
                        "has closed: a slow teardown, so that the peers it failed may exit before it does")
    p.add_argument("--in-process", action="store_true",
                   help="retry a failed step in the same processes (ddp_agent.InProcess; needs --comm-hook ddp-agent)")
    p.add_argument("--hold-before-init", default="",
                   help="wait until this file exists before init_process_group (tests: a node's workers that "
                        "never reach the others' store)")
    p.add_argument("--hold-before-loop", default="",
                   help="wait until this file exists before the training loop (tests: a node joins while the "
                        "workers start)")
    p.add_argument("--hold-in-loop", default="",
                   help="wait until this file exists before step --hold-step (tests: a node joins while the "
                        "others train)")
    p.add_argument("--hold-step", type=int, default=10, help="the step --hold-in-loop waits before")
    p.add_argument("--hold-after-loop", default="",
                   help="wait until this file exists after the training loop (tests: a node joins as the job ends)")
    p.add_argument("--sleep-per-step", type=float, default=0.0, help="seconds")
    p.add_argument("--slow-rank", type=int, default=-1, help="rank made slow before its backward (default: none)")
    p.add_argument("--slow-steps", default="", help="comma-separated steps at which --slow-rank is slow")
    p.add_argument("--slow-seconds", type=float, default=0.5, help="how slow --slow-rank is")
    p.add_argument("--slow-phase", choices=["compute", "input"], default="compute",
                   help="where --slow-rank loses the time: between forward and backward (compute), "
                        "or before loading the batch (input: a slow data pipeline)")
    p.add_argument("--hang-rank", type=int, default=-1, help="rank that hangs before its backward (default: none)")
    p.add_argument("--hang-at-step", type=int, default=-1, help="step at which --hang-rank hangs (first attempt only)")
    p.add_argument("--hang-seconds", type=float, default=3600.0, help="how long --hang-rank hangs")
    args = p.parse_args()
    if args.in_process and args.comm_hook != "ddp-agent":
        p.error("--in-process needs --comm-hook ddp-agent: its abort is what stops the other ranks' all-reduce")
    return args


def make_model(hidden):
    return nn.Sequential(
        nn.Linear(IN, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, 256), nn.ReLU(),
        nn.Linear(256, OUT),
    )


def batch(args, teacher, step, rank, device):
    """Returns the batch of (step, rank): the same in a resumed run as in an uninterrupted one."""
    g = torch.Generator().manual_seed(args.seed * 1000003 + step * 1009 + rank)
    x = torch.randn(args.batch_size, IN, generator=g)
    y = (x @ teacher).argmax(dim=1)
    return x.to(device), y.to(device)


def mean_loss(loss, world_size, loop):
    """Returns the loss averaged over all ranks.

    Under --in-process through loop.all_reduce, which a rank that fails
    before it aborts: gloo's all-reduce would leave the others waiting.
    """
    t = loss.detach().clone()
    if loop is not None:
        loop.all_reduce(t)
    else:
        dist.all_reduce(t)
    return t.item() / world_size


def save_checkpoint(path, model, optimizer, scheduler, step, loss):
    """Writes the checkpoint atomically: readers see the old file or the whole new one."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "loss": loss}
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    torch.save(state, tmp)
    os.replace(tmp, path)


def params_digest(model):
    """Returns the first 16 hex digits of a SHA-256 over every parameter's bytes."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def print_step_times(args, step_times):
    """Prints one parseable line: this attempt's step times after the warm-up, in milliseconds."""
    t = sorted(x * 1e3 for x in step_times[args.warmup_steps:])
    line = f"step_time comm_hook={args.comm_hook} steps={len(t)} warmup={args.warmup_steps}"
    if t:
        line += (f" mean_ms={statistics.fmean(t):.3f} median_ms={statistics.median(t):.3f}"
                 f" min_ms={t[0]:.3f} p90_ms={t[min(len(t) - 1, int(0.9 * len(t)))]:.3f} max_ms={t[-1]:.3f}")
    say(line)


@record
def main():
    args = parse_args()
    if args.exit_delay > 0 and int(os.environ["RANK"]) == args.fail_rank:
        # atexit runs handlers last-registered first: registered before
        # ddp_agent is imported, this runs after its hooks are closed.
        atexit.register(time.sleep, args.exit_delay)
    ddp_agent = import_ddp_agent() if args.comm_hook == "ddp-agent" else None  # fail before any rendezvous
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ["WORLD_SIZE"])
    restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    if torch.cuda.is_available() and not args.cpu:
        backend, device = "nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
    say(f"rank {rank}/{world_size} local_rank {local_rank} restart_count {restart_count} "
          f"backend {backend} device {device}")
    while args.hold_before_init and not os.path.exists(args.hold_before_init):
        time.sleep(0.05)
    dist.init_process_group(backend, init_method="env://")

    torch.manual_seed(args.seed)  # the same initial weights and teacher on every rank
    model = make_model(args.hidden).to(device)
    teacher = torch.randn(IN, OUT)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, args.lr_step, gamma=0.5) if args.lr_step > 0 else None

    ckpt = os.path.join(args.ckpt_dir, "checkpoint.pt")
    first, loss_value = 1, float("nan")
    # A restart after a fault, or a new generation of an elastic job (a node
    # joined or left: ddp-agent does not count that as a restart).
    generation = int(os.environ.get("DDP_AGENT_GENERATION", "0"))
    if (restart_count > 0 or generation > 0) and os.path.exists(ckpt):
        state = torch.load(ckpt, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None and "scheduler" in state:
            scheduler.load_state_dict(state["scheduler"])
        first, loss_value = state["step"] + 1, state["loss"]
        if rank == 0:
            say(f"resumed from step {state['step']} with world size {world_size}")

    def wrap(model):  # at the start, and after each re-formation in process
        ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None, bucket_cap_mb=args.bucket_cap_mb)
        return ddp, ddp_agent.register(ddp, transport=args.transport) if ddp_agent is not None else None

    while args.hold_before_loop and not os.path.exists(args.hold_before_loop):
        time.sleep(0.05)
    if args.in_process:
        # A step that raises on any rank is retried, in these processes,
        # from the last step every rank completed (docs/in-process.md).
        # The scheduler's count moves with the model's state: a warm spare's
        # own would start from 0.
        loop = ddp_agent.InProcess(model, optimizer, wrap, state=[scheduler] if scheduler is not None else [])
        steps, step_context = loop.steps(first, args.steps + 1), loop.step
    else:
        loop = None
        ddp, hook = wrap(model)
        steps, step_context = range(first, args.steps + 1), lambda step: contextlib.nullcontext(ddp)
    if ddp_agent is not None and rank == 0:
        say(f"comm hook: ddp-agent, {ddp_agent.shim_version()}, transport {args.transport}")
    loss_fn = nn.CrossEntropyLoss()
    step_times = []  # seconds: forward, backward (with the gradient all-reduce), optimizer step
    for step in steps:
        while args.hold_in_loop and step == args.hold_step and not os.path.exists(args.hold_in_loop):
            time.sleep(0.05)
        if loop is not None:  # a node lost under --spares: the survivors carry on, renumbered
            rank, world_size = loop.rank, loop.world_size
        with step_context(step) as ddp:
            # The injected faults fire in the first attempt(s): a restart or
            # a re-formation in process counts as one.
            attempt = restart_count + (loop.generation if loop is not None else 0)
            if rank == args.fail_rank and step == args.fail_at_step and attempt < args.fail_attempts:
                msg = f"injected failure on rank {rank} at step {step} (restart_count {restart_count})"
                step_log("fault", rank, step, attempt)
                if args.exit_code is not None:
                    say(f"{msg}: exiting with code {args.exit_code}")
                    os._exit(args.exit_code)
                if args.fail_signal is not None:
                    say(f"{msg}: sending itself SIG{args.fail_signal}")
                    os.kill(os.getpid(), getattr(signal, "SIG" + args.fail_signal))
                raise RuntimeError(msg)

            slow = rank == args.slow_rank and str(step) in args.slow_steps.split(",")
            if slow and args.slow_phase == "input":
                time.sleep(args.slow_seconds)  # a slow input pipeline: the others wait for it in the all-reduce
            x, y = batch(args, teacher, step, rank, device)
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x), y)
            if slow and args.slow_phase == "compute":
                time.sleep(args.slow_seconds)  # a straggler: the others wait for it in the all-reduce
            if rank == args.hang_rank and step == args.hang_at_step and attempt == 0:
                say(f"rank {rank} hangs at step {step} for {args.hang_seconds:g} s")
                step_log("fault", rank, step, attempt)
                time.sleep(args.hang_seconds)
            loss.backward()
            checkpoint = args.ckpt_every > 0 and step % args.ckpt_every == 0
            logged = 0.0  # seconds, not the step's: its time stays forward, backward and optimizer step
            if step % args.log_every == 0 or step == args.steps or checkpoint:
                # Before the optimizer's step: a rank failing before the
                # all-reduce then leaves the others' parameters as the last
                # completed step left them (docs/in-process.md).
                t1 = time.perf_counter()
                loss_value = mean_loss(loss, world_size, loop)
                logged = time.perf_counter() - t1
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            step_times.append(time.perf_counter() - t0 - logged)

            if rank == 0 and step % args.log_every == 0:
                say(f"step {step} loss {loss_value:.4f}")
            if checkpoint:
                if rank == 0:
                    save_checkpoint(ckpt, model, optimizer, scheduler, step, loss_value)
                # No rank runs ahead to a failure before the file is complete.
                if loop is not None:
                    loop.barrier()
                else:
                    dist.barrier()
            if args.sleep_per_step > 0:
                time.sleep(args.sleep_per_step)
            step_log("step", rank, step, attempt, world_size)

    while args.hold_after_loop and not os.path.exists(args.hold_after_loop):
        time.sleep(0.05)
    if rank == 0:
        say(f"done: steps={args.steps} final_loss={loss_value:.4f} world_size={world_size}")
        print_step_times(args, step_times)
    say(f"params rank={rank} sha256={params_digest(model)}")
    dist.barrier()  # every rank's collectives are over before the hook's communicator closes
    if loop is not None:
        loop.close()
    elif hook is not None:
        hook.close()  # before destroy_process_group: joins the hook's waiter thread
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
