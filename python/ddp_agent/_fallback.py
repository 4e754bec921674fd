"""Buckets the shim does not take: all-reduced with torch.distributed on the process group, or refused."""

import functools
import logging
from typing import Any, Optional

import torch
import torch.distributed as dist

from . import _buckets
from ._options import COMPRESSIONS

log = logging.getLogger("ddp_agent")


class TorchFallback:
    """What DDP's default hook does, for transport "auto" where NCCL cannot be loaded on some rank.

    Attributes:
        reason: why the shim does not take the buckets, for the one warning.
    """

    def __init__(self, group: Any, transport: str, compression: Optional[str], world_size: int) -> None:
        self._group = group
        self._transport = transport
        self._compression = compression
        self._world_size = world_size
        self._warned = False
        self.reason = ""

    def allreduce(self, buf: torch.Tensor) -> torch.futures.Future:
        """Starts torch.distributed's all-reduce of buf and returns its Future (averaged, as the hook's).

        Raises ValueError under transport "host" or "nccl", which refuse
        buckets their transport does not take.
        """
        if self._transport == "host":
            raise ValueError(
                f"ddp_agent: transport 'host' reduces CPU tensors only, but DDP handed the hook a "
                f"{buf.device} bucket; use transport='auto' (NCCL for CUDA buckets, else "
                f"torch.distributed) or keep the model on the CPU"
            )
        if self._transport == "nccl":
            raise ValueError(
                f"ddp_agent: transport 'nccl' reduces CUDA buckets (and CPU ones with an NCCL that works on "
                f"host memory), but DDP handed the hook a {buf.device} bucket; use transport='auto'"
            )
        if not self._warned:
            self._warned = True
            reason = self.reason or f"the shim does not reduce {buf.device.type} memory"
            log.warning(
                "ddp_agent: %s buckets are all-reduced with torch.distributed on the process group: %s",
                buf.device.type,
                reason,
            )
        n = self._world_size
        target = COMPRESSIONS.get(self._compression) if self._compression else None
        if target is not None and buf.dtype in _buckets.COMPRESSIBLE:
            compressed = buf.to(target).div_(n)
            work = dist.all_reduce(compressed, group=self._group, async_op=True)
            return work.get_future().then(functools.partial(_copy_back, buf))
        buf.div_(n)
        work = dist.all_reduce(buf, group=self._group, async_op=True)
        return work.get_future().then(_first)


def _first(fut: torch.futures.Future) -> torch.Tensor:
    return fut.value()[0]


def _copy_back(buf: torch.Tensor, fut: torch.futures.Future) -> torch.Tensor:
    buf.copy_(fut.value()[0])  # decompress into the bucket (no second bucket-sized buffer)
    return buf
