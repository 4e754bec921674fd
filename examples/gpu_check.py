#!/usr/bin/env python3
"""GPU checks of ddp_agent's NCCL transport, as one rank on one NVIDIA GPU.

Run it through examples/gpu_check.sh, which points the package at
bin/libddpshim.so and sets up the one-rank torch.distributed environment:

    examples/gpu_check.sh [--steps 50] [--timing-steps 200] [--json OUT] [--trace OUT] [--only NAME,...]
    examples/gpu_check.sh --dry-run [...]   everything short of the GPU; CI runs it

Each check prints one line, ``PASS name: detail`` or ``FAIL name: detail``,
and a summary follows. Exit status: 0 when every check passed, 1 when one
failed, 2 when the script cannot run here (no torch, no CUDA device, no shim).

  nccl-one-rank         the shim finds the NCCL PyTorch loaded (same version),
                        opens a one-rank communicator and all-reduces CUDA
                        tensors of every dtype with sum and avg.
  parity-fp32           50 SGD steps of a small DDP model with the hook
                        (transport="nccl") end with the parameters that
                        DDP's built-in allreduce_hook gives, bit for bit.
  parity-bf16           the same with compression="bf16" against
                        bf16_compress_hook, within a stated tolerance.
  stream-race           the comm stream is held back (torch.cuda._sleep before
                        the collective); the gradients read right after
                        backward() must still be the reduced ones.
  stream-race-negative  the same delay with a deliberately wrong hook (Future
                        completed on the caller's stream) must give wrong
                        gradients: proof that stream-race can fail.
  overlap               under torch.profiler, the comm stream's kernels run
                        while backward kernels still run.
  step-time             median DDP step time with the hook against the
                        built-in allreduce_hook; goal: within 1 %.
  host-cost             host time spent in the hook function per bucket
                        against the built-in allreduce_hook's; goal: not
                        more (the shim call's share is given too).
  model-resnet50        real models against what a user runs without the
  model-gpt2-small      hook, DDP's default (C++) all-reduce: two DDP copies
  model-gpt-1b          from one seed, one with ddp_agent.register, trained
                        on the same batches at bf16 autocast in interleaved
                        rounds (ABBA, --model-rounds of --model-steps);
                        goal: median step-time ratio <= 1.01, parameters
                        bit-identical; the hook's host time per bucket and
                        per step is reported. The models are in
                        examples/bench/models.py (ResNet-50 from
                        torchvision when installed, else the same
                        architecture written out; GPT-2 small; a ~1.07 B
                        decoder). Not run by default in --only's absence

What one rank can show. NCCL short-cuts a one-rank communicator: an in-place
sum enqueues nothing at all, and avg (which the hook uses for float32)
launches one kernel that multiplies by 1.0 (NCCL's oneRankReduce, a name
without "nccl" in it). The all-reduce itself is an identity here. What these
checks prove is everything around it on a real GPU: the shim drives the NCCL
PyTorch ships, DDP ends up with exactly what its built-in hooks give, the
hook's Future is ordered after the work on its stream (and a wrong ordering
is caught), communication overlaps backward, and the hook is cheap on the
host. The reduction across ranks is checked by python/tests on the fake
NCCL, and needs two GPUs to check on real NCCL.
"""

import argparse
import copy
import inspect
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]

# cuBLAS returns the same bits run after run only with a fixed workspace
# configuration (PyTorch's reproducibility notes); the parity checks compare
# two runs bit for bit. Must be set before the first cuBLAS handle exists.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

try:  # imported here so that a machine without torch gets a message, not a traceback
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
except Exception as _e:  # ImportError, or a broken install
    torch = None  # type: ignore[assignment]
    _TORCH_IMPORT_ERROR: Optional[BaseException] = _e
else:
    _TORCH_IMPORT_ERROR = None

EXIT_FAILED = 1
EXIT_CANNOT_RUN = 2

SEED = 1234
HOOK_TIMEOUT_S = 120.0  # register(timeout=): a hung NCCL enqueue fails a check instead of hanging the run

# Small model (parity, stream race): several buckets from a small cap.
SMALL_DIMS = (128, 512, 512, 512, 64)
SMALL_BATCH = 64
SMALL_BUCKET_MB = 0.25
PARITY_LR = 0.05

# Big model (overlap, step time): backward GEMMs of milliseconds, one bucket
# per 64 MiB weight, so the comm stream has work while backward goes on.
BIG_WIDTH, BIG_DEPTH, BIG_BATCH = 4096, 6, 512
BIG_BUCKET_MB = 25

# Host cost: many buckets of moderate size, the hook's per-call cost dominates nothing.
COST_WIDTH, COST_DEPTH, COST_BATCH = 1024, 16, 64
COST_BUCKET_MB = 4

# bf16 parity: with one rank both hooks do exactly the same arithmetic (cast
# to bf16, divide by 1, an all-reduce that NCCL skips, copy back), so the
# parameters are expected bit-identical, and the detail says whether they
# are. The pass bar is looser, as it would have to be with more ranks, where
# the two sums of bf16 halves may round differently (about one bf16 ulp,
# 2^-8 relative, of a gradient element now and then); at lr 0.05 that moves
# a parameter by far less than rtol 1e-3 over 50 steps. It is no proof that
# the compression was applied: the bit-identity is.
BF16_PARITY_TOL = dict(rtol=1e-3, atol=1e-5)

# Stream race thresholds, as fractions of gradient elements differing from
# the expected value by more than RACE_RTOL. A correct hook gives 0 (both
# sides run the same kernels on the same data); a race gives nearly all of
# the racing buckets' elements wrong.
RACE_RTOL = 1e-6
RACE_CORRECT_MAX = 1e-4
RACE_DETECTED_MIN = 1e-2
RACE_STEPS = 3

STEP_TIME_GOAL = 1.01  # hook / built-in median step time
# Host time per bucket against the built-in allreduce_hook measured in the
# same run, the cost a user would otherwise pay. The first goal, 20 us
# absolute (issue 6), was set before a GPU ran it: on the first H100 host
# (2026-11-25) the built-in hook itself costs 100-130 us per bucket in
# backward's middle, where caches are cold (a lone x.add_(1) is 7 us warm).
# The hook costs about what the built-in does: interleaved rounds on an H200
# (2026-11-26) gave 0.88-1.03, with single rounds from 0.56 to 1.11. The goal
# is parity within that noise, not a win a VM cannot show every time.
HOST_COST_GOAL = 1.10

BACKWARD_LABEL = "gpu_check.backward"

CHECKS = (
    "nccl-one-rank",
    "parity-fp32",
    "parity-bf16",
    "stream-race",
    "stream-race-negative",
    "overlap",
    "step-time",
    "host-cost",
    "model-resnet50",
    "model-gpt2-small",
    "model-gpt-1b",
)

MODEL_GOAL = 1.01  # hook / DDP default, median over rounds


class Result(NamedTuple):
    name: str
    ok: bool
    detail: str
    data: Dict[str, Any]


