"""The DDP communication hook that all-reduces gradient buckets through libddpshim.so.

    ddp = DistributedDataParallel(model)
    hook = ddp_agent.register(ddp)
    ... train ...
    hook.close()                     # before dist.destroy_process_group()
    dist.destroy_process_group()

What DDP expects of a hook (PyTorch 1.13 through 2.x), and how this one
meets it:

- DDP calls ``hook(state, bucket)`` once per gradient bucket, in bucket
  order, on every rank; the hook returns a ``torch.futures.Future`` holding
  one tensor shaped like ``bucket.buffer()``. DDP's reducer does not average
  when a hook is registered, so the hook averages: float32/float64 and
  integer buckets with the shim's AVG op; float16/bfloat16 buckets are
  divided by the world size first and then summed (no overflow).
- CPU buckets (transport "auto" or "host"): the hook starts the shim's
  non-blocking all-reduce on its host transport and returns; one waiter
  thread per hook blocks in the shim (GIL released) on each bucket in turn
  and completes its Future, so communication overlaps the rest of the
  backward pass.
- CUDA buckets (transport "auto" or "nccl"): the shim's NCCL transport, on
  a communication stream per device that first waits for the caller's
  current stream. Under that stream the hook (optionally) compresses, has
  the shim enqueue ncclAllReduce, copies the result back into the bucket and
  completes a ``Future(devices=[device])``, so DDP's reducer waits for the
  stream with an event instead of the host waiting for the data. The shim's
  call returns once NCCL has enqueued the collective (bounded by the
  timeout). Float32/float64 buckets use ncclAvg when every rank's NCCL has
  it (2.10+), else they are divided first and summed.
- Transport "nccl" with CPU buckets: the same NCCL communicator with no
  stream; only an NCCL that works on host memory (the test suite's fake)
  takes it, and the data is there when the call returns.
- Compression ("fp16", "bf16"): float32/float64 buckets are cast to the
  half type and divided by the world size before the sum, and copied back
  afterwards, as PyTorch's fp16_compress_hook and bf16_compress_hook do.
- Buckets change: the first iteration's buckets are rebuilt after it (after
  two with ``static_graph``), so nothing here assumes fixed sizes. The
  schedule is logged and kept on :attr:`Hook.schedule`.
- ``DDP.join()`` calls the hook outside backward, for zero-filled shadow
  buckets; nothing here depends on being called from backward.
- Where NCCL cannot be loaded on some rank, transport="auto" all-reduces
  CUDA buckets with ``torch.distributed.all_reduce`` on the process group
  (what DDP's default hook does) and logs one warning saying why; whether
  to use NCCL is agreed by all ranks (through torch's store) at the first
  CUDA bucket, so they never take different paths. transport="host"
  refuses CUDA buckets; transport="nccl" fails without NCCL.
- A failure (an NCCL error, with NCCL's own words in the message; a
  timeout) raises out of the hook call, and so out of ``backward()``; the
  hook keeps it in :attr:`Hook.error` and fails later NCCL buckets at once.

Nothing here touches ``torch.cuda`` for CPU buckets.
"""

import atexit
import datetime
import functools
import hashlib
import json
import logging
import os
import queue
import threading
import time
from typing import Any, Dict, List, NamedTuple, Optional, Set, Tuple, Union

import torch
import torch.distributed as dist

from . import _shim, _stacks
from ._shim import ShimError, Status

__all__ = [
    "BucketInfo",
    "COMPRESSIONS",
    "DEFAULT_TIMEOUT_S",
    "ENV_SHIM_CONFIG",
    "ENV_TIMEOUT",
    "Hook",
    "TRANSPORTS",
    "info",
    "register",
]

log = logging.getLogger("ddp_agent")

ENV_TIMEOUT = "DDP_AGENT_COLLECTIVE_TIMEOUT"
"""Default collective timeout in seconds, when register() gets no timeout."""

DEFAULT_TIMEOUT_S = 600.0
"""Collective timeout without timeout= and without $DDP_AGENT_COLLECTIVE_TIMEOUT."""

ENV_SHIM_CONFIG = "DDP_AGENT_SHIM_CONFIG"
"""Extra keys for the communicator's ddpshim_open config, as a JSON object.

For example ``{"shm": false}`` (TCP between ranks on one host too),
``{"log_level": "debug"}``, ``{"host": "10.0.0.5"}`` or ``{"nccl_lib":
"/opt/nccl/lib/libnccl.so.2"}``; see ddpshim.h. The keys go to the host and
the NCCL communicator alike.
"""

_OWN_KEYS = ("rank", "world_size", "name")  # set from the process group and the registration only

TRANSPORTS = ("auto", "host", "nccl")
"""Values of register()'s transport."""

