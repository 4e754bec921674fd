"""The hook's communicators: their names and configs, and opening them (through ddp-agent or torch's store).

A hook has up to two communicators, "host" and "nccl", each opened at its
first bucket. Under ``ddp-agent run`` the shim bootstraps through the
agent's control socket; otherwise (plain torchrun, a subgroup, a static
multi-node job) the ranks exchange their addresses through torch's default
store, and, when the node runs ``ddp-agent sidecar``, the job's
communicators also send it their events (``_sidecar``).
"""

import datetime
import json
import logging
import os
import secrets
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from . import _env
from . import _shim, _sidecar
from ._failure import FirstError
from ._shim import ShimError, Status

log = logging.getLogger("ddp_agent")

ENV_SHIM_CONFIG = _env.SHIM_CONFIG
"""Extra keys for the communicator's ddpshim_open config, as a JSON object.

For example ``{"shm": false}`` (TCP between ranks on one host too),
``{"log_level": "debug"}``, ``{"host": "10.0.0.5"}`` or ``{"nccl_lib":
"/opt/nccl/lib/libnccl.so.2"}``; see ddpshim.h. The keys go to the host and
the NCCL communicator alike.
"""

_OWN_KEYS = ("rank", "world_size", "name")

_RELAY_WAIT_MS = 30_000  # a rank's wait for rank 0's sidecar relay endpoint  # set from the process group and the registration only