class Context:
    """What the checks share: options, the device, and the delay calibration."""

    def __init__(self, args: argparse.Namespace, device: "torch.device") -> None:
        self.args = args
        self.device = device
        self.world = dist.get_world_size()
        self._delay: Optional[Tuple[int, float]] = None

    def delay_cycles(self) -> Tuple[int, float]:
        """Returns (cycles for --delay-ms, cycles per ms) for torch.cuda._sleep, measured once.

        _sleep spins one thread on clock64(), whose rate is the SM clock: it
        varies by GPU and by boost, so it is measured rather than assumed.
        """
        if self._delay is None:
            torch.cuda._sleep(1000)  # the first launch loads the kernel
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            n = 20_000_000
            start.record()
            torch.cuda._sleep(n)
            end.record()
            end.synchronize()
            per_ms = n / max(start.elapsed_time(end), 1e-3)
            self._delay = (int(per_ms * self.args.delay_ms), per_ms)
        return self._delay


# -- models and data -----------------------------------------------------------


def _mlp(dims: Tuple[int, ...], seed: int, device: "torch.device") -> "torch.nn.Module":
    """An MLP with deterministic weights: built on the CPU from seed, then moved."""
    torch.manual_seed(seed)
    layers: List[torch.nn.Module] = []
    for i in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).to(device)


def _batches(seed: int, n: int, batch: int, d_in: int, d_out: int, device: "torch.device") -> List[Tuple[Any, Any]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch, d_in, generator=g).to(device), torch.randn(batch, d_out, generator=g).to(device))
        for _ in range(n)
    ]


def _ddp(model: "torch.nn.Module", device: "torch.device", bucket_mb: float) -> "DDP":
    return DDP(model, device_ids=[device.index], bucket_cap_mb=bucket_mb)


def _step(ddp: "DDP", opt: Any, x: Any, y: Any, label: Optional[str] = None) -> None:
    opt.zero_grad(set_to_none=True)
    loss = F.mse_loss(ddp(x), y)
    if label is None:
        loss.backward()
    else:
        from torch.profiler import record_function

        with record_function(label):
            loss.backward()
    opt.step()


def _register_builtin(ddp: "DDP", compression: Optional[str]) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    hook = {None: default_hooks.allreduce_hook, "bf16": default_hooks.bf16_compress_hook}[compression]
    ddp.register_comm_hook(None, hook)  # state None: the default process group


def _register_shim(ddp: "DDP", compression: Optional[str] = None, launch: Optional[str] = None) -> Any:
    """The hook on NCCL; launch None: --launch's choice, through $DDP_AGENT_HOOK_LAUNCH."""
    import ddp_agent

    return ddp_agent.register(ddp, transport="nccl", compression=compression, timeout=HOOK_TIMEOUT_S, launch=launch)


# -- a. nccl-one-rank -----------------------------------------------------------


def check_nccl_one_rank(ctx: Context) -> Tuple[bool, str, Dict[str, Any]]:
    """One-rank communicator on the NCCL PyTorch loaded; every dtype, sum and avg, on a side stream.

    With one rank NCCL's all-reduce must give back its input, so this shows
    that the shim finds and drives the real NCCL (init, enqueue on a given
    stream, avg and bf16 features), not that it reduces across ranks.
    Fails when the shim finds no NCCL, a different version than PyTorch's,
    lacks avg/bfloat16/non-blocking, or any all-reduce errs or changes data.
    """
    import ddp_agent
    from ddp_agent import _shim

    info = ddp_agent.info(transport="nccl")
    nccl = info.get("nccl") or {}
    data: Dict[str, Any] = {"info": info}
    if not nccl.get("found"):
        return False, f"the shim finds no NCCL: {nccl.get('error')}", data
    problems: List[str] = []
    torch_nccl = ".".join(str(v) for v in tuple(torch.cuda.nccl.version())[:3])
    if nccl.get("version") != torch_nccl:
        problems.append(f"the shim's NCCL is {nccl.get('version')} ({nccl.get('source')}), PyTorch's is {torch_nccl}")
    features = nccl.get("features") or {}
    missing = [f for f in ("avg", "bfloat16", "nonblocking") if not features.get(f)]
    if missing:
        problems.append(f"NCCL lacks {', '.join(missing)}")

    torch.cuda.set_device(ctx.device)  # NCCL binds the communicator to the calling thread's device
    cfg = {"rank": 0, "world_size": 1, "transport": "nccl", "bootstrap": "external",
           "timeout_ms": int(HOOK_TIMEOUT_S * 1000), "name": "gpu-check-one-rank"}
    comm = _shim.Comm.open(cfg)
    cases = [
        (torch.float32, _shim.Op.SUM), (torch.float32, _shim.Op.AVG), (torch.float64, _shim.Op.AVG),
        (torch.float16, _shim.Op.SUM), (torch.float16, _shim.Op.AVG), (torch.bfloat16, _shim.Op.SUM),
        (torch.bfloat16, _shim.Op.AVG), (torch.int32, _shim.Op.SUM), (torch.int64, _shim.Op.AVG),
    ]
    dtypes = {torch.float32: _shim.DType.FLOAT32, torch.float64: _shim.DType.FLOAT64,
              torch.float16: _shim.DType.FLOAT16, torch.bfloat16: _shim.DType.BFLOAT16,
              torch.int32: _shim.DType.INT32, torch.int64: _shim.DType.INT64}
    try:
        comm.connect([comm.bootstrap_info()])
        side = torch.cuda.Stream(ctx.device)
        g = torch.Generator().manual_seed(SEED)
        n = (1 << 20) + 3  # not a multiple of NCCL's packs
        issued = 0
        for dtype, op in cases:
            if dtype.is_floating_point:
                x = torch.randn(n, generator=g).to(dtype)
            else:
                x = torch.randint(-1000, 1000, (n,), generator=g, dtype=dtype)
            x = x.to(ctx.device)
            y = x.clone()
            side.wait_stream(torch.cuda.current_stream(ctx.device))  # y is written on the current stream
            label = f"{str(dtype).replace('torch.', '')}/{op.name.lower()}"
            try:
                with torch.cuda.stream(side):
                    work = comm.allreduce(y.data_ptr(), y.numel(), dtypes[dtype], op, stream=side.cuda_stream)
            except _shim.ShimError as e:  # the shim aborts the communicator after an NCCL error: stop here
                problems.append(f"{label}: {e}")
                break
            issued += 1
            try:
                done = work.test()  # the NCCL transport's work is complete once enqueued
            finally:
                work.free()
            side.synchronize()
            if not done:
                problems.append(f"{label}: work not complete after the enqueue returned")
            if not torch.equal(y, x):
                problems.append(f"{label}: one-rank all-reduce changed the data")
        cinfo = comm.info()
    finally:
        comm.close()
    data["comm_info"] = cinfo
    if cinfo.get("transport") != "nccl" or cinfo.get("world_size") != 1:
        problems.append(f"comm info says transport {cinfo.get('transport')!r}, world size {cinfo.get('world_size')}")
    if "collectives" in cinfo and cinfo["collectives"] != issued:
        problems.append(f"comm info counts {cinfo['collectives']} collectives, {issued} were issued")
    if problems:
        return False, "; ".join(problems), data
    # Newer shims also say which CUDA driver they time collectives with; reported, not required.
    cuda = nccl.get("cuda")
    driver = ""
    if isinstance(cuda, dict):
        driver = (f"; CUDA driver {cuda.get('driver')} from {cuda.get('source')}" if cuda.get("found")
                  else f"; no CUDA driver for GPU-side timing: {cuda.get('error')}")
    return True, (
        f"NCCL {nccl['version']} from {nccl['source']} (PyTorch's is {torch_nccl}), non-blocking; "
        f"{len(cases)} one-rank all-reduces of {n} elements (f32, f64, f16, bf16, i32, i64; sum, avg) "
        f"on a side stream returned their input{driver}"
    ), data


