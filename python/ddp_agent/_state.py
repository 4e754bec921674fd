"""Moving the model's and optimizer's state from a healthy rank to the others, for a re-formation in process.

The state goes through the new hook's host communicator when there is one
(CPU tensors, the shim's host transport): each tensor all-reduced in
place with SUM, the source's values against the others' negative zeros
(the tensors under SMALL_BYTES packed into one collective per dtype).
A sum whose other terms are all -0.0 is the source's value bit for bit
(-0.0 is the identity of IEEE addition, where +0.0 would turn a -0.0 into
+0.0), so this is a broadcast through the shim. On the 2-core VM the
survivors' state phase took 75-85 ms this way, 87-120 ms through gloo's
broadcasts, tensor by tensor (docs/in-process.md). Without that
communicator (CUDA tensors, a hook-less wrap), and for dtypes the shim
does not reduce, torch.distributed's broadcast does it.
"""

import time
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from . import _shim
from ._buckets import DTYPES

# The bucket that labels the state's all-reduces in ddp-agent's telemetry:
# no DDP bucket has that index, so they never take a gradient
# collective's key.
STATE_BUCKET = 2**31 - 1

# Tensors smaller than this go into one collective per dtype (move).
SMALL_BYTES = 64 << 10


def move(tensors: List[torch.Tensor], src: int, rank: int, comm: Optional[_shim.Comm], *,
         label_step: int) -> Tuple[int, float]:
    """Makes every rank's tensors the source's; returns the bytes moved and the milliseconds it took.

    Every rank passes its tensors in the same order, shapes and dtypes
    (the layout the source published). label_step is the step the
    all-reduces carry in the agent's telemetry.
    """
    if comm is not None:
        # Every rank here before the clock starts, and the communicator's
        # first collective (its setup) paid: the time is the move's.
        one = torch.zeros(1)
        work = comm.allreduce(one.data_ptr(), 1, _shim.DType.FLOAT32, _shim.Op.SUM, step=label_step, bucket=STATE_BUCKET)
        try:
            work.wait()
        finally:
            work.free()
    t0 = time.monotonic()
    big, rest, moved = [], [], []
    small: Dict[torch.dtype, List[torch.Tensor]] = {}
    seen = set()
    for t in tensors:
        alias = (t.data_ptr(), t.numel(), t.dtype)
        if alias in seen:
            # A tied weight, twice in the state dict: summed twice, it would
            # double on the receivers.
            continue
        seen.add(alias)
        moved.append(t)
        if comm is None or t.device.type != "cpu" or t.dtype not in DTYPES or t.is_complex() or not t.is_contiguous():
            rest.append(t)
        elif t.numel() * t.element_size() < SMALL_BYTES:
            small.setdefault(t.dtype, []).append(t)
        else:
            big.append(t)
    # The small tensors (biases, norms' weights, counters), one
    # collective per dtype: each collective pays a round of the ranks'
    # handshakes, and 16 of them took 1.5-2 times as long as one of the
    # same bytes (docs/in-process.md).
    packed = [(torch.cat([t.reshape(-1) for t in group]), group) for group in small.values()]  # the source's values
    sums = big + [flat for flat, _ in packed]
    if rank != src:
        # Every buffer ready before the first collective: queued back to
        # back, the transport runs them without waiting on this loop.
        for t in sums:
            t.fill_(-0.0 if t.dtype.is_floating_point else 0)
    works = []
    try:
        for t in sums:
            works.append(_sum_in_place(comm, t, label_step))
        for w in works:
            w.wait()
    finally:
        for w in works:
            w.free()
    if rank != src:
        for flat, group in packed:
            offset = 0
            for t in group:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
    for t in rest:
        _broadcast(t, src)
    return sum(t.numel() * t.element_size() for t in moved), round((time.monotonic() - t0) * 1e3, 1)


def _sum_in_place(comm: _shim.Comm, t: torch.Tensor, label_step: int) -> Any:
    """Queues t's all-reduce (SUM, in place) on comm; returns the work."""
    shim_dtype, per_element = DTYPES[t.dtype]
    return comm.allreduce(t.data_ptr(), t.numel() * per_element, shim_dtype, _shim.Op.SUM, step=label_step,
                          bucket=STATE_BUCKET)


def _broadcast(t: torch.Tensor, src: int) -> None:
    """torch.distributed's broadcast of t, a bool tensor's too (gloo has no bool: its bytes go)."""
    if t.dtype != torch.bool:
        dist.broadcast(t, src)
        return
    raw = t.contiguous().view(torch.uint8)
    dist.broadcast(raw, src)
    if raw.data_ptr() != t.data_ptr():
        t.copy_(raw.view(torch.bool))


def optimizer_layout(optimizer: Any) -> Dict[str, Any]:
    """The optimizer's state as the source has it: which tensors, and every other value."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    tensors, values = [], []
    for i, p in enumerate(params):
        for k, v in sorted(optimizer.state.get(p, {}).items()):
            if isinstance(v, torch.Tensor):
                tensors.append((i, k, tuple(v.shape), v.dtype))
            else:
                values.append((i, k, v))
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    return {"tensors": tensors, "values": values, "groups": groups}


def apply_layout(optimizer: Any, layout: Dict[str, Any]) -> None:
    """Gives this rank's optimizer the source's layout: the tensors to receive into, the other values."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for g, saved in zip(optimizer.param_groups, layout["groups"]):
        g.update(saved)
    state: Dict[Any, Dict[str, Any]] = {}
    for i, k, shape, dtype in layout["tensors"]:
        old = optimizer.state.get(params[i], {}).get(k)
        ok = isinstance(old, torch.Tensor) and tuple(old.shape) == shape and old.dtype == dtype
        state.setdefault(params[i], {})[k] = old if ok else torch.empty(shape, dtype=dtype, device=params[i].device)
    for i, k, v in layout["values"]:
        state.setdefault(params[i], {})[k] = v
    optimizer.state.clear()
    optimizer.state.update(state)