class Communicators:
    """Opens, holds and closes one hook's communicators.

    Attributes:
        name: the host communicator's name, the same on every rank; the NCCL
            communicator's is this plus "-nccl".
        rank, world_size: this process's rank in the hook's group and its size.
        timeout_ms: bound on the bootstrap (and, in the config, on each collective).
        lock: held while a communicator opens (the bootstrap blocks under it),
            and by the host transport while it queues work, so that close()
            sees either all of it or none.
        closed: set once, under lock, by the hook's close.
        nccl_device: the device the NCCL communicator was opened on.
    """

    def __init__(
        self,
        name: str,
        rank: int,
        world_size: int,
        timeout_ms: int,
        failure: Optional[FirstError] = None,
        group: Any = None,
    ) -> None:
        self.name = name
        self.group = group
        self.rank = rank
        self.world_size = world_size
        self.timeout_ms = timeout_ms
        self.lock = threading.Lock()
        self.closed = False
        self.nccl_device: Optional[torch.device] = None
        self._failure = failure if failure is not None else FirstError(name, rank)
        self._opened: Dict[str, _shim.Comm] = {}
        self._open_errors: Dict[str, BaseException] = {}
        self._attempt: Optional[str] = None

    def name_of(self, transport: str) -> str:
        """Returns the name of the transport's communicator."""
        return self.name if transport == "host" else f"{self.name}-{transport}"

    def get(self, transport: str) -> Optional[_shim.Comm]:
        """Returns the transport's communicator if it is open (without locking: it is set once)."""
        return self._opened.get(transport)

    def check_open(self) -> None:
        """Raises ShimError CLOSED once the hook is closed."""
        if self.closed:  # the communicators (and the waiter) are gone
            raise ShimError(Status.CLOSED, f"ddp_agent hook {self.name} was closed", "ddp_agent hook")

    def open(self, transport: str, device: Optional[torch.device] = None,
             first: Optional[Tuple[int, int]] = None) -> _shim.Comm:
        """Opens the host or NCCL communicator at its first bucket; blocks for the bootstrap.

        first is that bucket's (step, index): while the bootstrap waits for
        the other ranks, the agent hears that this rank has arrived at it,
        and takes a rank that never comes for a hang, as at any later step.
        A communicator that failed to open fails every later call at once.
        """
        with self.lock:
            self.check_open()
            comm = self._opened.get(transport)
            if comm is not None:
                return comm
            err = self._open_errors.get(transport)
            if err is not None:
                raise ShimError(
                    Status.UNAVAILABLE,
                    f"communicator {self.name_of(transport)} failed to open earlier: {err}",
                    "ddp_agent hook",
                )
            try:
                if device is not None and device.type == "cuda":
                    with torch.cuda.device(device):  # NCCL binds a communicator to the caller's device
                        comm = self._bootstrap(transport, device, first)
                else:
                    comm = self._bootstrap(transport, None, first)
            except BaseException as e:
                self._open_errors[transport] = e
                if isinstance(e, Exception):
                    self._failure.record(e)
                raise
            self._opened[transport] = comm
            if transport == "nccl":
                self.nccl_device = device
            log.info("ddp_agent: communicator %s open: %s", self.name_of(transport), comm.info())
            return comm

    def config(self, transport: str = "host", device: Optional[torch.device] = None) -> Dict[str, Any]:
        """Returns the ddpshim_open config of the transport's communicator, from the environment."""
        cfg: Dict[str, Any] = {
            "rank": self.rank,
            "world_size": self.world_size,
            "transport": transport,
            "timeout_ms": self.timeout_ms,
            "name": self.name_of(transport),
        }
        if os.environ.get("MASTER_ADDR"):
            cfg["master_addr"] = os.environ["MASTER_ADDR"]
        if transport == "nccl" and os.environ.get(_shim.ENV_NCCL_LIB):
            # Passed on rather than left to the library: its Go runtime sees
            # only the environment the process started with, not a variable
            # the script added since.
            cfg["nccl_lib"] = os.environ[_shim.ENV_NCCL_LIB]
        # ddp-agent run sets both; $DDP_AGENT_SOCKET alone names a sidecar's socket.
        sock = os.environ.get(_env.SOCKET) if _sidecar.under_run() else None
        # The agent admits the job's world; a smaller group bootstraps
        # through torch's store instead, and so does every group when the
        # agent says its store does not span the job (static multi-node).
        if sock and self.world_size != int(os.environ.get("WORLD_SIZE") or -1):
            sock = None
        if os.environ.get(_env.BOOTSTRAP) == "external":
            sock = None
        if sock:
            cfg.update(
                bootstrap="agent",
                socket=sock,
                generation=int(os.environ.get(_env.GENERATION) or 0),
                local_rank=int(os.environ.get("LOCAL_RANK") or 0),
            )
            if os.environ.get("RANK"):
                # the agent admits a worker by its global rank; "rank" is the group's
                cfg["global_rank"] = int(os.environ["RANK"])
        else:
            cfg["bootstrap"] = "external"
            self._add_sidecar(cfg, device)
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

    def _add_sidecar(self, cfg: Dict[str, Any], device: Optional[torch.device]) -> None:
        """Points the communicator at the node's sidecar, when there is one (the job's world only, as with the agent)."""
        if _sidecar.world_size() == -1:
            _sidecar.say_unlaunched()
            return
        if self.world_size != _sidecar.world_size():
            return
        sock = _sidecar.find()
        if not sock:
            return
        cfg.update(
            sidecar=sock,
            generation=_sidecar.generation(),
            local_rank=_sidecar.local_rank(),
            global_rank=int(_sidecar.rank() or self.rank),
            sidecar_job=_sidecar.job_info(sock, self.rank, self.world_size, gpu=_gpu_uuid(device)),
        )

    def _relay(self, cfg: Dict[str, Any], comm: Optional[_shim.Comm]) -> None:
        """Passes the leading sidecar's relay endpoint from rank 0 to the other nodes' sidecars.

        Rank 0 always publishes (its sidecar's endpoint, or "" without one),
        so that no rank waits for it in vain; the others read it before they
        open, when a sidecar of theirs needs it (a multi-node job).
        """
        if cfg["bootstrap"] != "external" or self.world_size != _sidecar.world_size():
            return
        key = f"sidecar_relay_{cfg['transport']}"
        store = self.store(self.name)
        if self.rank == 0:  # after its open, or its failure (comm None): never leave the others waiting
            relay = str(comm.info().get("sidecar_relay") or "") if comm is not None and cfg.get("sidecar") else ""
            store.set(key, relay)
            return
        job = cfg.get("sidecar_job")
        if not job or job["local_world_size"] == job["world_size"]:
            return
        try:
            # Bounded apart from the timeout: rank 0 publishes at once after
            # its open, and the exchange that follows names a missing rank.
            store.wait([key], datetime.timedelta(milliseconds=min(self.timeout_ms, _RELAY_WAIT_MS)))
            job["relay"] = bytes(store.get(key)).decode("utf-8")
        except RuntimeError as e:
            log.warning("ddp_agent: no relay endpoint from rank 0 for the sidecar: %s", e)

    def _bootstrap(self, transport: str, device: Optional[torch.device] = None,
                   first: Optional[Tuple[int, int]] = None) -> _shim.Comm:
        self.agree_attempt()  # first: before anything that one rank alone could fail
        cfg = self.config(transport, device)
        if first is not None:
            cfg["first_step"], cfg["first_bucket"] = first
        if self.rank != 0:
            self._relay(cfg, None)
        try:
            comm = _shim.Comm.open(cfg)
        except BaseException:
            if self.rank == 0:
                try:
                    self._relay(cfg, None)
                except Exception as e:  # the open's error is the one to raise
                    log.debug("ddp_agent: relay key after a failed open: %s", e)
            raise
        if cfg["bootstrap"] == "agent":
            return comm
        try:
            if self.rank == 0:
                self._relay(cfg, comm)
            blob = comm.bootstrap_info()
            peers = self.exchange(cfg["name"], "rank", blob, f"bootstrap of {cfg['name']}", "its address")
            comm.connect(peers)
        except BaseException:
            try:
                comm.close()
            except ShimError as e:
                log.debug("ddp_agent: close after failed bootstrap: %s", e)
            raise
        return comm

    def exchange(self, name: str, key: str, value: str, purpose: str, item: str) -> List[str]:
        """Publishes value in torch's store and returns every rank's, in rank order.

        Blocks until every rank of the group has published, or the timeout
        (then raises ShimError TIMEOUT naming the first missing rank).
        """
        store = self.store(name)
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

    def agree_attempt(self) -> None:
        """Agrees with the group's other ranks on this attempt's token, once, where the store can outlive the attempt.

        That is where a launcher's agent serves the store
        (TORCHELASTIC_USE_AGENT_STORE=True) and it is not ddp-agent, whose
        generations each have keys of their own. The callers, the first
        communicator's open and the NCCL check, call it before anything
        else: it is a collective over the hook's group, which every rank
        must reach whatever fails on it afterwards.
        """
        if self._attempt is not None:
            return
        self._attempt = attempt_token(self.group, self.rank, self.timeout_ms) if store_outlives_attempt() else ""

    def store(self, name: str) -> Any:
        """The namespace of communicator name, for this attempt of the job, in torch's default store."""
        self.agree_attempt()
        return _store(f"{name}/{self._attempt}" if self._attempt else name)

    def abort(self, transport: str, reason: str) -> None:
        """Aborts the transport's communicator, if open; logs (never raises) a failure."""
        comm = self._opened.get(transport)
        if comm is None:
            return
        try:
            comm.abort(reason)
        except ShimError as e:
            log.warning("ddp_agent: abort %s: %s", self.name_of(transport), e)

    def mark_closed(self) -> bool:
        """Marks the hook closed; returns False if it already was. No communicator opens after it."""
        with self.lock:
            if self.closed:
                return False
            self.closed = True
            return True

    def close(self, at_exit: bool) -> None:
        """Closes every communicator (after mark_closed); at exit, aborts NCCL's first.

        The shim says goodbye to the host transport's peers and finalizes
        NCCL's communicator, each bounded by the timeout.
        """
        if at_exit:
            self.abort("nccl", "the process is exiting")
        for transport, comm in dict(self._opened).items():
            try:
                comm.close()
            except ShimError as e:
                log.warning("ddp_agent: close %s: %s", self.name_of(transport), e)