# -- b. parity ---------------------------------------------------------------------


def _train_small(ctx: Context, steps: int, hook_kind: str, compression: Optional[str]) -> Dict[str, Any]:
    """Trains the small model for steps SGD steps with one hook; returns its parameters (CPU) and more."""
    model = _mlp(SMALL_DIMS, SEED, ctx.device)
    init = [p.detach().cpu().clone() for p in model.parameters()]
    ddp = _ddp(model, ctx.device, SMALL_BUCKET_MB)
    hook = None
    if hook_kind == "builtin":
        _register_builtin(ddp, compression)
    else:
        hook = _register_shim(ddp, compression)
    opt = torch.optim.SGD(ddp.parameters(), lr=PARITY_LR)
    batches = _batches(SEED + 1, steps, SMALL_BATCH, SMALL_DIMS[0], SMALL_DIMS[-1], ctx.device)
    info = None
    try:
        for x, y in batches:
            _step(ddp, opt, x, y)
        torch.cuda.synchronize()
        if hook is not None:
            info = hook.info()
    finally:
        if hook is not None:
            hook.close()
    return {"params": [p.detach().cpu().clone() for p in model.parameters()], "init": init, "info": info}


def _parity(ctx: Context, compression: Optional[str]) -> Tuple[bool, str, Dict[str, Any]]:
    steps = ctx.args.steps
    base = _train_small(ctx, steps, "builtin", compression)
    mine = _train_small(ctx, steps, "shim", compression)
    pairs = list(zip(mine["params"], base["params"]))
    max_diff = max(float((a - b).abs().max()) for a, b in pairs)
    identical = all(torch.equal(a, b) for a, b in pairs)
    moved = any(not torch.equal(a, b) for a, b in zip(base["params"], base["init"]))
    info = mine["info"] or {}
    data = {"steps": steps, "max_abs_diff": max_diff, "bit_identical": identical, "shim_comm": info}
    problems = []
    if not moved:
        problems.append("the built-in run's parameters never moved (a vacuous comparison)")
    if info.get("transport") != "nccl" or not info.get("collectives"):
        problems.append(f"the hook's communicator is not an NCCL one that ran collectives: {info}")
    via = f"via NCCL ({info.get('collectives')} collectives)"
    builtin = "allreduce_hook" if compression is None else "bf16_compress_hook"
    if compression is None:
        # With one rank both sides compute the same thing: the built-in divides
        # by 1 and sums in place (NCCL enqueues nothing), the hook uses ncclAvg
        # (a multiply by 1.0f). Any difference is a bug, not rounding.
        if not identical:
            problems.append(f"parameters differ from {builtin}'s by up to {max_diff:.3g} (want bit-identical)")
        if problems:
            return False, "; ".join(problems), data
        return True, f"{steps} steps, parameters bit-identical to {builtin}'s (max |diff| 0) {via}", data
    close = all(torch.allclose(a, b, **BF16_PARITY_TOL) for a, b in pairs)
    if not close:
        problems.append(f"parameters differ from {builtin}'s by up to {max_diff:.3g} (tolerance {BF16_PARITY_TOL})")
    if problems:
        return False, "; ".join(problems), data
    note = "bit-identical, as expected with one rank" if identical else (
        "NOT bit-identical, which one rank does not explain (same cast, divide by 1, skipped sum, copy back)")
    return True, (f"{steps} steps, parameters within {BF16_PARITY_TOL} of {builtin}'s, max |diff| {max_diff:.3g}, "
                  f"{note}; {via}"), data


def check_parity_fp32(ctx: Context) -> Tuple[bool, str, Dict[str, Any]]:
    """The hook (fp32, ncclAvg) against allreduce_hook: bit-identical parameters after --steps steps."""
    return _parity(ctx, None)


def check_parity_bf16(ctx: Context) -> Tuple[bool, str, Dict[str, Any]]:
    """The hook with compression="bf16" against bf16_compress_hook: allclose (bit-identical expected)."""
    return _parity(ctx, "bf16")


# -- c, d. stream race ----------------------------------------------------------------
#
# The contract: the hook enqueues its collective on a comm stream and completes
# its Future inside `with torch.cuda.stream(comm_stream)`, so the Future's
# event is recorded after the collective (and the bf16 copy-back) on that
# stream, and DDP's reducer makes its own stream wait for that event before it
# copies the bucket into .grad. The host never waits.
#
# To catch a hook that breaks this, the comm stream is held back: a wrapper
# around NcclTransport._enqueue (the hook's one call into the shim) first runs
# torch.cuda._sleep on the very stream handed to the shim, so the collective
# and everything after it on that stream runs --delay-ms late. Gradients read
# on the caller's stream right after backward() are then right only if the
# reducer really waited for the comm stream.
#
# With one rank the all-reduce is an identity (NCCL enqueues nothing for an
# in-place sum), so late or not, it would leave the bucket as it was and no
# race could show. The late work must change the values:
#   - "bf16": compression="bf16"; the late work is the hook's own copy of the
#     bf16-rounded sum back into the float32 bucket. Expected gradients are
#     the local ones rounded to bf16; a racing reader sees them unrounded.
#   - "fp32x2": no compression (the path where the Future holds the bucket
#     itself); the wrapper scales the bucket by 2 on the comm stream right
#     after the collective, standing in for a second rank's equal
#     contribution. Expected: 2 x the local gradients; a racing reader sees 1 x.
# Both are compared with a plain (non-DDP) copy of the model fed the same batch.
#
# The negative control replaces NcclTransport._allreduce_cuda with a copy that differs
# in one line: the Future is completed after leaving the comm-stream context,
# so its event lands on the caller's stream and the reducer waits for nothing.
# It must give wrong gradients; otherwise the positive check proves nothing.

RACE_VARIANTS = (
    # (name, compression, scale applied on the comm stream after the collective)
    ("bf16", "bf16", 1.0),
    ("fp32x2", None, 2.0),
)

_HOOK_INTERNALS = {
    "_allreduce_cuda": ["self", "comm", "plan", "buf", "step", "index"],
    "_enqueue": ["self", "comm", "tensor", "op", "stream", "step", "index", "note"],
}


def _hook_internals_changed() -> str:
    """Says how _nccl.py's NcclTransport no longer has the methods the race checks wrap, or ""."""
    from ddp_agent._nccl import NcclTransport

    for name, want in _HOOK_INTERNALS.items():
        fn = getattr(NcclTransport, name, None)
        if fn is None:
            return f"ddp_agent._nccl.NcclTransport has no {name}: _nccl.py changed; update gpu_check.py's race checks"
        got = list(inspect.signature(fn).parameters)
        if got != want:
            return (f"NcclTransport.{name}{tuple(got)} is not {tuple(want)}: _nccl.py changed; "
                    "update gpu_check.py's race checks")
    return ""


