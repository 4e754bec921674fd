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
- A forward pre-hook on the model tells the agent when each forward
  starts (``ddpshim_mark``): with the buckets' arrival and end times, that
  splits a persistent straggler's lateness into input, compute and
  communication. It costs one call into the library per forward and never
  raises.
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
import hashlib
import logging
import threading
from typing import Any, Dict, List, Optional, Set

import torch
import torch.distributed as dist

from . import _options, _shim, _stacks
from ._agreement import NcclAgreement
from ._bootstrap import ENV_SHIM_CONFIG, Communicators
from ._buckets import BucketInfo, Schedule
from ._fallback import TorchFallback
from ._failure import FirstError
from ._host import HostTransport
from ._info import info
from ._nccl import NcclTransport
from ._options import COMPRESSIONS, DEFAULT_TIMEOUT_S, ENV_TIMEOUT, LAUNCHES, TRANSPORTS

__all__ = [
    "BucketInfo",
    "COMPRESSIONS",
    "DEFAULT_TIMEOUT_S",
    "ENV_SHIM_CONFIG",
    "ENV_TIMEOUT",
    "Hook",
    "LAUNCHES",
    "TRANSPORTS",
    "info",
    "register",
]

log = logging.getLogger("ddp_agent")


class Hook:
    """The state of one registration: the communicators, the waiter thread, the bucket schedule.

    Made by :func:`register`; DDP passes it to the hook function as its
    state. Call :meth:`close` after training and before
    ``torch.distributed.destroy_process_group()``; it also runs at
    interpreter exit. The work is done by its parts: the communicators
    (``_bootstrap``), the NCCL agreement (``_agreement``), the host and
    NCCL transports (``_host``, whose waiter thread is ``_waiter``, and
    ``_nccl``) and torch.distributed's fallback (``_fallback``); the hook
    routes each bucket to one of them.

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
        launch: str = "inline",
    ) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.transport = transport
        self.compression = compression
        self.launch = launch
        self.timeout_ms = timeout_ms
        self.name = name
        self._failure = FirstError(name, self.rank)
        self._schedule = Schedule(name, self.rank)
        self._comms = Communicators(name, self.rank, self.world_size, timeout_ms, self._failure, group)
        self._agreement = NcclAgreement(self._comms, self._failure)
        self._host = HostTransport(self._comms, self._failure, compression)
        self._nccl = NcclTransport(self._comms, self._agreement, self._failure, compression, launch)
        self._fallback = TorchFallback(group, transport, compression, self.world_size)
        self._forward_hook: Any = None  # the forward pre-hook's handle, removed at close

    @property
    def step(self) -> int:
        return self._schedule.step

    @property
    def schedule(self) -> Dict[int, List[BucketInfo]]:
        return self._schedule.by_step

    @property
    def error(self) -> Optional[BaseException]:
        return self._failure.error

    def _run(self, bucket: dist.GradBucket) -> torch.futures.Future:
        """Records the bucket and hands it to its transport (see the module's docstring for which)."""
        buf = bucket.buffer()
        index = bucket.index()
        last = bucket.is_last()
        step = self._schedule.record(index, buf, last)
        kind = buf.device.type
        if kind == "cpu":
            if self.transport == "nccl":
                return self._nccl.allreduce(buf, step, index, last)
            return self._host.allreduce(buf, step, index)
        if kind == "cuda" and self.transport != "host":
            if self.transport == "nccl":
                return self._nccl.allreduce(buf, step, index, last)
            plan = self._agreement.plan()
            if plan.ok:
                return self._nccl.allreduce(buf, step, index, last)
            self._fallback.reason = plan.why
        return self._fallback.allreduce(buf)

    def _mark_forward(self) -> None:
        """DDP's forward pre-hook: tells the agent this rank starts the forward of the next step.

        With the batch's arrival and the buckets' times, the agent splits a
        straggler's lateness into input (before forward), compute and
        communication. Before the first bucket no communicator is open yet
        (step 0 is warm-up anyway); a closed or failed hook marks nothing. A
        mark must never fail a training step: errors are dropped.
        """
        if self._comms.closed or _shim._forked_child:
            return
        comm = self._comms.get("host") or self._comms.get("nccl")
        if comm is None:
            return
        try:
            comm.mark(self._schedule.step)
        except _shim.ShimError:
            pass

    def info(self) -> Optional[Dict[str, Any]]:
        """Returns the communicator's description (ddpshim_comm_info), or None before the first bucket.

        The host communicator's when it is open, else the NCCL one's.
        """
        comm = self._comms.get("host") or self._comms.get("nccl")
        return comm.info() if comm is not None and not self._comms.closed else None

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
            # library must not be entered (nor the communicators' lock trusted) here.
            self._comms.closed = True
            _live.discard(self)
            return
        if not self._comms.mark_closed():
            return
        _live.discard(self)
        if self._forward_hook is not None:
            self._forward_hook.remove()
            self._forward_hook = None
        self._host.stop(at_exit)
        self._nccl.stop(at_exit)
        self._comms.close(at_exit)

    @property
    def closed(self) -> bool:
        return self._comms.closed

    def __repr__(self) -> str:
        return (
            f"Hook(name={self.name!r}, rank={self.rank}, world_size={self.world_size}, "
            f"transport={self.transport!r}, compression={self.compression!r}, launch={self.launch!r}, step={self.step}, "
            f"closed={self.closed})"
        )


def _comm_hook(state: Hook, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The function registered with DDP: all-reduces one bucket and returns its Future."""
    return state._run(bucket)


# How many hooks this process registered, by group (_group_tag): a hook's
# name is its group's tag and its number within the group, the same on
# every rank of the group however many hooks of other groups a rank has
# (a rank outside a subgroup registers none of its hooks).
_registrations: Dict[str, int] = {}
_registrations_lock = threading.Lock()


def _registered() -> Dict[str, int]:
    """A copy of the registrations so far, by group: for a warm spare to continue from (_continue_registrations)."""
    with _registrations_lock:
        return dict(_registrations)


def _continue_registrations(counts: Dict[str, int]) -> None:
    """Makes this process's next registrations follow counts (a peer's _registered): for a warm spare."""
    with _registrations_lock:
        for tag, n in counts.items():
            _registrations[tag] = max(_registrations.get(tag, 0), int(n))


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
    timeout: _options.Timeout = None,
    launch: Optional[str] = None,
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
            default ``$DDP_AGENT_COLLECTIVE_TIMEOUT`` (seconds), else the
            process group's own (``init_process_group``'s ``timeout``:
            torch's default is 30 min, 10 for NCCL on recent 2.x), as for
            DDP's own all-reduce, else 600 s (at most 30 days).
            A rank that dies makes the others' backward fail with the shim's
            error within about this long.
        launch: where NCCL buckets are issued: "inline" (in the hook call,
            on the autograd thread) or "thread" (a launcher thread per hook;
            the autograd thread only records an event and queues the bucket,
            and waits for the launcher at a step's last bucket); default
            ``$DDP_AGENT_HOOK_LAUNCH``, else "inline". "thread" is there to
            take the hook's host time off backward's critical path on a GPU
            (docs/comm-hook.md); it has not yet been timed on one.

    Returns:
        The :class:`Hook`. Call ``hook.close()`` on every rank after training
        and before ``torch.distributed.destroy_process_group()``: it drains
        the waiter thread and closes the communicators. It does not wait for
        the other ranks: a peer still finishing the last bucket completes it.
        A hook left open is closed at interpreter exit (aborting work still
        in flight).

    Every rank of a group must call register() for the group's models in
    the same order: the communicators' names come from a per-process count
    of the group's registrations (a rank outside a subgroup registers none
    of its models, and its other names do not move).
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
    _options.check(transport, compression)
    if not hasattr(ddp_model, "register_comm_hook"):
        raise TypeError(
            f"ddp_agent.register: expected a DistributedDataParallel model, got {type(ddp_model).__name__}"
        )
    if not dist.is_initialized():
        raise RuntimeError("ddp_agent.register: torch.distributed is not initialized (init_process_group)")
    group = process_group if process_group is not None else getattr(ddp_model, "process_group", None)
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    timeout_ms = _options.timeout_ms(timeout, _options.group_timeout(group))
    launch = _options.launch(launch)
    _shim.version()  # load the library now: a missing one fails here, not in the first backward
    _stacks.enable()  # under ddp-agent or its sidecar: a hang report can show where this rank is stuck

    tag = _group_tag(group)
    # Counted once registered: a refused registration takes no name, and
    # the ranks' names stay in step.
    with _registrations_lock:
        n = _registrations.get(tag, 0)
        hook = Hook(
            group,
            transport=transport,
            compression=compression,
            timeout_ms=timeout_ms,
            name=f"ddp_agent-{n}{tag}",
            launch=launch,
        )
        try:
            ddp_model.register_comm_hook(hook, _comm_hook)
        except RuntimeError as e:
            if "only be called once" not in str(e):
                raise
            # torch's words name neither the hook there nor what to do.
            raise RuntimeError(
                "ddp_agent.register: this DDP model has a comm hook already (register it once per model; "
                f"ddp_agent.lightning's DDPAgentStrategy registers it itself): {e}"
            ) from None
        _registrations[tag] = n + 1
    hook._forward_hook = ddp_model.register_forward_pre_hook(lambda _module, _inputs: hook._mark_forward())
    _live.add(hook)
    return hook


@atexit.register
def _close_all() -> None:
    for hook in list(_live):
        try:
            hook._close(at_exit=True)
        except Exception as e:  # at exit, report and go on
            log.warning("ddp_agent: close %s at exit: %s", hook.name, e)
