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
- CPU buckets: the hook starts the shim's non-blocking all-reduce and
  returns; one waiter thread per hook blocks in the shim (GIL released) on
  each bucket in turn and completes its Future, so communication overlaps
  the rest of the backward pass.
- Buckets change: the first iteration's buckets are rebuilt after it (after
  two with ``static_graph``), so nothing here assumes fixed sizes. The
  schedule is logged and kept on :attr:`Hook.schedule`.
- ``DDP.join()`` calls the hook outside backward, for zero-filled shadow
  buckets; nothing here depends on being called from backward.
- CUDA buckets: the NCCL transport is not there yet. transport="auto" falls
  back to an asynchronous ``torch.distributed.all_reduce`` on the process
  group (what DDP's default hook does) and logs one warning;
  transport="host" refuses them.
"""

import atexit
import datetime
import hashlib
import json
import logging
import os
import queue
import threading
import time
from typing import Any, Dict, List, NamedTuple, Optional, Set, Union

import torch
import torch.distributed as dist

from . import _shim
from ._shim import ShimError, Status

__all__ = ["BucketInfo", "Hook", "register", "ENV_SHIM_CONFIG", "ENV_TIMEOUT", "DEFAULT_TIMEOUT_S"]

log = logging.getLogger("ddp_agent")

ENV_TIMEOUT = "DDP_AGENT_COLLECTIVE_TIMEOUT"
"""Default collective timeout in seconds, when register() gets no timeout."""

DEFAULT_TIMEOUT_S = 600.0
"""Collective timeout without timeout= and without $DDP_AGENT_COLLECTIVE_TIMEOUT."""

ENV_SHIM_CONFIG = "DDP_AGENT_SHIM_CONFIG"
"""Extra keys for the communicator's ddpshim_open config, as a JSON object.

For example ``{"shm": false}`` (TCP between ranks on one host too),
``{"log_level": "debug"}`` or ``{"host": "10.0.0.5"}``; see ddpshim.h.
"""

_OWN_KEYS = ("rank", "world_size", "name")  # set from the process group and the registration only

TRANSPORTS = ("auto", "host")

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


class Hook:
    """The state of one registration: the communicator, the waiter thread, the bucket schedule.

    Made by :func:`register`; DDP passes it to the hook function as its
    state. Call :meth:`close` after training and before
    ``torch.distributed.destroy_process_group()``; it also runs at
    interpreter exit.

    Attributes:
        rank, world_size: this process's rank in ``group`` and the group's size.
        group: the process group whose ranks take part.
        transport: "auto" or "host".
        timeout_ms: bound on the bootstrap and on each collective.
        name: the communicator's name; the same on every rank.
        step: number of iterations whose last bucket has been handed to the hook.
        schedule: step -> list of :class:`BucketInfo`, for step 0 and for every
            step whose buckets differ from the step before (a step missing
            from it had the buckets of the closest earlier step present).
        error: the first collective failure, or None.
    """

    def __init__(
        self,
        group: Any,
        *,
        transport: str,
        timeout_ms: int,
        name: str,
    ) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.transport = transport
        self.timeout_ms = timeout_ms
        self.name = name
        self.step = 0
        self.schedule: Dict[int, List[BucketInfo]] = {}
        self.error: Optional[BaseException] = None

        self._lock = threading.Lock()
        self._closed = False
        self._comm: Optional[_shim.Comm] = None
        self._open_error: Optional[BaseException] = None
        self._queue: "queue.SimpleQueue[Optional[tuple]]" = queue.SimpleQueue()
        self._waiter: Optional[threading.Thread] = None
        # All-reduces queued and completed; one writer each (the hook's
        # thread, the waiter), so their difference is what is in flight.
        self._issued = 0
        self._completed = 0
        self._current: List[BucketInfo] = []
        self._last: Optional[List[BucketInfo]] = None
        self._warned_fallback = False

    # -- the hook --------------------------------------------------------

    def _run(self, bucket: dist.GradBucket) -> torch.futures.Future:
        buf = bucket.buffer()
        index, is_last = bucket.index(), bucket.is_last()
        step = self.step
        self._record(step, index, buf, is_last)
        if buf.device.type == "cpu":
            fut = self._allreduce_host(buf, step, index)
        else:
            fut = self._allreduce_fallback(buf)
        return fut

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

    def _allreduce_host(self, buf: torch.Tensor, step: int, index: int) -> torch.futures.Future:
        if self._closed:  # the waiter is gone: a Future queued now would never complete
            raise ShimError(Status.CLOSED, f"ddp_agent hook {self.name} was closed", "ddp_agent hook")
        if buf.layout != torch.strided or not buf.is_contiguous():
            raise ValueError(
                f"ddp_agent: bucket {index} buffer must be a dense contiguous tensor, got layout {buf.layout}"
                + (f" with strides {buf.stride()}" if buf.layout == torch.strided else "")
            )
        try:
            dtype, per_element = _DTYPES[buf.dtype]
        except KeyError:
            raise ValueError(
                f"ddp_agent: bucket {index} has dtype {buf.dtype}, which the shim does not reduce "
                f"(supported: {', '.join(str(d) for d in _DTYPES)})"
            ) from None
        comm = self._comm or self._open()
        if buf.dtype in _DIVIDE_FIRST:
            buf.div_(self.world_size)
            op = _shim.Op.SUM
        else:
            op = _shim.Op.AVG
        try:
            work = comm.allreduce(buf.data_ptr(), buf.numel() * per_element, dtype, op, step=step, bucket=index)
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
            self._queue.put((work, buf, fut))  # buf stays referenced until the work is done
        # A Future completed by set_exception holds the exception as its
        # value; DDP's reducer would fail to read it as a tensor, with a
        # message that hides ours. then() turns it into a real error whose
        # message carries the ShimError's.
        return fut.then(_value)

    def _allreduce_fallback(self, buf: torch.Tensor) -> torch.futures.Future:
        if self.transport == "host":
            raise ValueError(
                f"ddp_agent: transport 'host' reduces CPU tensors only, but DDP handed the hook a "
                f"{buf.device} bucket; use transport='auto' (falls back to torch.distributed for "
                f"GPU buckets until the NCCL transport lands) or keep the model on the CPU"
            )
        if not self._warned_fallback:
            self._warned_fallback = True
            log.warning(
                "ddp_agent: %s buckets are all-reduced with torch.distributed on the process group: "
                "the shim's NCCL transport is not available yet",
                buf.device.type,
            )
        buf.div_(self.world_size)
        work = dist.all_reduce(buf, group=self.group, async_op=True)
        return work.get_future().then(_first)

    # -- communicator and waiter ------------------------------------------

    def _open(self) -> _shim.Comm:
        """Opens the communicator at the first CPU bucket; blocks for the bootstrap."""
        with self._lock:
            if self._closed:
                raise ShimError(Status.CLOSED, f"ddp_agent hook {self.name} was closed", "ddp_agent hook")
            if self._comm is not None:
                return self._comm
            if self._open_error is not None:
                raise ShimError(
                    Status.UNAVAILABLE, f"communicator {self.name} failed to open earlier: {self._open_error}"
                )
            try:
                self._comm = self._bootstrap()
            except BaseException as e:
                self._open_error = e
                raise
            log.info("ddp_agent: communicator %s open: %s", self.name, self._comm.info())
            return self._comm

    def _config(self) -> Dict[str, Any]:
        cfg: Dict[str, Any] = {
            "rank": self.rank,
            "world_size": self.world_size,
            "transport": "host",
            "timeout_ms": self.timeout_ms,
            "name": self.name,
        }
        if os.environ.get("MASTER_ADDR"):
            cfg["master_addr"] = os.environ["MASTER_ADDR"]
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

    def _bootstrap(self) -> _shim.Comm:
        cfg = self._config()
        comm = _shim.Comm.open(cfg)
        if cfg["bootstrap"] == "agent":
            return comm
        try:
            store = self._store()
            blob = comm.bootstrap_info()
            store.set(f"rank_{self.rank}", blob)
            deadline = time.monotonic() + self.timeout_ms / 1000
            for r in range(self.world_size):  # one at a time, to name a missing rank
                try:
                    left = max(deadline - time.monotonic(), 0.001)
                    store.wait([f"rank_{r}"], datetime.timedelta(seconds=left))
                except RuntimeError as e:  # the wait's timeout, or the store gone
                    raise ShimError(
                        Status.TIMEOUT,
                        f"bootstrap of {self.name}: rank {r} did not publish its address within "
                        f"{self.timeout_ms / 1000:g} s ({e})",
                        "ddp_agent bootstrap",
                    ) from None
            peers = [
                blob if r == self.rank else bytes(store.get(f"rank_{r}")).decode("utf-8")
                for r in range(self.world_size)
            ]
            comm.connect(peers)
        except BaseException:
            try:
                comm.close()
            except ShimError as e:
                log.debug("ddp_agent: close after failed bootstrap: %s", e)
            raise
        return comm

    def _store(self) -> Any:
        """Returns this registration's namespace of torch's default store (raises if there is none)."""
        # torchrun's store outlives restarts: the restart count keeps one
        # attempt's keys from being read by the next.
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return dist.PrefixStore(f"ddp_agent/{self.name}/restart_{restart}/", dist.distributed_c10d._get_default_store())

    def _wait_loop(self) -> None:
        """Completes the Futures in issue order; runs on the waiter thread until close()."""
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, buf, fut = item
            err: Optional[BaseException] = None
            try:
                work.wait()
            except BaseException as e:  # ShimError, or anything unexpected: fail the Future, never hang it
                err = e
            try:
                work.free()
            except ShimError as e:
                log.warning("ddp_agent: free work %d: %s", work.handle, e)
            self._completed += 1
            if err is not None:
                self._failed(err)
                fut.set_exception(err)
            else:
                fut.set_result(buf)
            del item, work, buf, fut

    def _failed(self, err: BaseException) -> None:
        if self.error is None:
            self.error = err
            log.error("ddp_agent: all-reduce failed on rank %d: %s", self.rank, err)

    # -- public -----------------------------------------------------------

    def info(self) -> Optional[Dict[str, Any]]:
        """Returns the communicator's description (ddpshim_comm_info), or None before the first bucket."""
        comm = self._comm
        return comm.info() if comm is not None and not self._closed else None

    def close(self) -> None:
        """Waits for the buckets in flight, stops the waiter thread and closes the communicator.

        Idempotent. Call it on every rank, after the last backward pass and
        before ``torch.distributed.destroy_process_group()``.

        Blocks until every pending all-reduce has finished (each bounded by
        the timeout; if the waiter is still stuck after that, aborts the
        communicator), then until every rank has got that far (through
        torch's default store, up to the timeout; skipped after a failed
        collective), so that closing cannot cut off a peer still receiving
        the last bucket. In a forked child it only marks the hook closed.

        At interpreter exit a hook not closed yet is closed without waiting
        for the other ranks, and all-reduces still in flight are aborted: a
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
            waiter, comm = self._waiter, self._comm
        _live.discard(self)
        if waiter is not None:
            in_flight = self._issued - self._completed
            if at_exit and in_flight and comm is not None:
                log.warning("ddp_agent: %s: exiting with %d all-reduces in flight; aborting", self.name, in_flight)
                try:
                    comm.abort("the process is exiting")
                except ShimError as e:
                    log.warning("ddp_agent: abort %s: %s", self.name, e)
            self._queue.put(None)
            waiter.join(self.timeout_ms / 1000 + 5)
            if waiter.is_alive() and comm is not None:
                log.error("ddp_agent: waiter of %s still blocked at close; aborting the communicator", self.name)
                try:
                    comm.abort("ddp_agent hook closed with work in flight")
                except ShimError as e:
                    log.warning("ddp_agent: abort %s: %s", self.name, e)
                waiter.join(5)
        if comm is not None:
            # No barrier needed: the shim says goodbye to its peers, so one
            # still finishing the last all-reduce is not cut off.
            try:
                comm.close()
            except ShimError as e:
                log.warning("ddp_agent: close %s: %s", self.name, e)

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return (
            f"Hook(name={self.name!r}, rank={self.rank}, world_size={self.world_size}, "
            f"transport={self.transport!r}, step={self.step}, closed={self._closed})"
        )


def _comm_hook(state: Hook, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The function registered with DDP: all-reduces one bucket and returns its Future."""
    return state._run(bucket)


def _value(fut: torch.futures.Future) -> torch.Tensor:
    return fut.value()  # raises the ShimError given to set_exception


def _first(fut: torch.futures.Future) -> torch.Tensor:
    return fut.value()[0]


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
        transport: "auto" (CPU buckets through the shim's host transport; GPU
            buckets through torch.distributed until the NCCL transport lands)
            or "host" (CPU buckets only; a GPU bucket raises ValueError).
        compression: must be None; gradient compression is not supported yet.
        process_group: the group whose ranks take part; default: the model's
            process group (the default group unless DDP was given another).
            Rank and world size are taken from it.
        timeout: bound on the bootstrap and on each bucket's all-reduce, a
            ``datetime.timedelta`` or seconds; default ``$DDP_AGENT_COLLECTIVE_TIMEOUT``
            (seconds), else 600 s. A rank that dies makes the others' backward
            fail with the shim's error within about this long.

    Returns:
        The :class:`Hook`. Call ``hook.close()`` on every rank after training
        and before ``torch.distributed.destroy_process_group()``: it drains
        the waiter thread and closes the communicator. It does not wait for
        the other ranks: a peer still finishing the last bucket completes it.
        A hook left open is closed at interpreter exit (aborting work still
        in flight).

    Every rank must call register() for the same models in the same order:
    the communicator's name comes from a per-process registration counter.
    The communicator opens at the first bucket (inside the first backward);
    without ``$DDP_AGENT_SOCKET`` (plain torchrun) its addresses are exchanged
    through torch's default store. ``$DDP_AGENT_SHIM_CONFIG`` (a JSON object)
    adds keys to its config, such as ``{"shm": false}``.

    Raises:
        ValueError: compression, transport or timeout not supported.
        TypeError: ddp_model has no ``register_comm_hook``.
        ShimError: the library cannot be loaded.
    """
    if compression is not None:
        raise ValueError(f"ddp_agent.register: compression={compression!r} is not supported yet; pass None")
    if transport not in TRANSPORTS:
        raise ValueError(
            f"ddp_agent.register: transport={transport!r} is not supported; use one of {', '.join(TRANSPORTS)} "
            "(the NCCL transport is not available yet)"
        )
    if not hasattr(ddp_model, "register_comm_hook"):
        raise TypeError(
            f"ddp_agent.register: expected a DistributedDataParallel model, got {type(ddp_model).__name__}"
        )
    if not dist.is_initialized():
        raise RuntimeError("ddp_agent.register: torch.distributed is not initialized (init_process_group)")
    timeout_ms = _timeout_ms(timeout)
    _shim.version()  # load the library now: a missing one fails here, not in the first backward
    group = process_group if process_group is not None else getattr(ddp_model, "process_group", None)
    if group is None:
        group = dist.distributed_c10d._get_default_group()

    global _registrations
    with _registrations_lock:
        n = _registrations
        _registrations += 1
    hook = Hook(group, transport=transport, timeout_ms=timeout_ms, name=f"ddp_agent-{n}{_group_tag(group)}")
    ddp_model.register_comm_hook(hook, _comm_hook)
    _live.add(hook)
    return hook


@atexit.register
def _close_all() -> None:
    for hook in list(_live):
        try:
            hook._close(at_exit=True)
        except Exception as e:  # at exit, report and go on
            log.warning("ddp_agent: close %s at exit: %s", hook.name, e)