def _install_delay(hook: Any, cycles: int, scale: float, stats: Dict[str, int]) -> None:
    """Wraps this hook's _enqueue (its NCCL transport's): sleep on the collective's stream, enqueue, then scale there."""
    enqueue = hook._nccl._enqueue  # the bound method

    def delayed_enqueue(comm, tensor, op, stream, step, index, note=""):
        if stream is None:  # a CPU bucket: no stream to hold back
            return enqueue(comm, tensor, op, stream, step, index, note=note)
        if torch.cuda.current_stream(tensor.device).cuda_stream != stream:
            # The hook hands the shim a stream other than the current one: its
            # copy-back and Future would not be ordered after the collective.
            stats["stream_mismatch"] += 1
        # The stream the collective goes on, whatever is current: the delay
        # must land before the collective on that very stream.
        comm_stream = torch.cuda.ExternalStream(stream, device=tensor.device)
        with torch.cuda.stream(comm_stream):
            torch.cuda._sleep(cycles)
        stats["delayed"] += 1
        enqueue(comm, tensor, op, stream, step, index, note=note)
        if scale != 1.0:
            with torch.cuda.stream(comm_stream):
                tensor.mul_(scale)  # in place: nothing allocated on the external stream

    hook._nccl._enqueue = delayed_enqueue  # an instance attribute shadows the method for this hook only


def _wrong_allreduce_cuda(self, comm, plan, buf, step, index):
    """_nccl.py's NcclTransport._allreduce_cuda with one deliberate bug: the Future is completed on the caller's stream.

    Keep in step with _nccl.py (the race checks compare the signatures). The
    only difference is where fut.set_result runs: after the caller's stream
    is current again, so the Future's event is recorded on the caller's
    stream and DDP's reducer does not wait for the comm stream.
    """
    device = buf.device
    comm_stream = self._streams.get(device)
    if comm_stream is None:
        from ddp_agent._nccl import _CommStream

        comm_stream = self._streams[device] = _CommStream(device)
    stream, written = comm_stream.stream, comm_stream.written
    caller = torch.cuda.current_stream(device)
    written.record(caller)
    stream.wait_event(written)
    torch.cuda.set_stream(stream)
    try:
        tensor, op = self._prepare(buf, plan.avg)
        if tensor is not buf:
            tensor.record_stream(stream)
        self._enqueue(comm, tensor, op, stream.cuda_stream, step, index)
        if tensor is not buf:
            buf.copy_(tensor)
    finally:
        torch.cuda.set_stream(caller)
    fut = torch.futures.Future(devices=[device])
    fut.set_result(buf)  # WRONG on purpose: recorded on the caller's stream, not the comm stream
    return fut


def _expected_grad(g: "torch.Tensor", compression: Optional[str], scale: float) -> "torch.Tensor":
    """The reduced gradient of one rank: bf16-rounded (divided by a world of 1), or scaled."""
    if compression == "bf16":
        return g.to(torch.bfloat16).div_(1).to(g.dtype)
    return g * scale


def _mismatch(got: List["torch.Tensor"], want: List["torch.Tensor"]) -> Tuple[int, int, float]:
    """Returns (elements off by more than RACE_RTOL, elements, largest relative difference)."""
    bad, total, worst = 0, 0, 0.0
    for a, b in zip(got, want):
        diff = (a - b).abs()
        bad += int((diff > RACE_RTOL * b.abs()).sum())
        total += b.numel()
        worst = max(worst, float((diff / b.abs().clamp_min(1e-30)).max()))
    return bad, total, worst


def _race_run(ctx: Context, compression: Optional[str], scale: float, wrong: bool, cycles: int) -> Dict[str, Any]:
    """RACE_STEPS backward passes with the delayed comm stream; how wrong the gradients were right after."""
    model = _mlp(SMALL_DIMS, SEED + 7, ctx.device)
    ref = copy.deepcopy(model)  # same weights, no DDP: the local gradients
    ddp = _ddp(model, ctx.device, SMALL_BUCKET_MB)
    # The wrong hook replaces the inline path's _allreduce_cuda: the negative
    # control proves the check can fail, whichever launch the others run.
    hook = _register_shim(ddp, compression, launch="inline" if wrong else None)
    stats = {"delayed": 0, "stream_mismatch": 0}
    out: Dict[str, Any] = {"bad_fraction": [], "max_rel_diff": [], "backward_ms": [], "gpu_busy_after_backward": []}
    try:
        _install_delay(hook, cycles, scale, stats)
        if wrong:
            hook._nccl._allreduce_cuda = types.MethodType(_wrong_allreduce_cuda, hook._nccl)
        batches = _batches(SEED + 8, RACE_STEPS, SMALL_BATCH, SMALL_DIMS[0], SMALL_DIMS[-1], ctx.device)
        for x, y in batches:  # no optimizer step: the weights stay equal to ref's
            ref.zero_grad(set_to_none=True)
            F.mse_loss(ref(x), y).backward()
            want = [_expected_grad(p.grad, compression, scale) for p in ref.parameters()]
            torch.cuda.synchronize()
            model.zero_grad(set_to_none=True)
            before = stats["delayed"]
            t0 = time.perf_counter()
            F.mse_loss(ddp(x), y).backward()
            out["backward_ms"].append((time.perf_counter() - t0) * 1e3)
            # Read right away, on the caller's stream, without waiting for anything.
            got = [p.grad.clone() for p in model.parameters()]
            out["gpu_busy_after_backward"].append(not torch.cuda.current_stream(ctx.device).query())
            out["delays_per_step"] = stats["delayed"] - before  # the last step's: buckets after the rebuild
            # Everything settles before the next step: in the negative control
            # the comm stream still writes buckets that the next step reuses.
            torch.cuda.synchronize()
            bad, total, worst = _mismatch(got, want)
            out["bad_fraction"].append(bad / total)
            out["max_rel_diff"].append(worst)
    finally:
        torch.cuda.synchronize()
        hook.close()
    out.update(stats)
    return out


def _race_summary(name: str, r: Dict[str, Any], per_ms: float, cycles: int) -> str:
    bad = ", ".join(f"{f:.1%}" for f in r["bad_fraction"])
    delay_ms = cycles / per_ms
    per_step = r.get("delays_per_step", 0)
    return (f"{name}: wrong elements per step {bad} (max rel diff {max(r['max_rel_diff']):.2g}); "
            f"{per_step} buckets x {delay_ms:.0f} ms delay, backward returned after "
            f"{statistics.median(r['backward_ms']):.1f} ms"
            + (" with the GPU still busy" if all(r["gpu_busy_after_backward"]) else ""))


def check_stream_race(ctx: Context) -> Tuple[bool, str, Dict[str, Any]]:
    """The real hook with a late comm stream: gradients read right after backward must be the reduced ones.

    Fails when any step has more than RACE_CORRECT_MAX of the elements wrong
    (the reducer did not wait for the comm stream), when no delay was
    injected (the hook no longer goes through _enqueue on a CUDA stream: the
    check would prove nothing), or when the hook gave the shim a stream other
    than the current one.
    """
    changed = _hook_internals_changed()
    if changed:
        return False, changed, {}
    cycles, per_ms = ctx.delay_cycles()
    data: Dict[str, Any] = {"delay_cycles": cycles, "cycles_per_ms": per_ms}
    ok, parts = True, []
    for name, compression, scale in RACE_VARIANTS:
        r = _race_run(ctx, compression, scale, wrong=False, cycles=cycles)
        data[name] = r
        problems = []
        if not r["delayed"]:
            problems.append("no delay was injected (no CUDA bucket reached NcclTransport._enqueue)")
        if r["stream_mismatch"]:
            problems.append(f"{r['stream_mismatch']} enqueues on a stream other than the current one")
        if max(r["bad_fraction"]) > RACE_CORRECT_MAX:
            problems.append("gradients read after backward were not the reduced ones: the reducer did not wait")
        ok = ok and not problems
        parts.append(_race_summary(name, r, per_ms, cycles) + (" -- " + "; ".join(problems) if problems else ""))
    return ok, " | ".join(parts), data


