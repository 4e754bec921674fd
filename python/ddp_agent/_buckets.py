"""Gradient buckets: what the hook accepts, how it makes one the average, and the schedule it keeps."""

import logging
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch

from . import _shim
from ._options import COMPRESSIONS

log = logging.getLogger("ddp_agent")

# Compression applies to these bucket types; others are reduced as they are.
COMPRESSIBLE = (torch.float32, torch.float64)

# torch dtype -> (shim dtype, elements per torch element). Complex tensors are
# all-reduced as their interleaved real and imaginary parts.
DTYPES = {
    torch.float32: (_shim.DType.FLOAT32, 1),
    torch.float64: (_shim.DType.FLOAT64, 1),
    torch.float16: (_shim.DType.FLOAT16, 1),
    torch.bfloat16: (_shim.DType.BFLOAT16, 1),
    torch.int32: (_shim.DType.INT32, 1),
    torch.int64: (_shim.DType.INT64, 1),
    torch.complex64: (_shim.DType.FLOAT32, 2),
    torch.complex128: (_shim.DType.FLOAT64, 2),
}
# Divided before a SUM rather than averaged after it: the sum could overflow.
_DIVIDE_FIRST = (torch.float16, torch.bfloat16)


class BucketInfo(NamedTuple):
    """One bucket as DDP handed it to the hook."""

    index: int
    numel: int
    dtype: str  # "float32", "bfloat16", ...


def check(buf: torch.Tensor, index: int) -> None:
    """Raises ValueError for a bucket the shim cannot reduce (not dense and contiguous, or its dtype)."""
    if buf.layout != torch.strided or not buf.is_contiguous():
        raise ValueError(
            f"ddp_agent: bucket {index} buffer must be a dense contiguous tensor, got layout {buf.layout}"
            + (f" with strides {buf.stride()}" if buf.layout == torch.strided else "")
        )
    if buf.dtype not in DTYPES:
        raise ValueError(
            f"ddp_agent: bucket {index} has dtype {buf.dtype}, which the shim does not reduce "
            f"(supported: {', '.join(str(d) for d in DTYPES)})"
        )


def shim_count(tensor: torch.Tensor) -> Tuple[int, int]:
    """Returns the shim's dtype for tensor and how many of its elements tensor holds."""
    dtype, per_element = DTYPES[tensor.dtype]
    return dtype, tensor.numel() * per_element


def prepare(buf: torch.Tensor, world_size: int, compression: Optional[str], avg: bool) -> Tuple[torch.Tensor, int]:
    """Returns the tensor to all-reduce in place and the op that make it the average of buf.

    The tensor is buf itself, or with compression a new half-precision
    copy, already divided by the world size, that the caller copies back.
    Half types are divided before a sum (a sum first could overflow),
    and so is everything when the transport has no AVG.
    """
    n = world_size
    target = COMPRESSIONS.get(compression) if compression else None
    if target is not None and buf.dtype in COMPRESSIBLE:
        return buf.to(target).div_(n), _shim.Op.SUM
    if avg and buf.dtype not in _DIVIDE_FIRST:
        return buf, _shim.Op.AVG
    if buf.is_floating_point() or buf.is_complex():
        buf.div_(n)
    else:
        buf.div_(n, rounding_mode="trunc")
    return buf, _shim.Op.SUM


class Schedule:
    """The buckets of each step, as DDP hands them to the hook; written by the training thread only.

    Attributes:
        step: number of iterations whose last bucket has been recorded.
        by_step: step -> list of :class:`BucketInfo`, for step 0 and for every
            step whose buckets differ from the step before.
    """

    def __init__(self, name: str, rank: int) -> None:
        self.name = name
        self.rank = rank
        self.step = 0
        self.by_step: Dict[int, List[BucketInfo]] = {}
        self._current: List[BucketInfo] = []
        self._last: Optional[List[BucketInfo]] = None

    def record(self, index: int, buf: torch.Tensor, is_last: bool) -> int:
        """Records one bucket and returns the step it belongs to; logs the buckets when they change."""
        step = self.step
        self._current.append(BucketInfo(index, buf.numel(), str(buf.dtype).replace("torch.", "")))
        if not is_last:
            return step
        buckets, self._current = self._current, []
        self.step = step + 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s rank %d step %d: %d buckets %s", self.name, self.rank, step, len(buckets), _fmt(buckets))
        if buckets != self._last:
            self.by_step[step] = buckets
            what = "buckets" if self._last is None else "buckets rebuilt"
            log.info("%s: step %d: %d buckets %s", what, step, len(buckets), _fmt(buckets))
            self._last = buckets
        return step


def _fmt(buckets: List[BucketInfo]) -> str:
    return "[" + ", ".join(f"#{b.index} {b.numel} {b.dtype}" for b in buckets) + "]"
