"""Buckets through the shim's NCCL transport: CUDA buckets on a communication stream, or host memory.

A CUDA bucket goes on a communication stream per device that first waits
for the caller's current stream. Under that stream the bucket is
(optionally) compressed, the shim enqueues ncclAllReduce, the result is
copied back into the bucket and a ``Future(devices=[device])`` completed, so
DDP's reducer waits for the stream with an event instead of the host
waiting for the data.
"""

import functools
from typing import Dict, List, Optional, Tuple

import torch

from . import _buckets, _shim
from ._agreement import NcclAgreement, NcclPlan
from ._bootstrap import Communicators
from ._failure import FirstError
from ._launcher import Launcher
from ._shim import ShimError, Status


_CPU_NOTE = (
    "bucket {index} is on the CPU: transport='nccl' gives NCCL host memory, which only an NCCL "
    "working on host memory takes; use transport='auto' or 'host' for a model on the CPU"
)


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
        self, comms: Communicators, agreement: NcclAgreement, failure: FirstError, compression: Optional[str],
        launch: str = "inline",
    ) -> None:
        self._comms = comms
        self._agreement = agreement
        self._failure = failure
        self._compression = compression
        self._streams: Dict[torch.device, _CommStream] = {}
        # launch="thread": the enqueue runs on a launcher thread (_launcher.py);
        # events that thread has waited for come back here for reuse.
        self._launcher: Optional[Launcher] = Launcher(comms.name + "-nccl") if launch == "thread" else None
        self._free_events: List["torch.cuda.Event"] = []

    def allreduce(self, buf: torch.Tensor, step: int, index: int, last: bool = False) -> torch.futures.Future:
        """All-reduces buf and returns its Future; blocks until NCCL has enqueued it (at most the timeout).

        The first call also blocks for the NCCL agreement and the
        communicator's bootstrap. Raises ShimError for a failure, and for
        every bucket after one (NCCL's ranks are then out of step). With
        launch="thread" the enqueue happens on the launcher thread instead
        and this returns at once, except for a step's last bucket (last),
        where it waits until every bucket has been issued and raises the
        first failure.
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
        comm = self._comms.open("nccl", buf.device, (step, index))
        if buf.device != self._comms.nccl_device:
            raise ValueError(
                f"ddp_agent: bucket {index} is on {buf.device}, but the NCCL communicator of {name} "
                f"was opened on {self._comms.nccl_device}; one device per process"
            )
        if self._launcher is not None:
            return self._launch(comm, plan, buf, step, index, last)
        if buf.device.type == "cuda":
            return self._allreduce_cuda(comm, plan, buf, step, index)
        # A CPU bucket, no stream: the call returns with the data reduced.
        tensor, op = self._prepare(buf, plan.avg)
        self._enqueue(comm, tensor, op, None, step, index, note=_CPU_NOTE.format(index=index))
        if tensor is not buf:
            buf.copy_(tensor)
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(buf)
        return fut

    def _launch(
        self, comm: _shim.Comm, plan: NcclPlan, buf: torch.Tensor, step: int, index: int, last: bool
    ) -> torch.futures.Future:
        """The autograd thread's part with launch="thread": an event where buf is written, the Future, a job."""
        launcher = self._launcher
        assert launcher is not None
        written = None
        if buf.device.type == "cuda":
            written = self._free_events.pop() if self._free_events else torch.cuda.Event()
            # Recorded here, on the autograd thread, on the stream backward
            # wrote the bucket with: exactly its gradients, nothing later.
            written.record(torch.cuda.current_stream(buf.device))
            fut: torch.futures.Future = torch.futures.Future(devices=[buf.device])
        else:
            fut = torch.futures.Future()
        launcher.submit(functools.partial(self._launched, comm, plan, buf, step, index, written, fut))
        if last:
            # Backward's kernels are all launched by now; DDP's reducer waits
            # for every Future next. Waiting here lets a failure raise out of
            # backward with the shim's words instead of as an unreadable Future.
            if not launcher.drain(self._comms.timeout_ms / 1000 + 5):
                err = ShimError(Status.TIMEOUT, f"ddp_agent hook {self._comms.name}: the launcher thread did not "
                                "issue the step's buckets within the timeout", "ddp_agent hook")
                self._failure.record(err)
                raise err
            if self._failure.error is not None:
                raise self._failure.error
        return fut

    def _launched(
        self, comm: _shim.Comm, plan: NcclPlan, buf: torch.Tensor, step: int, index: int,
        written: Optional["torch.cuda.Event"], fut: torch.futures.Future,
    ) -> None:
        """The launcher thread's part: issue the all-reduce and complete fut; a failure fails fut."""
        try:
            if self._failure.error is not None:  # NCCL's ranks are out of step: never enqueue again
                raise ShimError(
                    Status.ABORTED,
                    f"ddp_agent hook {self._comms.name}: an earlier failure stopped its NCCL all-reduces: "
                    f"{self._failure.error}",
                    "ddp_agent hook",
                )
            if written is None:  # a CPU bucket: reduced when the call returns
                tensor, op = self._prepare(buf, plan.avg)
                self._enqueue(comm, tensor, op, None, step, index, note=_CPU_NOTE.format(index=index))
                if tensor is not buf:
                    buf.copy_(tensor)
                fut.set_result(buf)
                return
            device = buf.device
            comm_stream = self._streams.get(device)
            if comm_stream is None:
                comm_stream = self._streams[device] = _CommStream(device)
                # This thread's current device and stream, for good: what runs
                # here (the cast, the copy back, the Future's event) goes on the comm stream.
                torch.cuda.set_device(device)
                torch.cuda.set_stream(comm_stream.stream)
            stream = comm_stream.stream
            stream.wait_event(written)
            self._free_events.append(written)  # the wait is enqueued: a later record cannot change it
            tensor, op = self._prepare(buf, plan.avg)
            if tensor is not buf:
                tensor.record_stream(stream)
            self._enqueue(comm, tensor, op, stream.cuda_stream, step, index)
            if tensor is not buf:
                buf.copy_(tensor)
            fut.set_result(buf)
        except BaseException as e:  # ShimError, or anything unexpected: fail the Future, never hang it
            self._failure.record(e)
            fut.set_exception(e)

    def stop(self, at_exit: bool) -> None:
        """Lets the launcher issue what is queued (at exit: waits at most 1 s) and stops it."""
        if self._launcher is not None:
            self._launcher.stop(1.0 if at_exit else self._comms.timeout_ms / 1000 + 5)

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