def _gpu_uuid(device: Optional[torch.device]) -> str:
    """NVML's name of the device's GPU ("GPU-<uuid>"), for the sidecar's health watch; "" on a CPU."""
    if device is None or device.type != "cuda":
        return ""
    try:
        return "GPU-" + str(torch.cuda.get_device_properties(device).uuid)
    except (AttributeError, RuntimeError):  # torch 1.13 has no uuid
        return ""


def _store(name: str) -> Any:
    """Returns the namespace name in torch's default store (raises if there is none)."""
    return dist.PrefixStore(f"ddp_agent/{name}/", dist.distributed_c10d._get_default_store())


def store_outlives_attempt() -> bool:
    """Whether torch's default store may hold an earlier attempt's keys: a launcher's agent serves it
    (TORCHELASTIC_USE_AGENT_STORE=True), and that launcher is not ddp-agent, whose generations each have
    keys of their own."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and not _sidecar.under_run()


def attempt_token(group: Any, rank: int, timeout_ms: int, device: Optional[torch.device] = None,
                  awaited: str = "of the hook's group reached its first bucket") -> str:
    """A token that the group's ranks share and no earlier attempt of the job had.

    torch's default store can outlive an attempt: torchrun 2.5 and later
    hand the workers their agent's TCPStore, one server for every restart
    (dynamic_rendezvous keeps its _shared_tcp_store_server; pytorch#135712).
    Keys named alike would then be read from the attempt before: the peers'
    old addresses, on which the bootstrap waited out its whole timeout.
    (ddp-agent's own store under --spares outlives attempts too, but its
    workers bootstrap through the agent, and their hooks' names differ
    from one generation to the next: store_outlives_attempt says no.)
    TORCHELASTIC_RESTART_COUNT cannot name the attempt: after a rescale it
    differs between nodes (a node whose worker failed counts a restart, the
    others do not), and ranks named apart waited for each other the same.

    So the group's rank 0 draws a random number (not from torch's
    generator, which the script's results depend on) and broadcasts it over
    the group: on the CPU where the group has gloo, else for NCCL on device
    when it is a CUDA device, or the current one, which is the bucket's when
    called from the hook. Another backend (no gloo, no NCCL) gets no token,
    and the keys no attempt's name, as before. The wait is bounded by
    timeout_ms, not the group's timeout (30 minutes on gloo), by polling the
    work: on NCCL a wait() would only order the streams, and item() could
    block for good. awaited says, in the timeout's message, where every rank
    calls this from.
    """
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    backend = str(dist.get_backend(group)).lower()
    if "gloo" in backend:
        device = torch.device("cpu")
    elif "nccl" in backend:
        if device is None or device.type != "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
    else:
        log.debug("ddp_agent: process group backend %s: the store's keys are not named by the attempt", backend)
        return ""
    value = secrets.randbits(62) if rank == 0 else 0
    t = torch.tensor([value], dtype=torch.int64, device=device)
    src = 0
    if group is not dist.distributed_c10d._get_default_group():
        src = dist.get_process_group_ranks(group)[0]  # the group's rank 0, as a global rank
    work = dist.broadcast(t, src=src, group=group, async_op=True)
    deadline = time.monotonic() + timeout_ms / 1000
    while not work.is_completed():
        if time.monotonic() > deadline:
            raise ShimError(
                Status.TIMEOUT,
                f"not every rank {awaited} within {timeout_ms / 1000:g} s "
                "(agreeing on the attempt that names the store's keys)",
                "ddp_agent bootstrap",
            )
        time.sleep(0.001)
    work.wait()  # raises the collective's own error, if it failed
    return format(int(t.item()), "x")