def check_stream_race_negative(ctx: Context) -> Tuple[bool, str, Dict[str, Any]]:
    """A wrong hook (Future completed off the comm stream) with the same delay must give wrong gradients.

    PASS means the race was seen (at least RACE_DETECTED_MIN of the elements
    wrong in some step) for every variant: stream-race is able to fail. A
    FAIL here means the delay was too short or the check is blind, and then
    a PASS of stream-race means nothing.
    """
    changed = _hook_internals_changed()
    if changed:
        return False, changed, {}
    cycles, per_ms = ctx.delay_cycles()
    data: Dict[str, Any] = {"delay_cycles": cycles, "cycles_per_ms": per_ms}
    ok, parts = True, []
    for name, compression, scale in RACE_VARIANTS:
        r = _race_run(ctx, compression, scale, wrong=True, cycles=cycles)
        data[name] = r
        seen = bool(r["delayed"]) and max(r["bad_fraction"]) >= RACE_DETECTED_MIN
        ok = ok and seen
        parts.append(_race_summary(name, r, per_ms, cycles)
                     + (" -- race detected" if seen else " -- race NOT detected: the check is blind"))
    return ok, "wrong hook: " + " | ".join(parts), data


# -- e. overlap ------------------------------------------------------------------------


def _trace_overlap(path: str, label: str) -> Dict[str, Any]:
    """Reads a Chrome trace from torch.profiler: do comm-stream kernels overlap backward kernels?

    Backward kernels: kernels whose launch (the CUDA runtime or driver call
    with the same correlation id) falls inside a `label` range on the CPU.
    The compute stream is the one most of them ran on; comm kernels are the
    kernels on any other stream, and any kernel whose name says "nccl".
    Without launch records (no correlation ids), every compute-stream kernel
    counts: a comm kernel can only overlap backward work anyway, since DDP's
    reducer makes the compute stream wait for the comm stream before the
    optimizer step.
    """
    with open(path) as f:
        trace = json.load(f)
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    launches: Dict[Any, float] = {}
    ranges: List[Tuple[float, float]] = []
    kernels: List[Dict[str, Any]] = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat, args = e.get("cat", ""), e.get("args") or {}
        try:
            ts, dur = float(e.get("ts", 0)), float(e.get("dur", 0))
        except (TypeError, ValueError):
            continue
        if cat in ("cuda_runtime", "cuda_driver"):
            if args.get("correlation") is not None:
                launches[args["correlation"]] = ts
        elif cat == "kernel":
            kernels.append({"name": e.get("name", ""), "start": ts, "end": ts + dur, "stream": args.get("stream"),
                            "correlation": args.get("correlation")})
        elif e.get("name") == label and cat != "gpu_user_annotation":
            ranges.append((ts, ts + dur))

    def in_backward(k: Dict[str, Any]) -> Optional[bool]:
        t = launches.get(k["correlation"])
        if t is None:
            return None
        return any(a <= t <= b for a, b in ranges)

    launched_in_bwd = [k for k in kernels if in_backward(k)]
    streams: Dict[Any, int] = {}
    for k in launched_in_bwd or kernels:
        streams[k["stream"]] = streams.get(k["stream"], 0) + 1
    compute = max(streams, key=lambda s: streams[s]) if streams else None
    nccl_named = [k for k in kernels if "nccl" in k["name"].lower()]
    comm = [k for k in kernels if k["stream"] != compute or "nccl" in k["name"].lower()]
    if launched_in_bwd:
        backward = [k for k in launched_in_bwd if k["stream"] == compute]
    else:
        backward = [k for k in kernels if k["stream"] == compute]
    backward.sort(key=lambda k: k["start"])
    overlapping, overlap_us = 0, 0.0
    for c in comm:
        spans = [min(c["end"], b["end"]) - max(c["start"], b["start"]) for b in backward
                 if b["start"] < c["end"] and c["start"] < b["end"]]
        if spans:
            overlapping += 1
            overlap_us += sum(spans)
    names = sorted({k["name"][:80] for k in comm})
    return {
        "kernels": len(kernels), "backward_ranges": len(ranges), "launch_records": len(launches),
        "compute_stream": compute, "backward_kernels": len(backward), "comm_kernels": len(comm),
        "comm_streams": sorted({str(k["stream"]) for k in comm}), "nccl_named_kernels": len(nccl_named),
        "comm_kernels_overlapping_backward": overlapping, "overlap_us": overlap_us, "comm_kernel_names": names[:5],
        "backward_from_launches": bool(launched_in_bwd),
    }