COMPRESSIONS = {"fp16": torch.float16, "bf16": torch.bfloat16}
"""Values of register()'s compression (besides None), and the type buckets are cast to."""
# Compression applies to these bucket types; others are reduced as they are.
_COMPRESSIBLE = (torch.float32, torch.float64)

# torch dtype -> (shim dtype, elements per torch element). Complex tensors are
# all-reduced as their interleaved real and imaginary parts.
_DTYPES = {
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


class _NcclPlan(NamedTuple):
    """What every rank agreed on at the first NCCL bucket (see Hook._agree_on_nccl)."""

    ok: bool  # every rank has NCCL
    avg: bool  # every rank's NCCL has ncclAvg
    bfloat16: bool  # every rank's NCCL has ncclBfloat16
    why: str  # when not ok: the ranks without NCCL and their reasons
    describe: str  # when ok: "NCCL 2.20.5 (libnccl.so.2)"


class Hook:
    """The state of one registration: the communicators, the waiter thread, the bucket schedule.

    Made by :func:`register`; DDP passes it to the hook function as its
    state. Call :meth:`close` after training and before
    ``torch.distributed.destroy_process_group()``; it also runs at
    interpreter exit.

    Attributes:
        rank, world_size: this process's rank in ``group`` and the group's size.
        group: the process group whose ranks take part.
        transport: "auto", "host" or "nccl".
        compression: None, "fp16" or "bf16".
        timeout_ms: bound on the bootstrap and on each collective.
        name: the host communicator's name, the same on every rank; the
            NCCL communicator's is this plus "-nccl".
        step: number of iterations whose last bucket has been handed to the hook.
        schedule: step -> list of :class:`BucketInfo`, for step 0 and for every
            step whose buckets differ from the step before (a step missing
            from it had the buckets of the closest earlier step present).
        error: the first failure of a collective or of opening a
            communicator, or None.
    """

    def __init__(
        self,
        group: Any,
        *,
        transport: str,
        timeout_ms: int,
        name: str,
        compression: Optional[str] = None,
    ) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.transport = transport
        self.compression = compression
        self.timeout_ms = timeout_ms
        self.name = name
        self.step = 0
        self.schedule: Dict[int, List[BucketInfo]] = {}
        self.error: Optional[BaseException] = None

        self._lock = threading.Lock()
        self._closed = False
        # "host" and "nccl" communicators, each opened at its first bucket.
        self._comms: Dict[str, _shim.Comm] = {}
        self._open_errors: Dict[str, BaseException] = {}
        self._nccl_device: Optional[torch.device] = None
        self._nccl_plan: Optional[_NcclPlan] = None
        self._nccl_plan_error: Optional[BaseException] = None
        self._streams: Dict[torch.device, Any] = {}  # device -> torch.cuda.Stream
        self._queue: "queue.SimpleQueue[Optional[tuple]]" = queue.SimpleQueue()
        self._waiter: Optional[threading.Thread] = None
        # Host all-reduces queued and completed; one writer each (the hook's
        # thread, the waiter), so their difference is what is in flight.
        self._issued = 0
        self._completed = 0
        self._current: List[BucketInfo] = []
        self._last: Optional[List[BucketInfo]] = None
        self._fallback_reason = ""
        self._warned_fallback = False

    # -- the hook --------------------------------------------------------

    def _run(self, bucket: dist.GradBucket) -> torch.futures.Future:
        buf = bucket.buffer()
        index, is_last = bucket.index(), bucket.is_last()
        step = self.step
        self._record(step, index, buf, is_last)
        kind = buf.device.type
        if kind == "cpu":
            if self.transport == "nccl":
                return self._allreduce_nccl(buf, step, index)
            return self._allreduce_host(buf, step, index)
        if kind == "cuda" and self.transport != "host":
            if self.transport == "nccl":
                return self._allreduce_nccl(buf, step, index)
            plan = self._plan()
            if plan.ok:
                return self._allreduce_nccl(buf, step, index)
            self._fallback_reason = plan.why
        return self._allreduce_fallback(buf)

    def _record(self, step: int, index: int, buf: torch.Tensor, is_last: bool) -> None:
        self._current.append(BucketInfo(index, buf.numel(), str(buf.dtype).replace("torch.", "")))
        if not is_last:
            return
        buckets, self._current = self._current, []
        self.step = step + 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s rank %d step %d: %d buckets %s", self.name, self.rank, step, len(buckets), _fmt(buckets))
        if buckets != self._last:
            self.schedule[step] = buckets
            what = "buckets" if self._last is None else "buckets rebuilt"
            log.info("%s: step %d: %d buckets %s", what, step, len(buckets), _fmt(buckets))
            self._last = buckets

    def _check_bucket(self, buf: torch.Tensor, index: int) -> None:
        if self._closed:  # the communicators (and the waiter) are gone
            raise ShimError(Status.CLOSED, f"ddp_agent hook {self.name} was closed", "ddp_agent hook")
        if buf.layout != torch.strided or not buf.is_contiguous():
            raise ValueError(
                f"ddp_agent: bucket {index} buffer must be a dense contiguous tensor, got layout {buf.layout}"
                + (f" with strides {buf.stride()}" if buf.layout == torch.strided else "")
            )
        if buf.dtype not in _DTYPES:
            raise ValueError(
                f"ddp_agent: bucket {index} has dtype {buf.dtype}, which the shim does not reduce "
                f"(supported: {', '.join(str(d) for d in _DTYPES)})"
            )

    def _prepare(self, buf: torch.Tensor, avg: bool) -> Tuple[torch.Tensor, int]:
        """Returns the tensor to all-reduce in place and the op that make it the average of buf.

        The tensor is buf itself, or with compression a new half-precision
        copy, already divided by the world size, that the caller copies back.
        Half types are divided before a sum (a sum first could overflow),
        and so is everything when the transport has no AVG.
        """
        n = self.world_size
        target = COMPRESSIONS.get(self.compression) if self.compression else None
        if target is not None and buf.dtype in _COMPRESSIBLE:
            return buf.to(target).div_(n), _shim.Op.SUM
        if avg and buf.dtype not in _DIVIDE_FIRST:
            return buf, _shim.Op.AVG
        if buf.is_floating_point() or buf.is_complex():
            buf.div_(n)
        else:
            buf.div_(n, rounding_mode="trunc")
        return buf, _shim.Op.SUM

    def _allreduce_host(self, buf: torch.Tensor, step: int, index: int) -> torch.futures.Future:
        self._check_bucket(buf, index)
        comm = self._comms.get("host") or self._open("host")
        tensor, op = self._prepare(buf, avg=True)
        dtype, per_element = _DTYPES[tensor.dtype]
        try:
            work = comm.allreduce(tensor.data_ptr(), tensor.numel() * per_element, dtype, op, step=step, bucket=index)
        except ShimError as e:  # e.g. ABORTED: an earlier failure, a peer gone, the agent's Abort
            self._failed(e)
            raise
        fut: torch.futures.Future = torch.futures.Future()
        with self._lock:  # against a concurrent close(): queued before its sentinel, or not at all
            if self._closed:
                work.free()
                raise ShimError(Status.CLOSED, f"ddp_agent hook {self.name} was closed", "ddp_agent hook")
            if self._waiter is None:
                self._waiter = threading.Thread(
                    target=self._wait_loop, name=f"ddp_agent-waiter-{self.name}", daemon=True
                )
                self._waiter.start()
            self._issued += 1
            # buf and tensor stay referenced until the work is done
            self._queue.put((work, buf, tensor, fut))
        # A Future completed by set_exception holds the exception as its
        # value; DDP's reducer would fail to read it as a tensor, with a
        # message that hides ours. then() turns it into a real error whose
        # message carries the ShimError's.
        return fut.then(_value)

    def _allreduce_nccl(self, buf: torch.Tensor, step: int, index: int) -> torch.futures.Future:
        self._check_bucket(buf, index)
        if self.error is not None:  # NCCL's ranks are out of step after a failure: never enqueue again
            raise ShimError(
                Status.ABORTED,
                f"ddp_agent hook {self.name}: an earlier failure stopped its NCCL all-reduces: {self.error}",
                "ddp_agent hook",
            )
        plan = self._plan()
        if not plan.ok:
            err = ShimError(
                Status.UNAVAILABLE, f"transport 'nccl' of {self.name}: {plan.why}", "ddp_agent hook"
            )
            self._failed(err)
            raise err
        if self.compression == "bf16" and buf.dtype in _COMPRESSIBLE and not plan.bfloat16:
            raise ValueError(
                f"ddp_agent: compression='bf16' needs NCCL 2.10 or later (ncclBfloat16) on every rank, "
                f"but this job has {plan.describe}; use compression='fp16'"
            )
        comm = self._open("nccl", buf.device)
        if buf.device != self._nccl_device:
            raise ValueError(
                f"ddp_agent: bucket {index} is on {buf.device}, but the NCCL communicator of {self.name} "
                f"was opened on {self._nccl_device}; one device per process"
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

    def _allreduce_cuda(
        self, comm: _shim.Comm, plan: _NcclPlan, buf: torch.Tensor, step: int, index: int
    ) -> torch.futures.Future:
        device = buf.device
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
        with torch.cuda.device(device):
            # The bucket was written on the caller's stream: wait for it there, not on the host.
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
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
        return fut

    def _enqueue(
        self, comm: _shim.Comm, tensor: torch.Tensor, op: int, stream: Optional[int], step: int, index: int,
        note: str = "",
    ) -> None:
        """Has the shim enqueue an NCCL all-reduce of tensor; blocks until enqueued (at most the timeout)."""
        dtype, per_element = _DTYPES[tensor.dtype]
        try:
            # The NCCL transport fails the call itself when the enqueue fails;
            # the work it returns is complete, so there is nothing to wait for.
            comm.allreduce(
                tensor.data_ptr(), tensor.numel() * per_element, dtype, op, stream=stream, step=step, bucket=index
            ).free()
        except ShimError as e:
            if note:
                e = ShimError(e.code, f"{e.message} ({note})", e.call)
            self._failed(e)
            raise e from None

    def _allreduce_fallback(self, buf: torch.Tensor) -> torch.futures.Future:
        if self.transport == "host":
            raise ValueError(
                f"ddp_agent: transport 'host' reduces CPU tensors only, but DDP handed the hook a "
                f"{buf.device} bucket; use transport='auto' (NCCL for CUDA buckets, else "
                f"torch.distributed) or keep the model on the CPU"
            )
        if self.transport == "nccl":
            raise ValueError(
                f"ddp_agent: transport 'nccl' reduces CUDA buckets (and CPU ones with an NCCL that works on "
                f"host memory), but DDP handed the hook a {buf.device} bucket; use transport='auto'"
            )
        if not self._warned_fallback:
            self._warned_fallback = True
            reason = self._fallback_reason or f"the shim does not reduce {buf.device.type} memory"
            log.warning(
                "ddp_agent: %s buckets are all-reduced with torch.distributed on the process group: %s",
                buf.device.type,
                reason,
            )
        n = self.world_size
        target = COMPRESSIONS.get(self.compression) if self.compression else None
        if target is not None and buf.dtype in _COMPRESSIBLE:
            compressed = buf.to(target).div_(n)
            work = dist.all_reduce(compressed, group=self.group, async_op=True)
            return work.get_future().then(functools.partial(_copy_back, buf))
        buf.div_(n)
        work = dist.all_reduce(buf, group=self.group, async_op=True)
        return work.get_future().then(_first)

    # -- NCCL: agreement ----------------------------------------------------

    def _plan(self) -> _NcclPlan:
        """Returns what all ranks agreed on about NCCL; agrees at the first call (blocks for the store)."""
        if self._nccl_plan is not None:
            return self._nccl_plan
        if self._nccl_plan_error is not None:
            raise ShimError(
                Status.UNAVAILABLE,
                f"the NCCL check of {self.name} failed earlier: {self._nccl_plan_error}",
                "ddp_agent hook",
            )
        try:
            self._nccl_plan = self._agree_on_nccl()
        except Exception as e:
            self._nccl_plan_error = e
            self._failed(e)
            raise
        return self._nccl_plan

    def _agree_on_nccl(self) -> _NcclPlan:
        """Exchanges every rank's ddpshim_nccl_info through torch's store and decides for all.

        All ranks reach their first NCCL bucket at the same bucket, so they
        decide together whether to use NCCL (a rank without it would
        otherwise hang the others' bootstrap) and which features all have.
        """
        try:
            mine = _shim.nccl_info()
        except ShimError as e:
            mine = {"found": False, "error": str(e)}
        features = mine.get("features") or {}
        summary = {
            "found": bool(mine.get("found")),
            "version": str(mine.get("version") or ""),
            "source": str(mine.get("source") or ""),
            "avg": bool(features.get("avg")),
            "bfloat16": bool(features.get("bfloat16")),
            "error": str(mine.get("error") or ""),
        }
        name = self._comm_name("nccl")
        values = self._exchange(name, "nccl", json.dumps(summary), f"NCCL check of {name}", "whether it has NCCL")
        everyone = [json.loads(v) for v in values]
        missing: Dict[str, List[int]] = {}  # reason -> ranks
        for r, s in enumerate(everyone):
            if not s["found"]:
                missing.setdefault(s["error"] or "NCCL not found", []).append(r)
        if missing:
            n = sum(len(ranks) for ranks in missing.values())
            reasons = "; ".join(f"{_ranks(ranks)}: {reason}" for reason, ranks in missing.items())
            why = f"NCCL cannot be loaded on {n} of {self.world_size} ranks ({reasons})"
            if summary["found"]:
                log.warning("ddp_agent: %s", why)
            return _NcclPlan(False, False, False, why, "")
        versions = sorted({s["version"] for s in everyone})
        describe = f"NCCL {', '.join(versions)} ({summary['source']} here)"
        plan = _NcclPlan(
            True, all(s["avg"] for s in everyone), all(s["bfloat16"] for s in everyone), "", describe
        )
        log.info("ddp_agent: %s: %s, avg %s, bfloat16 %s", name, describe, plan.avg, plan.bfloat16)
        return plan

    # -- communicators and waiter -------------------------------------------

    def _comm_name(self, transport: str) -> str:
        return self.name if transport == "host" else f"{self.name}-{transport}"

    def _open(self, transport: str, device: Optional[torch.device] = None) -> _shim.Comm:
        """Opens the host or NCCL communicator at its first bucket; blocks for the bootstrap."""
        with self._lock:
            if self._closed:
                raise ShimError(Status.CLOSED, f"ddp_agent hook {self.name} was closed", "ddp_agent hook")
            comm = self._comms.get(transport)
            if comm is not None:
                return comm
            err = self._open_errors.get(transport)
            if err is not None:
                raise ShimError(
                    Status.UNAVAILABLE,
                    f"communicator {self._comm_name(transport)} failed to open earlier: {err}",
                    "ddp_agent hook",
                )
            try:
                if device is not None and device.type == "cuda":
                    with torch.cuda.device(device):  # NCCL binds a communicator to the caller's device
                        comm = self._bootstrap(transport)
                else:
                    comm = self._bootstrap(transport)
            except BaseException as e:
                self._open_errors[transport] = e
                if isinstance(e, Exception):
                    self._failed(e)
                raise
            self._comms[transport] = comm
            if transport == "nccl":
                self._nccl_device = device
            log.info("ddp_agent: communicator %s open: %s", self._comm_name(transport), comm.info())
            return comm

    def _config(self, transport: str = "host") -> Dict[str, Any]:
        cfg: Dict[str, Any] = {
            "rank": self.rank,
            "world_size": self.world_size,
            "transport": transport,
            "timeout_ms": self.timeout_ms,
            "name": self._comm_name(transport),
        }
        if os.environ.get("MASTER_ADDR"):
            cfg["master_addr"] = os.environ["MASTER_ADDR"]
        if transport == "nccl" and os.environ.get(_shim.ENV_NCCL_LIB):
            # Passed on rather than left to the library: its Go runtime sees
            # only the environment the process started with, not a variable
            # the script added since.
            cfg["nccl_lib"] = os.environ[_shim.ENV_NCCL_LIB]
        sock = os.environ.get("DDP_AGENT_SOCKET")
        # The agent admits the job's world; a smaller group bootstraps
        # through torch's store instead, and so does every group when the
        # agent says its store does not span the job (static multi-node).
        if sock and self.world_size != int(os.environ.get("WORLD_SIZE") or -1):
            sock = None
        if os.environ.get("DDP_AGENT_BOOTSTRAP") == "external":
            sock = None
        if sock:
            cfg.update(
                bootstrap="agent",
                socket=sock,
                generation=int(os.environ.get("DDP_AGENT_GENERATION") or 0),
                local_rank=int(os.environ.get("LOCAL_RANK") or 0),
            )
            if os.environ.get("RANK"):
                # the agent admits a worker by its global rank; "rank" is the group's
                cfg["global_rank"] = int(os.environ["RANK"])
        else:
            cfg["bootstrap"] = "external"
        extra = os.environ.get(ENV_SHIM_CONFIG)
        if extra:
            try:
                extra_cfg = json.loads(extra)
            except ValueError as e:
                raise ValueError(f"${ENV_SHIM_CONFIG} is not JSON: {e}") from None
            if not isinstance(extra_cfg, dict) or any(k in extra_cfg for k in _OWN_KEYS):
                raise ValueError(f"${ENV_SHIM_CONFIG} must be a JSON object without {', '.join(_OWN_KEYS)}: {extra}")
            cfg.update(extra_cfg)
        return cfg

    def _bootstrap(self, transport: str) -> _shim.Comm:
        cfg = self._config(transport)
        comm = _shim.Comm.open(cfg)
        if cfg["bootstrap"] == "agent":
            return comm
        try:
            blob = comm.bootstrap_info()
            peers = self._exchange(cfg["name"], "rank", blob, f"bootstrap of {cfg['name']}", "its address")
            comm.connect(peers)
        except BaseException:
            try:
                comm.close()
            except ShimError as e:
                log.debug("ddp_agent: close after failed bootstrap: %s", e)
            raise
        return comm

    def _exchange(self, name: str, key: str, value: str, purpose: str, item: str) -> List[str]:
        """Publishes value in torch's store and returns every rank's, in rank order.

        Blocks until every rank of the group has published, or the timeout.
        """
        store = self._store(name)
        store.set(f"{key}_{self.rank}", value)
        deadline = time.monotonic() + self.timeout_ms / 1000
        for r in range(self.world_size):  # one at a time, to name a missing rank
            try:
                left = max(deadline - time.monotonic(), 0.001)
                store.wait([f"{key}_{r}"], datetime.timedelta(seconds=left))
            except RuntimeError as e:  # the wait's timeout, or the store gone
                raise ShimError(
                    Status.TIMEOUT,
                    f"{purpose}: rank {r} did not publish {item} within {self.timeout_ms / 1000:g} s ({e})",
                    "ddp_agent bootstrap",
                ) from None
        return [
            value if r == self.rank else bytes(store.get(f"{key}_{r}")).decode("utf-8")
            for r in range(self.world_size)
        ]

    def _store(self, name: str) -> Any:
        """Returns the namespace of communicator name in torch's default store (raises if there is none)."""
        # torchrun's store outlives restarts: the restart count keeps one
        # attempt's keys from being read by the next.
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return dist.PrefixStore(f"ddp_agent/{name}/restart_{restart}/", dist.distributed_c10d._get_default_store())

    def _wait_loop(self) -> None:
        """Completes the host Futures in issue order; runs on the waiter thread until close()."""
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, buf, tensor, fut = item
            err: Optional[BaseException] = None
            try:
                work.wait()
            except BaseException as e:  # ShimError, or anything unexpected: fail the Future, never hang it
                err = e
            try:
                work.free()
            except ShimError as e:
                log.warning("ddp_agent: free work %d: %s", work.handle, e)
            if err is None and tensor is not buf:
                try:
                    buf.copy_(tensor)  # decompress
                except BaseException as e:
                    err = e
            self._completed += 1
            if err is not None:
                self._failed(err)
                fut.set_exception(err)
            else:
                fut.set_result(buf)
            del item, work, buf, tensor, fut

    def _failed(self, err: BaseException) -> None:
        if self.error is None:
            self.error = err
            log.error("ddp_agent: %s failed on rank %d: %s", self.name, self.rank, err)

    # -- public -----------------------------------------------------------

    def info(self) -> Optional[Dict[str, Any]]:
        """Returns the communicator's description (ddpshim_comm_info), or None before the first bucket.

        The host communicator's when it is open, else the NCCL one's.
        """
        comm = self._comms.get("host") or self._comms.get("nccl")
        return comm.info() if comm is not None and not self._closed else None

    def close(self) -> None:
        """Waits for the buckets in flight, stops the waiter thread and closes the communicators.

        Idempotent. Call it on every rank, after the last backward pass and
        before ``torch.distributed.destroy_process_group()``.

        Blocks until every pending host all-reduce has finished (each
        bounded by the timeout; if the waiter is still stuck after that,
        aborts the communicator). The shim says goodbye to its peers, so a
        peer still receiving the last bucket is not cut off. The NCCL
        communicator is closed by the shim (finalized, bounded by the
        timeout). In a forked child it only marks the hook closed.

        At interpreter exit a hook not closed yet is closed without waiting
        for the other ranks, and all-reduces still in flight are aborted
        (NCCL's always, since what its streams still hold is unknown): a
        process leaving on an exception must not hang in its exit handlers.
        """
        self._close(at_exit=False)

    def _close(self, at_exit: bool) -> None:
        if _shim._forked_child:
            # A fork copies the hook but not its waiter thread, and the
            # library must not be entered (nor self._lock trusted) here.
            self._closed = True
            _live.discard(self)
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            waiter, comms = self._waiter, dict(self._comms)
        _live.discard(self)
        host = comms.get("host")
        if waiter is not None:
            in_flight = self._issued - self._completed
            if at_exit and in_flight and host is not None:
                log.warning("ddp_agent: %s: exiting with %d all-reduces in flight; aborting", self.name, in_flight)
                _abort(host, self.name, "the process is exiting")
            self._queue.put(None)
            waiter.join(self.timeout_ms / 1000 + 5)
            if waiter.is_alive() and host is not None:
                log.error("ddp_agent: waiter of %s still blocked at close; aborting the communicator", self.name)
                _abort(host, self.name, "ddp_agent hook closed with work in flight")
                waiter.join(5)
        nccl = comms.get("nccl")
        if nccl is not None and at_exit:
            _abort(nccl, self._comm_name("nccl"), "the process is exiting")
        for transport, comm in comms.items():
            try:
                comm.close()
            except ShimError as e:
                log.warning("ddp_agent: close %s: %s", self._comm_name(transport), e)

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return (
            f"Hook(name={self.name!r}, rank={self.rank}, world_size={self.world_size}, "
            f"transport={self.transport!r}, compression={self.compression!r}, step={self.step}, "
            f"closed={self._closed})"
        )


def _ranks(ranks: List[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _abort(comm: _shim.Comm, name: str, reason: str) -> None:
    try:
        comm.abort(reason)
    except ShimError as e:
        log.warning("ddp_agent: abort %s: %s", name, e)


def _comm_hook(state: Hook, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The function registered with DDP: all-reduces one bucket and returns its Future."""
    return state._run(bucket)


def _value(fut: torch.futures.Future) -> torch.Tensor:
    return fut.value()  # raises the ShimError given to set_exception


def _first(fut: torch.futures.Future) -> torch.Tensor:
    return fut.value()[0]


def _copy_back(buf: torch.Tensor, fut: torch.futures.Future) -> torch.Tensor:
    buf.copy_(fut.value()[0])  # decompress into the bucket (no second bucket-sized buffer)
    return buf


def _fmt(buckets: List[BucketInfo]) -> str:
    return "[" + ", ".join(f"#{b.index} {b.numel} {b.dtype}" for b in buckets) + "]"


def _timeout_ms(timeout: Union[None, float, int, datetime.timedelta]) -> int:
    if timeout is None:
        env = os.environ.get(ENV_TIMEOUT)
        if env:
            try:
                seconds = float(env)
            except ValueError:
                raise ValueError(f"${ENV_TIMEOUT}={env!r} is not a number of seconds") from None
            source = f"${ENV_TIMEOUT}"
        else:
            seconds, source = DEFAULT_TIMEOUT_S, "default"
    elif isinstance(timeout, datetime.timedelta):
        seconds, source = timeout.total_seconds(), "timeout"
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds, source = float(timeout), "timeout"
    else:
        raise TypeError(f"timeout must be a datetime.timedelta or seconds, not {type(timeout).__name__}")
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{source} must be a positive, finite number of seconds, got {seconds}")
    return max(1, round(seconds * 1000))


_registrations = 0
_registrations_lock = threading.Lock()
_live: Set[Hook] = set()


def _group_tag(group: Any) -> str:
    if group is None or group is dist.distributed_c10d._get_default_group():
        return ""
    ranks = ",".join(str(r) for r in dist.get_process_group_ranks(group))
    return "-g" + hashlib.sha1(ranks.encode()).hexdigest()[:10]


def register(
    ddp_model: torch.nn.parallel.DistributedDataParallel,
    *,
    transport: str = "auto",
    compression: Optional[str] = None,
    process_group: Any = None,
    timeout: Union[None, float, int, datetime.timedelta] = None,
) -> Hook:
    """Registers ddp_agent's gradient all-reduce as ddp_model's communication hook.

    Args:
        ddp_model: a ``DistributedDataParallel`` model with no hook registered yet.
        transport: "auto" (CPU buckets through the shim's host transport,
            CUDA buckets through its NCCL transport, or through
            torch.distributed where NCCL cannot be loaded), "host" (CPU
            buckets only; a CUDA bucket raises ValueError) or "nccl" (every
            bucket through NCCL; CPU buckets only with an NCCL that works on
            host memory, such as the test suite's fake).
        compression: None, "fp16" or "bf16": float32 and float64 buckets are
            cast to that type and divided by the world size before the sum,
            then copied back, as PyTorch's fp16_compress_hook and
            bf16_compress_hook do. "bf16" over NCCL needs NCCL 2.10.
        process_group: the group whose ranks take part; default: the model's
            process group (the default group unless DDP was given another).
            Rank and world size are taken from it.
        timeout: bound on the bootstrap and on each bucket's all-reduce (for
            NCCL: on its enqueue), a ``datetime.timedelta`` or seconds;
            default ``$DDP_AGENT_COLLECTIVE_TIMEOUT`` (seconds), else 600 s.
            A rank that dies makes the others' backward fail with the shim's
            error within about this long.

    Returns:
        The :class:`Hook`. Call ``hook.close()`` on every rank after training
        and before ``torch.distributed.destroy_process_group()``: it drains
        the waiter thread and closes the communicators. It does not wait for
        the other ranks: a peer still finishing the last bucket completes it.
        A hook left open is closed at interpreter exit (aborting work still
        in flight).

    Every rank must call register() for the same models in the same order:
    the communicators' names come from a per-process registration counter.
    Each communicator opens at its first bucket (inside the first backward);
    without ``$DDP_AGENT_SOCKET`` (plain torchrun) their addresses are
    exchanged through torch's default store. At the first NCCL bucket the
    ranks also agree, through that store, on whether all of them can load
    NCCL. ``$DDP_AGENT_SHIM_CONFIG`` (a JSON object) adds keys to the
    communicators' config, such as ``{"shm": false}``; ``$DDP_AGENT_NCCL_LIB``
    names an NCCL to load when the process has none and the loader finds no
    libnccl.so.2.

    Raises:
        ValueError: compression, transport or timeout not supported.
        TypeError: ddp_model has no ``register_comm_hook``.
        ShimError: the library cannot be loaded.
    """
    if compression is not None and compression not in COMPRESSIONS:
        raise ValueError(
            f"ddp_agent.register: compression={compression!r} is not supported; use None, "
            + " or ".join(repr(c) for c in COMPRESSIONS)
        )
    if transport not in TRANSPORTS:
        raise ValueError(
            f"ddp_agent.register: transport={transport!r} is not supported; use one of {', '.join(TRANSPORTS)}"
        )
    if not hasattr(ddp_model, "register_comm_hook"):
        raise TypeError(
            f"ddp_agent.register: expected a DistributedDataParallel model, got {type(ddp_model).__name__}"
        )
    if not dist.is_initialized():
        raise RuntimeError("ddp_agent.register: torch.distributed is not initialized (init_process_group)")
    timeout_ms = _timeout_ms(timeout)
    _shim.version()  # load the library now: a missing one fails here, not in the first backward
    _stacks.enable()  # under ddp-agent: a hang report can show where this rank is stuck
    group = process_group if process_group is not None else getattr(ddp_model, "process_group", None)
    if group is None:
        group = dist.distributed_c10d._get_default_group()

    global _registrations
    with _registrations_lock:
        n = _registrations
        _registrations += 1
    hook = Hook(
        group,
        transport=transport,
        compression=compression,
        timeout_ms=timeout_ms,
        name=f"ddp_agent-{n}{_group_tag(group)}",
    )
    ddp_model.register_comm_hook(hook, _comm_hook)
    _live.add(hook)
    return hook


def info(transport: str = "auto") -> Dict[str, Any]:
    """Returns what this process has to offer the hook, for logs and bug reports.

    A dict: ``version`` (this package's), ``shim`` (path, and version or
    error), ``nccl`` (:func:`ddp_agent._shim.nccl_info`: found, source,
    version, features, or error), ``torch`` (version, CUDA build, whether
    CUDA is available, device count, and PyTorch's own NCCL version when CUDA
    is), and ``transport``: for register(transport=...), what a ``cpu`` and
    a ``cuda`` bucket would go through ("host", "nccl", "torch.distributed",
    or None where the hook raises), with ``why`` when not the shim's. Only
    this process is looked at; the hook decides with every rank's answer.

    Loads the library and NCCL (blocks for dlopen); never raises for a
    missing library or NCCL (it says so instead); never initializes CUDA.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"ddp_agent.info: transport={transport!r}; use one of {', '.join(TRANSPORTS)}")
    from . import __version__

    out: Dict[str, Any] = {"version": __version__}
    shim: Dict[str, Any] = {"path": _shim.library_path()}
    nccl: Dict[str, Any]
    try:
        shim["version"] = _shim.version()
        nccl = _shim.nccl_info()
    except ShimError as e:
        shim.setdefault("error", str(e))
        nccl = {"found": False, "error": str(e)}
    out["shim"], out["nccl"] = shim, nccl

    cuda = torch.cuda.is_available()  # does not initialize CUDA
    tinfo: Dict[str, Any] = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": cuda,
        "devices": torch.cuda.device_count() if cuda else 0,
    }
    if cuda:
        try:
            v = torch.cuda.nccl.version()
            tinfo["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as e:  # a build without NCCL
            tinfo["nccl"] = f"none ({e})"
    out["torch"] = tinfo

    found = bool(nccl.get("found"))
    why = "" if found else f"NCCL cannot be loaded: {nccl.get('error') or 'not found'}"
    if transport == "host":
        route = {"cpu": "host", "cuda": None, "why": "transport 'host' refuses CUDA buckets"}
    elif transport == "nccl":
        route = {"cpu": "nccl", "cuda": "nccl", "why": "CPU buckets need an NCCL that works on host memory"}
        if not found:
            route = {"cpu": None, "cuda": None, "why": why}
    else:
        route = {"cpu": "host", "cuda": "nccl" if found else "torch.distributed"}
        if not found:
            route["why"] = why
    if "error" in shim:
        route = {"cpu": None, "cuda": None, "why": f"register() fails: {shim['error']}"}
    out["transport"] = dict(requested=transport, **route)
    return out


@atexit.register
def _close_all() -> None:
    for hook in list(_live):
        try:
            hook._close(at_exit=True)
        except Exception as e:  # at exit, report and go on
            log.warning("ddp_agent: close %s at exit: %s", hook.name, e)
