"""The training script's own collectives inside an ``InProcess`` step, through the hook's host communicator.

A script's ``torch.distributed.all_reduce`` of its loss, or its
``barrier()`` after a checkpoint, runs over gloo, which nothing aborts: a
rank that raised before reaching it left its peers there until the
re-formation's rendezvous gave up and the job fell back to the process
restart (docs/in-process.md, Limits). ``InProcess.all_reduce`` and
``InProcess.barrier`` run them through the shim instead, on the hook's
host communicator, queued behind the gradients' all-reduces: a failing
rank's abort fails them at once, and its peers' step goes on to the
re-formation.
"""

from typing import Any, Optional

import torch
import torch.distributed as dist

from . import _buckets, _shim

# The buckets that label a script's collectives in ddp-agent's telemetry,
# from this one down, one per collective of a step: the ranks' records of
# one collective meet under (step, bucket), so two in a step must differ.
# All of them are above any DDP bucket's index and below the buffers'
# broadcast (_buffers.BUFFERS_BUCKET) and the state's move
# (_state.STATE_BUCKET); the agent counts no training step for them.
SCRIPT_BUCKET = 2**31 - 3
# How many a step may label before the labels repeat (ddp-agent's own
# buckets are the top 2**20: telemetry.OwnBuckets).
_PER_STEP = 2**20 - 3

OPS = ("sum", "avg")


class Labels:
    """Gives each of a step's collectives its bucket: the same sequence on every rank, which run the same ones."""

    def __init__(self) -> None:
        self._step: Optional[int] = None
        self._n = 0

    def next(self, step: int) -> int:
        if step != self._step:
            self._step, self._n = step, 0
        bucket = SCRIPT_BUCKET - self._n % _PER_STEP
        self._n += 1
        return bucket


def all_reduce(hook: Any, tensor: torch.Tensor, op: str, labels: Labels) -> torch.Tensor:
    """All-reduces tensor in place on every rank (op "sum" or "avg") and returns it.

    Through the hook's host communicator for a dense contiguous CPU tensor
    of a dtype the shim reduces; anything else (a CUDA tensor, no hook)
    goes through torch.distributed's all-reduce, which a failing rank
    cannot abort. Raises the shim's error when a rank fails or aborts
    meanwhile.
    """
    if op not in OPS:
        raise ValueError(f"ddp_agent.InProcess.all_reduce: op {op!r}: want one of {', '.join(OPS)}")
    comm = host(hook)
    shim_ok = (tensor.device.type == "cpu" and tensor.layout == torch.strided and tensor.is_contiguous()
               and tensor.dtype in _buckets.DTYPES)
    with torch.no_grad():
        if comm is None or not shim_ok:
            dist.all_reduce(tensor)
            if op == "avg" and (tensor.is_floating_point() or tensor.is_complex()):
                tensor.div_(dist.get_world_size())
            elif op == "avg":
                tensor.div_(dist.get_world_size(), rounding_mode="trunc")
            return tensor
        target, shim_op = (_buckets.prepare(tensor, hook.world_size, None, avg=True) if op == "avg"
                           else (tensor, _shim.Op.SUM))
        dtype, count = _buckets.shim_count(target)
        work = comm.allreduce(target.data_ptr(), count, dtype, shim_op, step=hook.step, bucket=labels.next(hook.step))
        try:
            work.wait()
        finally:
            work.free()
    return tensor


def barrier(hook: Any, labels: Labels) -> None:
    """Waits for every rank: a one-element all-reduce through the hook's host communicator, else torch's barrier."""
    if host(hook) is None:
        dist.barrier()
        return
    all_reduce(hook, torch.zeros(1), "sum", labels)


def host(hook: Any) -> Optional[_shim.Comm]:
    """hook's open host communicator, or None (no hook of ddp_agent's, a closed one, CUDA buckets only)."""
    comms = getattr(hook, "_comms", None)
    return None if comms is None or hook.closed else comms.get("host")