def check_overlap(ctx: Context) -> Tuple[bool, str, Dict[str, Any]]:
    """Profiles a few steps of the big model: some comm-stream kernel must run while backward kernels run.

    With one rank the comm stream's kernels are NCCL's one-rank avg kernel
    (oneRankReduce, one per bucket; no "nccl" in its name) rather than ring
    kernels; NCCL kernels are counted apart, and any on another stream count
    too. Fails when the profiler sees no kernels, when the comm stream ran
    no kernel, or when none of its kernels overlapped a backward kernel
    (communication serialized after backward: a host wait, or one stream).
    """
    from torch.profiler import ProfilerActivity, profile

    model = _mlp((BIG_WIDTH,) * (BIG_DEPTH + 1), SEED + 20, ctx.device)
    ddp = _ddp(model, ctx.device, BIG_BUCKET_MB)
    hook = _register_shim(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    (x, y), = _batches(SEED + 21, 1, BIG_BATCH, BIG_WIDTH, BIG_WIDTH, ctx.device)
    try:
        for _ in range(5):  # NCCL init, bucket rebuild, cuBLAS warm-up stay out of the trace
            _step(ddp, opt, x, y)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                _step(ddp, opt, x, y, label=BACKWARD_LABEL)
            torch.cuda.synchronize()
        buckets = len(hook.schedule[max(hook.schedule)]) if hook.schedule else 0
    finally:
        hook.close()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        if ctx.args.trace:
            shutil.copyfile(path, ctx.args.trace)
        stats = _trace_overlap(path, BACKWARD_LABEL)
    stats["buckets_per_step"] = buckets
    summary = (f"{stats['comm_kernels_overlapping_backward']} of {stats['comm_kernels']} comm-stream kernels "
               f"overlapped {stats['backward_kernels']} backward kernels ({stats['overlap_us']:.0f} us in all; "
               f"{stats['nccl_named_kernels']} kernels named nccl; {buckets} buckets/step, 3 steps; "
               f"comm kernels {stats['comm_kernel_names'][:2]})")
    if not stats["kernels"]:
        return False, "the profiler recorded no CUDA kernels (CUPTI unavailable?)", stats
    if not stats["backward_ranges"]:
        return False, f"no '{BACKWARD_LABEL}' range in the trace; " + summary, stats
    if not stats["comm_kernels"]:
        return False, "no kernel ran on the comm stream: nothing to overlap; " + summary, stats
    return stats["comm_kernels_overlapping_backward"] > 0, summary, stats


# -- f. step time ------------------------------------------------------------------------


def check_step_time(ctx: Context) -> Tuple[bool, str, Dict[str, Any]]:
    """Median step time of the big model, the hook against allreduce_hook, steps interleaved.

    Two DDP copies of the same model, stepped alternately (each step timed
    from a synchronized GPU to a synchronized GPU), so clock drift and other
    load hit both alike. Fails when hook / built-in exceeds STEP_TIME_GOAL.
    """
    runs: Dict[str, Dict[str, Any]] = {}
    hook = None
    try:
        for kind in ("builtin", "shim"):
            model = _mlp((BIG_WIDTH,) * (BIG_DEPTH + 1), SEED + 30, ctx.device)
            ddp = _ddp(model, ctx.device, BIG_BUCKET_MB)
            if kind == "builtin":
                _register_builtin(ddp, None)
            else:
                hook = _register_shim(ddp)
            runs[kind] = {"ddp": ddp, "opt": torch.optim.SGD(ddp.parameters(), lr=1e-4), "ms": []}
        (x, y), = _batches(SEED + 31, 1, BIG_BATCH, BIG_WIDTH, BIG_WIDTH, ctx.device)
        warmup, n = max(10, ctx.args.timing_steps // 10), ctx.args.timing_steps
        for i in range(warmup + n):
            for kind in (("builtin", "shim") if i % 2 == 0 else ("shim", "builtin")):
                r = runs[kind]
                torch.cuda.synchronize()
                t0 = time.perf_counter_ns()
                _step(r["ddp"], r["opt"], x, y)
                torch.cuda.synchronize()
                if i >= warmup:
                    r["ms"].append((time.perf_counter_ns() - t0) / 1e6)
    finally:
        if hook is not None:
            hook.close()
    med = {k: statistics.median(r["ms"]) for k, r in runs.items()}
    ratio = med["shim"] / med["builtin"]
    data = {"median_ms": med, "ratio": ratio, "steps": n, "warmup": warmup,
            "p90_ms": {k: sorted(r["ms"])[int(0.9 * (len(r["ms"]) - 1))] for k, r in runs.items()}}
    detail = (f"median step {med['shim']:.3f} ms with the hook, {med['builtin']:.3f} ms with allreduce_hook: "
              f"ratio {ratio:.4f} (goal <= {STEP_TIME_GOAL}; {n} steps each after {warmup} warm-up, "
              f"{BIG_DEPTH}x{BIG_WIDTH}^2 MLP, batch {BIG_BATCH})")
    return ratio <= STEP_TIME_GOAL, detail, data


# -- g. host cost -------------------------------------------------------------------------


def _timed(fn: Callable, samples: List[int]) -> Callable:
    """fn wrapped to append its duration in ns; DDP requires the second parameter to be named bucket."""

    def timed_hook(state, bucket):
        t0 = time.perf_counter_ns()
        try:
            return fn(state, bucket)
        finally:
            samples.append(time.perf_counter_ns() - t0)

    return timed_hook


class _CostRun:
    """One model under one hook, with the host time of each call DDP makes to it."""

    def __init__(self, ctx: Context, kind: str) -> None:
        import ddp_agent.hook as hook_mod
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.kind = kind
        self.samples: List[int] = []
        self.shim: List[int] = []
        self.hook = None
        self.ddp = _ddp(_mlp((COST_WIDTH,) * (COST_DEPTH + 1), SEED + 40, ctx.device), ctx.device, COST_BUCKET_MB)
        if kind == "builtin":
            self.ddp.register_comm_hook(None, _timed(default_hooks.allreduce_hook, self.samples))
        else:
            # register() passes hook.py's module-level _comm_hook to DDP; wrap it there for this one call.
            original = hook_mod._comm_hook
            hook_mod._comm_hook = _timed(original, self.samples)
            try:
                self.hook = _register_shim(self.ddp)
            finally:
                hook_mod._comm_hook = original
            enqueue = self.hook._nccl._enqueue  # the bound method: the hook's one call into the shim
            shim = self.shim

            def timed_enqueue(*a, **kw):
                t0 = time.perf_counter_ns()
                try:
                    return enqueue(*a, **kw)
                finally:
                    shim.append(time.perf_counter_ns() - t0)

            self.hook._nccl._enqueue = timed_enqueue  # an instance attribute shadows the method for this hook only
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=1e-4)
        (self.x, self.y), = _batches(SEED + 41, 1, COST_BATCH, COST_WIDTH, COST_WIDTH, ctx.device)

    def steps(self, n: int) -> List[int]:
        """Runs n steps; returns the host times of their hook calls (ns)."""
        first = len(self.samples)
        for _ in range(n):
            _step(self.ddp, self.opt, self.x, self.y)
        torch.cuda.synchronize()
        return self.samples[first:]

    def close(self) -> None:
        if self.hook is not None:
            self.hook.close()


def _cost_summary(samples: List[int], steps: int) -> Dict[str, Any]:
    us = sorted(s / 1e3 for s in samples)
    return {"calls": len(us), "steps": steps, "median_us": statistics.median(us),
            "p90_us": us[int(0.9 * (len(us) - 1))], "max_us": us[-1]}


def check_host_cost(ctx: Context) -> Tuple[bool, str, Dict[str, Any]]:
    """Median host time per call of the registered hook function against the built-in allreduce_hook's.

    The hook runs on the autograd thread holding the GIL, so this time is
    taken from backward's critical path. Both are timed the same way
    (perf_counter_ns around the function DDP calls), on two copies of one
    model, in interleaved blocks of a few steps (ABBA order): a VM's host
    speed drifts by 2x within seconds (2026-11-26, H200: one run after the
    other gave ratios of 0.70 to 1.83 in six tries), and interleaving puts
    both under the same drift. The ratio is of the pooled medians; each
    round's ratio is kept for the spread. Fails above HOST_COST_GOAL.
    """
    runs = {"shim": _CostRun(ctx, "shim"), "builtin": _CostRun(ctx, "builtin")}
    rounds, block = 10, max(2, ctx.args.timing_steps // 40)
    pooled: Dict[str, List[int]] = {k: [] for k in runs}
    per_round: List[float] = []
    try:
        for run in runs.values():  # communicator open, NCCL agreement, bucket rebuild
            run.steps(10)
        for r in range(rounds):
            order = ["shim", "builtin"] if r % 2 == 0 else ["builtin", "shim"]
            got = {k: runs[k].steps(block) for k in order}
            for k, v in got.items():
                pooled[k].extend(v)
            per_round.append(statistics.median(got["shim"]) / statistics.median(got["builtin"]))
    finally:
        for run in runs.values():
            run.close()
    mine = _cost_summary(pooled["shim"], rounds * block)
    mine["shim_call_median_us"] = statistics.median(s / 1e3 for s in runs["shim"].shim[-len(pooled["shim"]):])
    base = _cost_summary(pooled["builtin"], rounds * block)
    ratio = mine["median_us"] / base["median_us"]
    spread = sorted(per_round)
    data = {"shim": mine, "builtin": base, "ratio": ratio, "goal_ratio": HOST_COST_GOAL,
            "round_ratios": per_round, "rounds": rounds, "steps_per_block": block}
    detail = (f"median {mine['median_us']:.1f} us per bucket (p90 {mine['p90_us']:.1f}, max {mine['max_us']:.0f}; "
              f"{mine['shim_call_median_us']:.1f} us of it in the shim call; {mine['calls']} calls over "
              f"{mine['steps']} steps), built-in allreduce_hook {base['median_us']:.1f} us, interleaved in "
              f"{rounds} rounds of {block} steps: ratio {ratio:.3f} (rounds {spread[0]:.2f}-{spread[-1]:.2f}; "
              f"goal <= {HOST_COST_GOAL:g})")
    return ratio <= HOST_COST_GOAL, detail, data


# -- h. real models against DDP's default ----------------------------------------------


def _models_module() -> Any:
    if str(REPO / "examples" / "bench") not in sys.path:
        sys.path.insert(0, str(REPO / "examples" / "bench"))
    import models  # examples/bench/models.py

    return models


def _model_copy(ctx: Context, spec: Any, hooked: bool, samples: List[int]) -> Dict[str, Any]:
    """One DDP copy of spec's model from the shared seed: with the hook (its calls timed) or DDP's default."""
    import ddp_agent.hook as hook_mod

    torch.manual_seed(SEED + 50)
    model, source = spec.build()
    model = model.to(ctx.device)
    if spec.channels_last:
        model = model.to(memory_format=torch.channels_last)
    ddp = _ddp(model, ctx.device, spec.bucket_cap_mb)
    hook = None
    if hooked:
        original = hook_mod._comm_hook
        hook_mod._comm_hook = _timed(original, samples)
        try:
            hook = _register_auto(ddp)
        finally:
            hook_mod._comm_hook = original
    return {"ddp": ddp, "opt": torch.optim.SGD(ddp.parameters(), lr=1e-4, momentum=0.9), "hook": hook,
            "source": source, "ms": []}


def _register_auto(ddp: "DDP") -> Any:
    """The hook as a user registers it: transport auto (NCCL for CUDA buckets), no compression."""
    import ddp_agent

    return ddp_agent.register(ddp, timeout=HOOK_TIMEOUT_S)  # launch: --launch's, through $DDP_AGENT_HOOK_LAUNCH


def _check_model(ctx: Context, name: str) -> Tuple[bool, str, Dict[str, Any]]:
    """Step time of one real model with the hook against DDP's default all-reduce (no hook), interleaved."""
    models = _models_module()
    spec = models.full_size()[name]
    samples: List[int] = []
    copies: Dict[str, Dict[str, Any]] = {}
    try:
        copies["hook"] = _model_copy(ctx, spec, True, samples)
        copies["default"] = _model_copy(ctx, spec, False, samples)
        g = torch.Generator().manual_seed(SEED + 51)
        batches = []
        for _ in range(ctx.args.model_steps):
            x, y = spec.batch(g, ctx.device)
            if spec.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            batches.append((x, y))
        autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
        for c in copies.values():  # communicator, buckets rebuilt after the first step, cuDNN's choices
            for x, y in batches[:3]:
                models.step(c["ddp"], c["opt"], spec, x, y, autocast())
        torch.cuda.synchronize()
        warm_calls = len(samples)
        per_round: List[float] = []
        for r in range(ctx.args.model_rounds):
            for kind in (("hook", "default") if r % 2 == 0 else ("default", "hook")):
                c = copies[kind]
                torch.cuda.synchronize()
                t0 = time.perf_counter_ns()
                for x, y in batches:
                    models.step(c["ddp"], c["opt"], spec, x, y, autocast())
                torch.cuda.synchronize()
                c["ms"].append((time.perf_counter_ns() - t0) / 1e6 / len(batches))
            per_round.append(copies["hook"]["ms"][-1] / copies["default"]["ms"][-1])
        identical = all(torch.equal(a, b) for a, b in zip(copies["hook"]["ddp"].parameters(),
                                                          copies["default"]["ddp"].parameters()))
        params = models.parameters(copies["hook"]["ddp"].module)
        source = copies["hook"]["source"]
        step_ms = {k: statistics.median(c["ms"]) for k, c in copies.items()}
    finally:
        for c in copies.values():
            if c["hook"] is not None:
                c["hook"].close()
        copies.clear()
        torch.cuda.empty_cache()
    steps = ctx.args.model_rounds * ctx.args.model_steps
    calls = samples[warm_calls:]
    per_bucket = statistics.median(calls) / 1e3 if calls else 0.0
    buckets = len(calls) / steps if steps else 0.0
    ratio = statistics.median(per_round)
    spread = sorted(per_round)
    data = {"model": spec.describe, "source": source, "parameters": params, "ratio": ratio,
            "round_ratios": per_round, "rounds": ctx.args.model_rounds, "steps_per_round": ctx.args.model_steps,
            "identical": identical, "median_step_ms": step_ms, "hook_us_per_bucket": per_bucket, "buckets_per_step": buckets,
            "hook_us_per_step": per_bucket * buckets, "goal": MODEL_GOAL}
    detail = (f"{spec.describe} ({params / 1e6:.1f} M parameters, {source}), bf16 autocast: step time with the "
              f"hook {step_ms['hook']:.2f} ms / DDP's default all-reduce {step_ms['default']:.2f} ms: {ratio:.4f} (median of {len(per_round)} rounds of "
              f"{ctx.args.model_steps} steps, {spread[0]:.3f}-{spread[-1]:.3f}; goal <= {MODEL_GOAL}); hook host "
              f"time {per_bucket:.1f} us per bucket, {buckets:g} buckets a step; parameters "
              f"{'bit-identical' if identical else 'DIFFER'}")
    return ratio <= MODEL_GOAL and identical, detail, data


def check_model_resnet50(ctx: Context) -> Tuple[bool, str, Dict[str, Any]]:
    return _check_model(ctx, "resnet50")


def check_model_gpt2_small(ctx: Context) -> Tuple[bool, str, Dict[str, Any]]:
    return _check_model(ctx, "gpt2-small")


def check_model_gpt_1b(ctx: Context) -> Tuple[bool, str, Dict[str, Any]]:
    return _check_model(ctx, "gpt-1b")


# -- main ---------------------------------------------------------------------------------

CHECK_FUNCS = {
    "nccl-one-rank": check_nccl_one_rank,
    "parity-fp32": check_parity_fp32,
    "parity-bf16": check_parity_bf16,
    "stream-race": check_stream_race,
    "stream-race-negative": check_stream_race_negative,
    "overlap": check_overlap,
    "step-time": check_step_time,
    "host-cost": check_host_cost,
    "model-resnet50": check_model_resnet50,
    "model-gpt2-small": check_model_gpt2_small,
    "model-gpt-1b": check_model_gpt_1b,
}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=50, help="SGD steps of the parity checks (default 50)")
    p.add_argument("--timing-steps", type=int, default=200,
                   help="timed steps per hook in step-time (default 200); host-cost times a quarter of that")
    p.add_argument("--launch", choices=("inline", "thread"), default="inline",
                   help="register(launch=...) for every check but the negative control (default inline): "
                        "where the hook issues NCCL buckets; run once with each to compare")
    p.add_argument("--model-rounds", type=int, default=20,
                   help="interleaved rounds of the model-* checks (default 20)")
    p.add_argument("--model-steps", type=int, default=8, help="steps per copy and round in model-* (default 8)")
    p.add_argument("--delay-ms", type=float, default=20.0,
                   help="how late the stream-race checks make each bucket's collective (default 20)")
    p.add_argument("--json", metavar="OUT", help="write every result, with its figures, to OUT as JSON")
    p.add_argument("--trace", metavar="OUT", help="keep the overlap check's Chrome trace at OUT")
    p.add_argument("--only", metavar="NAMES", help="comma-separated checks to run: " + ", ".join(CHECKS))
    p.add_argument("--dry-run", action="store_true",
                   help="check everything short of the GPU (arguments, imports, the shim and NCCL it finds), "
                        "print what would run, and exit 0 (even without a CUDA device)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.timing_steps < 1 or args.delay_ms <= 0 or args.model_rounds < 1 or args.model_steps < 1:
        p.error("--steps, --timing-steps, --model-rounds and --model-steps must be positive, --delay-ms above 0")
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in CHECK_FUNCS]
        if unknown:
            p.error(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECKS)}")
        args.only = names
    return args


