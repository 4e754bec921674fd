"""Buckets through the shim's NCCL transport: CUDA buckets on a communication stream, or host memory.

A CUDA bucket goes on a communication stream per device that first waits
for the caller's current stream. Under that stream the bucket is
(optionally) compressed, the shim enqueues ncclAllReduce, the result is
copied back into the bucket and a ``Future(devices=[device])`` completed, so
DDP's reducer waits for the stream with an event instead of the host
waiting for the data.
"""

from typing import Dict, Optional, Tuple

import torch

from . import _buckets, _shim
from ._agreement import NcclAgreement, NcclPlan
from ._bootstrap import Communicators
from ._failure import FirstError
from ._shim import ShimError, Status


class _CommStream:
    """A device's communication stream, and the event that orders it after the caller's stream."""

    __slots__ = ("stream", "written")

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device)
        # Reused for every bucket: cudaStreamWaitEvent waits for the record
        # made just before it, whatever the event recorded earlier.
        self.written = torch.cuda.Event()


class NcclTransport:
    """All-reduces buckets with the shim's NCCL communicator, on the device of the first one."""

    def __init__(
        self, comms: Communicators, agreement: NcclAgreement, failure: FirstError, compression: Optional[str]
    ) -> None:
        self._comms = comms
        self._agreement = agreement
        self._failure = failure
        self._compression = compression
        self._streams: Dict[torch.device, _CommStream] = {}

    def allreduce(self, buf: torch.Tensor, step: int, index: int) -> torch.futures.Future:
        """All-reduces buf and returns its Future; blocks until NCCL has enqueued it (at most the timeout).

        The first call also blocks for the NCCL agreement and the
        communicator's bootstrap. Raises ShimError for a failure, and for
        every bucket after one (NCCL's ranks are then out of step).
        """
        name = self._comms.name
        self._comms.check_open()
        _buckets.check(buf, index)
        if self._failure.error is not None:  # NCCL's ranks are out of step after a failure: never enqueue again
            raise ShimError(
                Status.ABORTED,
                f"ddp_agent hook {name}: an earlier failure stopped its NCCL all-reduces: {self._failure.error}",
                "ddp_agent hook",
            )
        plan = self._agreement.plan()
        if not plan.ok:
            err = ShimError(Status.UNAVAILABLE, f"transport 'nccl' of {name}: {plan.why}", "ddp_agent hook")
            self._failure.record(err)
            raise err
        if self._compression == "bf16" and buf.dtype in _buckets.COMPRESSIBLE and not plan.bfloat16:
            raise ValueError(
                f"ddp_agent: compression='bf16' needs NCCL 2.10 or later (ncclBfloat16) on every rank, "
                f"but this job has {plan.describe}; use compression='fp16'"
            )
        comm = self._comms.open("nccl", buf.device)
        if buf.device != self._comms.nccl_device:
            raise ValueError(
                f"ddp_agent: bucket {index} is on {buf.device}, but the NCCL communicator of {name} "
                f"was opened on {self._comms.nccl_device}; one device per process"
            )
        if buf.device.type == "cuda":
            return self._allreduce_cuda(comm, plan, buf, step, index)
        # A CPU bucket, no stream: the call returns with the data reduced.
        tensor, op = self._prepare(buf, plan.avg)
        self._enqueue(
            comm, tensor, op, None, step, index,
            note=f"bucket {index} is on the CPU: transport='nccl' gives NCCL host memory, which only an NCCL "
            "working on host memory takes; use transport='auto' or 'host' for a model on the CPU",
        )
        if tensor is not buf:
            buf.copy_(tensor)
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(buf)
        return fut

    def _prepare(self, buf: torch.Tensor, avg: bool) -> Tuple[torch.Tensor, int]:
        return _buckets.prepare(buf, self._comms.world_size, self._compression, avg)

    # examples/gpu_check.py wraps _allreduce_cuda and _enqueue (and checks their signatures).

    def _allreduce_cuda(
        self, comm: _shim.Comm, plan: NcclPlan, buf: torch.Tensor, step: int, index: int
    ) -> torch.futures.Future:
        # This runs on the autograd thread between backward kernels, so its
        # host time delays backward: plain calls rather than torch.cuda's
        # device and stream context managers, and one reused event rather than
        # wait_stream's new one (about 30 us less per bucket on an H100 host;
        # docs/gpu-runs/README.md).
        device = buf.device
        if torch.cuda.current_device() != device.index:
            # set_stream below would leave the bucket's device current.
            with torch.cuda.device(device):
                return self._allreduce_cuda(comm, plan, buf, step, index)
        comm_stream = self._streams.get(device)
        if comm_stream is None:
            comm_stream = self._streams[device] = _CommStream(device)
        stream, written = comm_stream.stream, comm_stream.written
        caller = torch.cuda.current_stream(device)
        # The bucket was written on the caller's stream: wait for it there, not on the host.
        written.record(caller)
        stream.wait_event(written)
        # What runs from here on goes on the comm stream (set_stream makes it
        # the device's current stream), the Future's completion event included.
        torch.cuda.set_stream(stream)
        try:
            tensor, op = self._prepare(buf, plan.avg)
            if tensor is not buf:
                # Made on this stream, so the allocator reuses it only after
                # the all-reduce; said out loud in case that ever changes.
                tensor.record_stream(stream)
            self._enqueue(comm, tensor, op, stream.cuda_stream, step, index)
            if tensor is not buf:
                buf.copy_(tensor)
            # Completed on the comm stream: the Future records an event on
            # it, and DDP's reducer makes its own stream wait on that.
            fut: torch.futures.Future = torch.futures.Future(devices=[device])
            fut.set_result(buf)
        finally:
            torch.cuda.set_stream(caller)
        return fut

    def _enqueue(
        self, comm: _shim.Comm, tensor: torch.Tensor, op: int, stream: Optional[int], step: int, index: int,
        note: str = "",
    ) -> None:
        """Has the shim enqueue an NCCL all-reduce of tensor; blocks until enqueued (at most the timeout)."""
        dtype, count = _buckets.shim_count(tensor)
        try:
            # The NCCL transport fails the call itself when the enqueue fails,
            # and its work is complete at return: no handle to wait on or free.
            comm.enqueue(tensor.data_ptr(), count, dtype, op, stream, step, index)
        except ShimError as e:
            if note:
                e = ShimError(e.code, f"{e.message} ({note})", e.call)
            self._failure.record(e)
            raise e from None