def _point_at_shim() -> str:
    """As python/tests/conftest.py: the in-tree package first, $DDP_AGENT_SHIM absolute. Returns a problem or ""."""
    shim = os.path.abspath(os.environ.get("DDP_AGENT_SHIM") or str(REPO / "bin" / "libddpshim.so"))
    if not os.path.isfile(shim):
        return (f"libddpshim.so not found at {shim} (from $DDP_AGENT_SHIM or <repo>/bin): run `make build` "
                f"where Go and gcc are, and copy bin/libddpshim.so here")
    os.environ["DDP_AGENT_SHIM"] = shim
    if str(REPO / "python") not in sys.path:
        sys.path.insert(0, str(REPO / "python"))
    return ""


def _init_distributed(device: "torch.device") -> None:
    """One rank of an NCCL process group, from the environment gpu_check.sh sets (defaults when run alone)."""
    if not os.environ.get("MASTER_PORT"):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    for k, v in (("WORLD_SIZE", "1"), ("RANK", "0"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method="env://")


def _write_json(path: str, results: List[Result], env: Dict[str, Any], args: argparse.Namespace) -> None:
    doc = {
        "env": env,
        "args": {k: v for k, v in vars(args).items()},
        "passed": sum(r.ok for r in results),
        "failed": sum(not r.ok for r in results),
        "results": [{"name": r.name, "ok": r.ok, "detail": r.detail, "data": r.data} for r in results],
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True, default=str)


def _dry_run(args: argparse.Namespace) -> int:
    """--dry-run: everything main does short of CUDA, so a lent GPU's minutes go to the GPU, not to a typo.

    Imports every module a check imports, loads the shim and asks it for
    NCCL (ddp_agent.info, which never initializes CUDA), and prints what
    would run. Returns 0, or EXIT_CANNOT_RUN when the shim is missing or
    does not load.
    """
    problem = _point_at_shim()
    if problem:
        print(f"gpu_check: {problem}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    import ddp_agent
    import ddp_agent.hook  # noqa: F401  (host-cost patches it)
    import torch.profiler  # noqa: F401  (overlap)
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: F401  (parity, host-cost)

    if any(n.startswith("model-") for n in (args.only or CHECKS)):
        models = _models_module()  # the model-* checks' architectures, built once on the CPU here
        for name in (n[len("model-"):] for n in (args.only or CHECKS) if n.startswith("model-")):
            spec = models.full_size(batch_scale=1 / 64)[name]
            if name != "gpt-1b":  # 4 GB of float32 on the CPU: the GPU run builds it
                model, source = spec.build()
                print(f"gpu_check: dry run: {name}: {models.parameters(model) / 1e6:.1f} M parameters ({source})")

    info = ddp_agent.info(transport="nccl")
    if "error" in info["shim"]:
        print(f"gpu_check: the shim does not load: {info['shim']['error']}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    nccl = info["nccl"]
    found = (f"NCCL {nccl.get('version')} from {nccl.get('source')}" if nccl.get("found")
             else f"no NCCL ({nccl.get('error')})")
    cuda = torch.cuda.is_available()
    print(f"gpu_check: dry run: torch {torch.__version__} (CUDA build {torch.version.cuda}), "
          f"shim {info['shim'].get('version')} at {ddp_agent.shim_path()}, {found}, "
          f"CUDA device {'present' if cuda else 'absent: a real run would exit 2 (no CUDA device)'}")
    print(f"gpu_check: would run: {', '.join(args.only or CHECKS)} (steps {args.steps}, "
          f"timing steps {args.timing_steps}, delay {args.delay_ms:g} ms, launch {args.launch}"
          + (f", json {args.json}" if args.json else "") + (f", trace {args.trace}" if args.trace else "") + ")")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    os.environ["DDP_AGENT_HOOK_LAUNCH"] = args.launch  # register()'s default in this process
    if torch is None:
        print(f"gpu_check: no CUDA device: torch cannot be imported by {sys.executable} ({_TORCH_IMPORT_ERROR})",
              file=sys.stderr)
        return EXIT_CANNOT_RUN
    if args.dry_run:
        return _dry_run(args)
    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda}); "
              f"run it on a machine with an NVIDIA GPU", file=sys.stderr)
        return EXIT_CANNOT_RUN
    problem = _point_at_shim()
    if problem:
        print(f"gpu_check: {problem}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    import ddp_agent

    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    env: Dict[str, Any] = {
        "torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(device),
        "torch_nccl": torch.cuda.nccl.version(), "ddp_agent": ddp_agent.__version__,
        "shim": ddp_agent.shim_path(), "info": ddp_agent.info(transport="nccl"),
    }
    print(f"gpu_check: {env['device']}, torch {env['torch']} (CUDA {env['cuda']}, NCCL {env['torch_nccl']}), "
          f"shim {env['shim']}", flush=True)
    try:
        _init_distributed(device)
    except Exception as e:  # NCCL missing from this torch build, a port in use, ...
        print(f"gpu_check: cannot start the one-rank NCCL process group: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    if dist.get_world_size() != 1:
        print(f"gpu_check: meant for one rank, got WORLD_SIZE {dist.get_world_size()}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    ctx = Context(args, device)

    results: List[Result] = []
    try:
        for name in args.only or CHECKS:
            t0 = time.monotonic()
            try:
                ok, detail, data = CHECK_FUNCS[name](ctx)
            except Exception as e:  # one broken check must not hide the others
                traceback.print_exc()
                ok, detail, data = False, f"raised {type(e).__name__}: {e}", {"traceback": traceback.format_exc()}
            data["seconds"] = round(time.monotonic() - t0, 2)
            results.append(Result(name, ok, detail, data))
            print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    finally:
        failed = [r.name for r in results if not r.ok]
        print(f"gpu_check: {len(results) - len(failed)} passed, {len(failed)} failed of {len(results)} checks"
              + (f" (failed: {', '.join(failed)})" if failed else ""), flush=True)
        if args.json:
            _write_json(args.json, results, env, args)
            print(f"gpu_check: results in {args.json}", flush=True)
        if dist.is_initialized():
            dist.destroy_process_group()
    return EXIT_FAILED if failed else 0


if __name__ == "__main__":
    sys.exit(main())
