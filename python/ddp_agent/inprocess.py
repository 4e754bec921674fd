"""Recovery in process: a step that raises on any rank is retried without restarting anyone.

    def wrap(model):                                  # at the start and after each re-formation
        ddp = DistributedDataParallel(model)
        return ddp, ddp_agent.register(ddp)

    loop = ddp_agent.InProcess(model, optimizer, wrap)
    for step in loop.steps(first, last + 1):          # the step to run; after a fault, that step again
        with loop.step(step) as ddp:
            x, y = batch(step, rank)                  # the data of a step depends on the step only
            loss_fn(ddp(x), y).backward()
            optimizer.step()
    loop.close()                                      # before dist.destroy_process_group()

An exception inside ``with loop.step(...)`` on one rank (its own error, or
the shim's error on a rank whose peer failed) starts a re-formation on
every rank, in the processes they have:

1. **abort**: the rank closes its hook's communicators without waiting, so
   a peer blocked in the gradient all-reduce fails at once (and a peer
   still computing fails at its first bucket, or in the broadcast of a
   model's CPU buffers before its forward, which goes through that
   communicator too: ``_buffers``); a rank whose step failed puts its
   buffers back as the step found them;
2. **rendezvous**: each rank writes the last step it completed to torch's
   store and waits for every rank's, bounded by ``timeout``;
3. **process group**: torch's default process group is destroyed and made
   again, on the same store under the new generation's prefix;
4. **state**: ``wrap`` makes the DDP model and the hook again, and the
   lowest rank that completed the most steps gives the model's and the
   optimizer's state to the others through the hook's communicator
   (``_state``; a rank that failed in its optimizer step holds half-updated
   weights: it takes the healthy peer's);
5. the loop yields the first step not completed everywhere, each rank's
   torch generators back as that step found them (``_random``): at most the
   one step in progress is lost, and with data that is a function of the
   step, the result is the same as an uninterrupted run's.

What it cannot do in process, it leaves to the process restart that
``ddp-agent run`` (or torchrun) does today: after ``max_reforms``
re-formations, when a rank does not reach the rendezvous within
``timeout`` (it died, or is stuck in a collective outside the shim that
nothing can abort: DDP's buffer broadcast of CUDA buffers, its bucket
rebuild after a model's first step, a gloo all-reduce of the loss), or on ``BaseException`` that is not an
``Exception`` (KeyboardInterrupt, SystemExit), the error is raised and the
process exits as it would without this loop.

A node that leaves the job (its agent lost or stopped) or joins it keeps
the others' processes too under ``ddp-agent run --spares N``: their agents
keep them through the rendezvous (the world file marked "moving" holds
their re-formation meanwhile) and, when the next generation keeps the
store, write their new ranks and the new world to the world file, which
the rendezvous here polls; they re-form in that world, in their processes,
and a new node's workers join them as warm spares do. The script must then
read its rank and world size from this loop (``rank``, ``world_size``),
not from its environment at start.

A rank that dies (SIGKILL, OOM) keeps the survivors too when ``ddp-agent
run --spares N`` keeps warm spares: the agent gives the dead rank to a
spare (``_spare``), whose ``init_process_group`` joins the survivors'
re-formation instead of starting a job, and whose ``InProcess`` takes the
state from a healthy peer and starts at the step the others retry. Without
a spare, the survivors wait ``timeout`` for the dead rank, then raise, and
the agent restarts every worker (docs/in-process.md).
"""

import datetime
import functools
import gc
import json
import logging
import os
import pickle
import socket
import time
import types
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import _bootstrap, _buffers, _collectives, _env, _random, _state
from . import hook as hook_module

log = logging.getLogger("ddp_agent")


def _prefix(attempt: str = "") -> str:
    """The store namespace of this generation's re-formations, in the attempt named attempt.

    ddp-agent's generation keeps a generation's keys from another's: the
    workers carried into the next one keep their store. Not the restart
    count, which after torchrun's rescale differs between nodes (as the
    hook's bootstrap keys showed, _bootstrap._store). Under ddp-agent every
    generation has its generation's prefix, and under torch 1.13's torchrun
    a store of its own. torchrun 2.5 and later serve every restart the
    same store, where a restarted attempt's re-formations met the keys of
    the attempt before: there attempt is the token the ranks agreed on at
    the start (_bootstrap.attempt_token), "" elsewhere.
    """
    generation = os.environ.get(_env.GENERATION, "0")
    if attempt:
        return f"ddp_agent/inprocess/attempt_{attempt}/generation_{generation}"
    return f"ddp_agent/inprocess/generation_{generation}"

Wrap = Callable[[torch.nn.Module], Tuple[torch.nn.Module, Any]]


def _job_store(timeout: float) -> Any:
    """The store the re-formations agree through.

    Under ``ddp-agent run``, a client of the job's TCPStore (rank 0's, or
    under --spares the agent's, at MASTER_ADDR:MASTER_PORT) without torch's prefixes: a warm spare that
    takes a dead rank reaches the same keys from a process that never
    joined the first process group. Elsewhere (torchrun), torch's default
    store, whose prefix every rank shares.
    """
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if os.environ.get(_env.GENERATION) is None or not addr or not port:
        return dist.distributed_c10d._get_default_store()
    return dist.TCPStore(addr, int(port), None, False, _timedelta(timeout))


class _Joined:
    """What a warm spare's ``init_process_group`` found: the re-formation it joined."""

    def __init__(self, store: Any, gen: int, arrivals: "Arrivals", since: float) -> None:
        self.store, self.gen, self.arrivals, self.since = store, gen, arrivals, since
        self.new = False  # a new worker of a grown job, not a spare in a dead rank's place


# Set by the init_process_group of a warm spare (_expect_join), taken by the
# InProcess that the script then makes: the one fact that crosses from
# torch's API into this loop, once per process.
_joined: Optional[_Joined] = None


def _expect_join(timeout: float = 60.0, new: bool = False) -> None:
    """Makes the next ``torch.distributed.init_process_group`` join the survivors' re-formation.

    For a warm spare that has taken a dead rank (``_spare``), or a new
    worker (``new``) that the others, carrying on from the last
    generation, take into their world: instead of starting a job's process
    group, it finds the re-formation that waits for its rank (the first
    whose key of that rank is unset), writes that it has completed no step,
    waits for the others, and makes the re-formation's process group with
    them. Later calls go to torch's.
    """
    original = dist.init_process_group
    used = False

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        nonlocal used
        dist.init_process_group = original
        if used:  # a module that bound this function before the script ran
            original(*args, **kwargs)
            return
        used = True
        global _joined
        _joined = _join(original, args[0] if args else kwargs.get("backend"), timeout)
        _joined.new = new

    dist.init_process_group = init_process_group


def _join(init: Callable[..., None], backend: Any, timeout: float) -> _Joined:
    t0 = time.monotonic()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store, prefix = _job_store(timeout), _prefix()  # under ddp-agent, whose generations name the keys
    gen = 1
    while _arrived(store, f"{prefix}/{gen}", rank):  # this rank's earlier re-formations
        gen += 1
    try:  # completed nothing: its state comes from a peer
        arrivals = _meet(store, f"{prefix}/{gen}", rank, world_size, -1, -1, timeout)
    except ReformError as e:
        raise ReformError(f"rank {rank}: a warm spare found no re-formation to join (re-formation {gen}): {e}") from e
    if _source(arrivals) is None:  # the survivors raise before their process group: none to join
        raise ReformError(_no_source(rank, max(arrivals.completed)))
    init(backend, store=_group_store(store, prefix, gen), rank=rank, world_size=world_size,
         timeout=_timedelta(max(timeout, 60.0)))
    return _Joined(store, gen, arrivals, t0)


class ReformError(RuntimeError):
    """A re-formation in process could not complete; the original error is its cause."""


class InProcess:
    """Runs a DDP training loop whose failed steps are retried in the same processes.

    Args:
        model: the module that ``wrap`` wraps, the same object for the whole run.
        optimizer: its optimizer; its state moves with the model's.
        wrap: ``wrap(model) -> (ddp_model, hook)``: makes the DDP model and
            registers the hook (``ddp_agent.register``). Called once here and
            after each re-formation, on every rank. The hook may be None, but
            then a fault on one rank is not seen by the others, waiting in
            DDP's own all-reduce: it is not re-formed in process, and falls
            back to the process restart after ``timeout`` (a warning says so).
        timeout: seconds a rank waits for the others at a re-formation.
        max_reforms: re-formations after which a fault is raised instead.
        state: more objects whose state the source rank gives the others with
            the model's, each with ``state_dict()`` and ``load_state_dict()``:
            an LR scheduler, a ``GradScaler``, the script's own counters. A
            warm spare or a new node's worker, which starts them afresh,
            diverged without them: its scheduler counted from 0.

    Attributes:
        rank, world_size: this process's rank and the world's size, which
            change when ddp-agent moves the workers into another world.
        generation: re-formations so far (0 before the first).
        ddp: the current DDP model; ``hook``: its hook.
        reforms: one dict per re-formation: the step that failed and the one
            retried, each rank's last completed step, the source of the
            state, the error's first line, each phase's milliseconds and
            whether this rank's random state was put back (random_restored),
            with first_step_ms once the retried step completed (ddp-agent
            is told then).
    """

    def __init__(self, model: torch.nn.Module, optimizer: Any, wrap: Wrap, *, timeout: float = 60.0,
                 max_reforms: int = 3, state: Sequence[Any] = ()) -> None:
        if not dist.is_initialized():
            raise RuntimeError("ddp_agent.InProcess: torch.distributed is not initialized (init_process_group)")
        # Checked now, not at the first fault, where they failed deep in a
        # re-formation with an AttributeError.
        if not isinstance(getattr(optimizer, "param_groups", None), list):
            raise TypeError(f"ddp_agent.InProcess: optimizer {type(optimizer).__name__} has no param_groups: "
                            "want a torch.optim.Optimizer")
        for obj in state:
            if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
                raise TypeError(f"ddp_agent.InProcess: state {type(obj).__name__} has no state_dict() and "
                                "load_state_dict()")
        self.state = list(state)
        self.model = model
        self.optimizer = optimizer
        self.timeout = float(timeout)
        self.max_reforms = max_reforms
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.backend = dist.get_backend()
        # The store the job started on outlives every process group made
        # on it: where rank 0 serves it (no --spares), its TCPStore server
        # lives as long as this reference.
        self._keep = dist.distributed_c10d._get_default_store()
        # Every rank makes its InProcess at the start, healthy: the one
        # moment to agree on the attempt's name, a collective, where the
        # store can hold an earlier attempt's re-formations. (A warm spare
        # runs under ddp-agent, whose store does not.)
        param = next(iter(model.parameters()), None)
        self._device = None if param is None else param.device  # the model's: its generator is kept too (_random)
        self._attempt = ""
        if _bootstrap.store_outlives_attempt():
            self._attempt = _bootstrap.attempt_token(None, self.rank, int(self.timeout * 1000), self._device,
                                                     "reached ddp_agent.InProcess")
        self._prefix = _prefix(self._attempt)
        self._wrap = wrap
        # The state's move runs once in this process first, on tiny
        # tensors: a source's first torch.cat of the small tensors took
        # 0.3-0.5 ms, and the receivers waited for it.
        _state.warm()
        self.generation = 0
        # The last re-formation's number under this world's prefix: the
        # next one's keys are under its successor (a world that ddp-agent
        # moved the workers into starts a prefix of its own).
        self._index = 0
        self.reforms: List[Dict[str, Any]] = []
        self.joined: Optional[Dict[str, Any]] = None
        self._completed = 0  # the last step this rank completed
        self._next: Optional[int] = None
        self._resume: Optional[int] = None  # a joined spare's first step
        # The last re-formation, until the step it resumed at completes
        # and ddp-agent is told (_report), and when it ended.
        self._unreported: Optional[Dict[str, Any]] = None
        self._reformed_at = 0.0
        # The model's buffers, kept as each step found them and broadcast
        # through the hook (_buffers): the failed step's start to restore.
        self._buffers: Optional[_buffers.Buffers] = None
        self._labels = _collectives.Labels()  # the telemetry's buckets of the script's collectives
        # The step in progress, and its parameters' count and version at its
        # start; whether the optimizer's step ran since (_changed).
        self._started: Optional[Tuple[int, int, int]] = None
        self._stepped = _Stepped(optimizer)
        # torch's random state at the step's start, put back for its retry.
        self._random = _random.StepRandom()
        global _joined
        joined, _joined = _joined, None
        if joined is not None:
            self._store = joined.store
            self._join(joined)
        else:
            self._store = _job_store(self.timeout)
            self.ddp = self.hook = None
            try:
                self._wrapped()
            except Exception as e:
                if self.hook is None:  # wrap itself raised: the script's error, not a fault
                    raise
                # The communicator's first open failed: a peer failed before
                # its first step, or ddp-agent moved the workers on while they
                # started (a node joined or was lost: the agent's generation
                # is past this process's, or it aborted the communicators to
                # hold the workers for the next one). A fault like a step's,
                # re-formed the same way, before the first step (step 0).
                self._reform(0, e, time.monotonic())

    def steps(self, first: int, stop: int) -> Iterator[int]:
        """Yields the steps first..stop-1; after a re-formation, the step to retry and on from there."""
        step = first if self._resume is None else max(first, self._resume)
        self._resume = None
        self._completed = step - 1
        while step < stop:
            self._next = None
            yield step
            step = self._next if self._next is not None else step + 1

    def step(self, step: int) -> "_Step":
        """The context of one step: on an exception in it, re-forms and has :meth:`steps` retry."""
        return _Step(self, step)

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """All-reduces tensor in place across the ranks, op "sum" or "avg", in a way a failing rank can abort.

        For the script's own collectives inside a step (its loss for the
        log, a metric): a CPU tensor goes through the hook's host
        communicator, so a rank that raises before it fails the others'
        at once and every rank re-forms, where in ``torch.distributed``'s
        all-reduce they waited for it until the rendezvous gave up. A CUDA
        tensor goes through ``torch.distributed`` (not abortable). Every
        rank must call it in the same order (_collectives). Returns tensor.
        """
        return _collectives.all_reduce(self.hook, tensor, op, self._labels)

    def barrier(self) -> None:
        """Waits for every rank, as ``torch.distributed.barrier()``, in a way a failing rank can abort (all_reduce)."""
        _collectives.barrier(self.hook, self._labels)

    def close(self) -> None:
        """Closes the current hook (before ``dist.destroy_process_group()``).

        The DDP model broadcasts its buffers through DDP's own again: a
        forward after this (an evaluation) works as without this loop.
        """
        _buffers.untrack(self.ddp)
        if self.hook is not None:
            self.hook.close()

    def _join(self, j: _Joined) -> None:
        """A warm spare's part of the re-formation it joined: the state from the source, the hook, the step."""
        best, src = max(j.arrivals.completed), _source(j.arrivals)
        if src is None:
            raise ReformError(_no_source(self.rank, best))
        t = time.monotonic()
        # The survivors' new hooks are named by how many they registered
        # before, by group: this process's must have the same names. A
        # subgroup's count is its ranks' alone, so every survivor's is read
        # (each wrote before it arrived, and all have arrived).
        key = f"{self._prefix}/{j.gen}/registrations"
        for i in range(1, self._store.add(key, 0) + 1):
            hook_module._continue_registrations(json.loads(bytes(self._store.get(f"{key}/{i}"))))
        state_bytes, move_ms = self._take_state(j.gen, src, j.arrivals.hook_steps)
        self.generation = self._index = j.gen
        self._completed = best
        self._resume = best + 1
        self.joined = {"generation": j.gen, "retry": best + 1, "source": src, "completed": j.arrivals.completed,
                       "rendezvous_ms": round((t - j.since) * 1e3, 1), "state_ms": _ms(t), "state_bytes": state_bytes,
                       "move_ms": move_ms, "total_ms": _ms(j.since)}
        as_what = "a new worker" if j.new else "a warm spare"
        log.warning("ddp_agent: rank %d joined re-formation %d in process as %s: resuming at step %d with "
                    "rank %d's state; rendezvous and process group %.1f ms, state %.1f ms (%d bytes moved in "
                    "%.1f ms)", self.rank, j.gen, as_what, best + 1, src, self.joined["rendezvous_ms"], self.joined["state_ms"],
                    state_bytes, move_ms)

    # The re-formation, in its phases.

    def _reform(self, step: int, err: BaseException, t0: float) -> None:
        self._report()  # a re-formation whose resumed step failed too
        gen = self.generation + 1
        if gen > self.max_reforms:
            raise ReformError(f"rank {self.rank}: step {step} failed after {self.max_reforms} re-formations in process") from err
        phases: Dict[str, float] = {}
        hook_step = getattr(getattr(self.hook, "_schedule", None), "step", 0)
        changed = self._changed(step)
        self._abort(err)
        phases["abort_ms"] = _ms(t0)
        t = time.monotonic()
        world_size = self.world_size
        index, arrivals = self._rendezvous(step, err, hook_step, changed)
        completed = arrivals.completed
        phases["rendezvous_ms"] = _ms(t)
        best, src = max(completed), _source(arrivals)
        if src is None:
            raise ReformError(_no_source(self.rank, best)) from err
        t = time.monotonic()
        self._new_group(index)
        phases["process_group_ms"] = _ms(t)
        t = time.monotonic()
        phases["state_bytes"], phases["move_ms"] = self._take_state(index, src, arrivals.hook_steps)
        phases["state_ms"] = _ms(t)
        self.generation, self._index = gen, index
        self._completed = best
        self._next = best + 1
        # Last, after wrap: the retry draws from where its failed attempt did.
        random_back = self._random.restore(best + 1)
        info = {"generation": gen, "step": step, "retry": best + 1, "source": src, "completed": completed, "fault_at": t0,
                "error": _first_line(err), **phases, "random_restored": random_back, "total_ms": _ms(t0)}
        if self.world_size != world_size:
            info["world_size"] = self.world_size
        self.reforms.append(info)
        self._unreported, self._reformed_at = info, time.monotonic()
        log.warning("ddp_agent: re-formed in process, re-formation %d: rank %d's step %d failed (%s); "
                    "resuming at step %d with rank %d's state, %d ranks; abort %.1f ms, rendezvous %.1f ms, "
                    "process group %.1f ms, state %.1f ms", gen, self.rank, step, info["error"], best + 1, src,
                    self.world_size, phases["abort_ms"], phases["rendezvous_ms"], phases["process_group_ms"],
                    phases["state_ms"])

    def _report(self) -> None:
        """Tells ddp-agent of the last re-formation, through the hook's communicator, once.

        Called when the step it resumed at completed (its time is the phase
        "first_step": fault to that step's end is what the job lost), or,
        without that phase, when that step failed too. Without ddp-agent
        (torchrun alone) the shim has no one to tell; a report that cannot
        be sent is logged, never raised: it is not worth a training step.
        """
        info, self._unreported = self._unreported, None
        if info is None:
            return
        phases = [{"name": name, "ms": info[f"{name}_ms"]} for name in ("abort", "rendezvous", "process_group", "state")]
        if self._completed >= info["retry"]:
            info["first_step_ms"] = _ms(self._reformed_at)
            phases.append({"name": "first_step", "ms": info["first_step_ms"]})
        comms = getattr(self.hook, "_comms", None)  # a hook of ddp_agent.register; None without one
        comm = None if comms is None else comms.get("host") or comms.get("nccl")
        if comm is None:
            return
        report = {"reform": info["generation"], "step": info["step"], "resume": info["retry"], "source": info["source"],
                  "error": info["error"], "phases": phases}
        try:
            comm.reformed(report)
        except Exception as e:
            log.warning("ddp_agent: telling ddp-agent of re-formation %d: %s", info["generation"], e)

    def _wrapped(self) -> None:
        """Calls wrap, keeps its DDP model and hook, and opens the hook's host communicator now rather than at
        the first bucket.

        Open on every rank, the communicator carries a fault at once: a rank
        that fails before its first backward aborts it, and its peers, in
        their first all-reduce, fail instead of waiting out the bootstrap's
        timeout for a rank that will never open it. (CUDA buckets open their
        NCCL communicator at the first bucket, as without this loop.) The
        DDP model's buffers are then broadcast through it (_buffers).
        """
        self._buffers = None
        made = self._wrap(self.model)
        if not (isinstance(made, tuple) and len(made) == 2):
            raise TypeError(f"ddp_agent.InProcess: wrap returned {type(made).__name__}, want (ddp_model, hook)")
        self.ddp, self.hook = made
        if self.hook is None and not getattr(self, "_warned_hookless", False):
            self._warned_hookless = True
            if self.rank == 0:
                log.warning("ddp_agent: InProcess without ddp_agent's hook (wrap returned None): a fault on one rank "
                            "leaves the others in DDP's own all-reduce, so it is not re-formed in process but falls "
                            "back to the process restart after the timeout (%g s)", self.timeout)
        on_cpu = all(p.device.type == "cpu" for p in self.model.parameters())
        if self.hook is not None and on_cpu and getattr(self.hook, "transport", None) in ("auto", "host"):
            self.hook._comms.open("host")  # a failure leaves the hook for _abort to close
            self._buffers = _buffers.track(self.ddp, self.model, self.hook, self._labels)

    def _version(self, count: Optional[int] = None) -> Tuple[int, int]:
        """How many parameters the optimizer has, and the sum of the first count's version counters (all's).

        Every in-place change through autograd advances a version counter:
        the script's own, an optimizer's that _Stepped does not see. The
        sum, not one parameter's: the optimizer skips a frozen one. About 10
        µs a step for 160 parameters on the 2-core VM. Parameter groups added
        during the step (unfreezing) come after the first count.
        """
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        return len(params), sum(p._version for p in params[:count])

    def _changed(self, step: int) -> bool:
        """Whether step, failing on this rank, changed the parameters (its optimizer's step ran, or an in-place
        change of the script's), so this rank's state is no completed step's."""
        started = self._started
        if started is None or started[0] != step:
            return False
        return self._stepped.ran or self._version(started[1])[1] != started[2]

    def _abort(self, err: BaseException) -> None:
        """Aborts this rank's communicators (no goodbye: the peers fail at once) and drops the DDP model."""
        if self.hook is not None:
            try:
                for transport in ("host", "nccl"):
                    self.hook._comms.abort(transport, f"rank {self.rank} re-forms in process after: {err}"[:200])
                self.hook._close(at_exit=True)
            except Exception as e:  # the hook may be half-broken already
                log.warning("ddp_agent: closing the failed hook: %s", e)
        self.hook = None
        self.ddp = None
        if self._buffers is not None and self._buffers.restore():
            log.info("ddp_agent: rank %d's buffers are back as the failed step's first forward found them",
                     self.rank)
        self._buffers = None

    def _rendezvous(self, step: int, err: BaseException, hook_step: int, changed: bool) -> Tuple[int, "Arrivals"]:
        """Writes this rank's last completed step, its hook's and whether its failed step changed its parameters;
        returns the re-formation's number under the prefix and every rank's, in rank order.

        Under ddp-agent run --spares, the agent may move the workers into
        a smaller world meanwhile (a node was lost: the ranks this one
        waits for are gone): its world file says so, and the rendezvous
        starts again in that world, as the rank the file gives this process.
        """
        index = self._index + 1
        path = os.environ.get(_env.WORLD_FILE)
        while True:
            prefix = f"{self._prefix}/{index}"
            store = self._store
            moved = None if not path else (lambda: _world_news(path))
            try:
                # For a warm spare that takes a dead rank (_join): the names
                # of the next hooks, one entry per survivor, before it arrives.
                slot = store.add(f"{prefix}/registrations", 1)
                store.set(f"{prefix}/registrations/{slot}", json.dumps(hook_module._registered()))
                return index, _meet(store, prefix, self.rank, self.world_size, self._completed, hook_step,
                                    self.timeout, moved, changed)
            except _WorldChanged as w:
                self._adopt(w.world)
                index = 1
                continue
            except Exception as e:
                if not path or _store_alive(store, prefix):
                    raise ReformError(f"rank {self.rank}: re-formation {index} after step {step} failed: {e}; "
                                      "falling back to a process restart") from err
                lost = _first_line(e)
            # The store's node is gone: ddp-agent moves the workers into a
            # world whose store another node serves.
            store = None
            self._drop_store()
            self._adopt(self._await_world(path, lost))
            index = 1

    def _drop_store(self) -> None:
        """Lets go of every client of the lost store: the process group's, the job's, the one kept from the start.

        torch 1.13's TCPStore client runs a thread that polls its socket
        and, once the server is gone, spins on the hung-up socket: each
        took a fifth of a core on the 2-core VM, and the survivors' clients
        slowed the new store's start (its import of torch) from 1 s to 6-8.
        """
        if dist.is_initialized():
            dist.destroy_process_group()
        self._store = self._keep = None
        gc.collect()  # the clients' threads end with them

    def _await_world(self, path: str, lost: str) -> Dict[str, Any]:
        """Waits, up to timeout, for the world file to name the world that ddp-agent moves the workers into
        after their store was lost with its node; raises ReformError if it does not."""
        deadline = time.monotonic() + self.timeout
        log.warning("ddp_agent: rank %d lost the workers' store (%s); waiting for ddp-agent to move the workers",
                    self.rank, lost)
        while time.monotonic() < deadline:
            world, _ = _world_news(path)
            if world is not None:
                return world
            time.sleep(_POLL)
        raise ReformError(f"rank {self.rank}: the workers' store is gone ({lost}) and ddp-agent moved the workers into "
                          f"no new world within {self.timeout:g} s; falling back to a process restart")

    def _adopt(self, world: Dict[str, Any]) -> None:
        """Becomes the rank that ddp-agent's world file gives this process, in the file's world and generation.

        The variables change with it: the hook's communicators bootstrap
        through the agent by them, and the next re-formation's keys are
        under the new generation's prefix.
        """
        rank = world["ranks"].get(str(os.getpid()))
        if rank is None:
            raise ReformError(f"rank {self.rank}: ddp-agent moved the workers into generation {world['generation']} "
                              f"without this process (pid {os.getpid()})")
        old = self.rank, self.world_size
        size = int(world["world_size"])
        addr, port = world.get("master_addr"), world.get("master_port")
        elsewhere = (addr, str(port)) != (os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT"))
        if addr and port and (elsewhere or self._store is None):
            # The node that served the store left: another serves a new one
            # (or this process let go of its client, _drop_store).
            t0 = time.monotonic()
            _await_listener(addr, int(port), self.timeout)
            self._store = dist.TCPStore(addr, int(port), None, False, _timedelta(self.timeout))
            os.environ.update({"MASTER_ADDR": addr, "MASTER_PORT": str(port)})
            log.warning("ddp_agent: rank %d moved to the workers' new store at %s:%s (it listened after %.1f ms)",
                        self.rank, addr, port, _ms(t0))
        os.environ.update({"RANK": str(rank), "ROLE_RANK": str(rank), "WORLD_SIZE": str(size),
                           "ROLE_WORLD_SIZE": str(size), "GROUP_RANK": str(world["group_rank"]),
                           "GROUP_WORLD_SIZE": str(world["nnodes"]),
                           "TORCHELASTIC_RESTART_COUNT": str(world["restart_count"]),
                           _env.GENERATION: str(world["generation"])})
        self.rank, self.world_size = int(rank), size
        self._prefix = _prefix()  # ddp-agent's world file: its generations name the keys, no attempt token
        log.warning("ddp_agent: rank %d of %d carries on in process as rank %d of %d (generation %d: the job's "
                    "nodes changed)", old[0], old[1], self.rank, self.world_size, world["generation"])

    def _new_group(self, gen: int) -> None:
        if dist.is_initialized():  # not after the store was lost (_drop_store)
            dist.destroy_process_group()
        dist.init_process_group(self.backend, store=_group_store(self._store, self._prefix, gen), rank=self.rank,
                                world_size=self.world_size,
                                timeout=_timedelta(max(self.timeout, 60.0)))

    def _match_state(self, gen: int, src: int) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        """Gives this rank the source's optimizer layout; returns the model's and the optimizer's tensors.

        Both lists are in the same order on every rank.

        The optimizer's state can differ in shape between ranks (a rank that
        failed before its first optimizer step has no momentum yet; a spare
        has none), so the source publishes its layout and its non-tensor
        entries through the store, and the others make their state match it.
        """
        key = f"{self._prefix}/{gen}/optimizer"
        if self.rank == src:
            layout = _state.optimizer_layout(self.optimizer)
            self._store.set(key, pickle.dumps(layout))
        else:
            self._store.wait([key], _timedelta(self.timeout))
            layout = pickle.loads(self._store.get(key))
            _state.apply_layout(self.optimizer, layout)
        tensors = [t for t in self.model.state_dict().values() if isinstance(t, torch.Tensor)]
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        return tensors, [self.optimizer.state[params[i]][k] for i, k, _, _ in layout["tensors"]]

    def _take_state(self, gen: int, src: int, hook_steps: List[int]) -> Tuple[int, float]:
        """Makes every rank's model and optimizer state the source's, and the DDP model and hook anew.

        The hook comes first: its host communicator carries the state, in
        one broadcast of the shim (docs/in-process.md). Returns the bytes
        moved and the milliseconds it took.
        """
        model, optim = self._match_state(gen, src)
        base = max(hook_steps) + 1
        before = (0, 0.0)
        if src != 0:
            # DDP's constructor broadcasts rank 0's parameters and buffers
            # to every rank. Where rank 0 is not the source (a warm spare
            # in its place, or a rank 0 that failed after its optimizer
            # step), wrap would overwrite the source's model with rank 0's:
            # the model goes first, through torch.distributed.
            before = _state.move(model, src, self.rank, None, label_step=base - 1)
            model = []
        self._wrapped()
        _continue_steps(self.hook, base)
        comms = getattr(self.hook, "_comms", None)
        comm = comms.get("host") if comms is not None else None
        moved, ms = _state.move(model + optim, src, self.rank, comm, label_step=base - 1)
        self._take_extra(gen, src)
        return before[0] + moved, round(before[1] + ms, 1)

    def _take_extra(self, gen: int, src: int) -> None:
        """Gives every rank the source's ``state`` objects' state (schedulers and the like: small), through the store."""
        if not self.state:
            return
        key = f"{self._prefix}/{gen}/state"
        if self.rank == src:
            self._store.set(key, pickle.dumps([obj.state_dict() for obj in self.state]))
            return
        self._store.wait([key], _timedelta(self.timeout))
        for obj, saved in zip(self.state, pickle.loads(self._store.get(key))):
            obj.load_state_dict(saved)


class _Stepped:
    """Whether an optimizer's step ran since ``clear()``.

    Its version counters alone missed fused optimizers (torch 2.x's
    ``fused=True`` on the CPU) and optimizers that write through ``p.data``:
    a review's SGD(fused=True) failing after its step was taken as the
    source and its step applied twice. torch 2.x tells every optimizer's
    step (``register_step_post_hook``); on 1.13 the instance's ``step`` is
    wrapped, as a method (an LR scheduler made later wraps it again through
    ``__self__`` and ``__func__``), keeping the attributes of a scheduler's
    wrapper made before.
    """

    def __init__(self, optimizer: Any) -> None:
        self.ran = False
        register = getattr(optimizer, "register_step_post_hook", None)
        if callable(register):
            register(self._ran)
            return
        step = optimizer.step

        @functools.wraps(step)
        def stepped(_optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            out = step(*args, **kwargs)
            self.ran = True
            return out

        optimizer.step = types.MethodType(stepped, optimizer)

    def _ran(self, *_args: Any) -> None:
        self.ran = True

    def clear(self) -> None:
        self.ran = False


class _Step:
    def __init__(self, loop: InProcess, step: int) -> None:
        self.loop = loop
        self.n = step

    def __enter__(self) -> torch.nn.Module:
        loop = self.loop
        loop._stepped.clear()
        loop._started = (self.n, *loop._version())
        loop._random.save(self.n, loop._device)
        if loop._buffers is not None:
            loop._buffers.step_started()
        return loop.ddp

    def __exit__(self, kind, err, tb) -> bool:
        loop = self.loop
        if err is None:
            loop._completed = self.n
            if loop._buffers is not None:
                loop._buffers.step_completed()
            if loop._unreported is not None:
                loop._report()
            try:
                _rebuild_buckets(loop.ddp)
            except Exception as e:  # a peer failed: the step is done, the next is retried
                loop._reform(self.n + 1, e, time.monotonic())
            return False
        if not isinstance(err, Exception):
            return False  # KeyboardInterrupt, SystemExit: leave
        loop._reform(self.n, err, time.monotonic())
        return True


def _rebuild_buckets(ddp: Any) -> None:
    """Runs DDP's bucket rebuild at the end of a DDP model's first completed step, where DDP runs it at the start
    of its second forward.

    The rebuild is a broadcast from rank 0 over the process group, which
    nothing can abort: a rank that raised before that forward (its data,
    say) left the others in it until the rendezvous gave up and the job
    restarted (a review, 2026-12-01: train.py --in-process failing at step
    2). Here every rank has completed the step, so all of them run it, and
    the forwards after it run none. A rank that fails after its gradient
    all-reduce leaves the others in it, as in any collective of the script
    between steps (docs/in-process.md, Limits). As in DDP: once, with
    gradients on, and only when the first backward recorded the order
    (the reducer decides, the same on every rank).
    """
    reducer = getattr(ddp, "reducer", None)
    if reducer is None or getattr(ddp, "_has_rebuilt_buckets", True) or not torch.is_grad_enabled():
        return
    if reducer._rebuild_buckets():
        log.info("ddp_agent: DDP's buckets rebuilt at the end of the model's first step")
        ddp._has_rebuilt_buckets = True


def _arrive(store: Any, prefix: str, rank: int, completed: int, hook_step: int, changed: bool = False) -> None:
    """Writes a rank's last completed step, its hook's step count and whether its failed step changed its
    parameters (_Step), at a re-formation, and counts its arrival.

    The counts are how a rank's arrival, and how many arrived, are looked
    up (_arrived, _meet) on every torch: 1.13's TCPStore has no check(),
    and a wait that times out breaks its connection.
    """
    store.set(f"{prefix}/rank{rank}", f"{completed} {hook_step} {int(changed)}")
    store.add(f"{prefix}/in{rank}", 1)
    store.add(f"{prefix}/arrived", 1)


class _WorldChanged(Exception):
    """ddp-agent moved the workers into another world during a re-formation's rendezvous."""

    def __init__(self, world: Dict[str, Any]) -> None:
        super().__init__(f"generation {world['generation']}")
        self.world = world


# How often a rendezvous that ddp-agent may move into another world looks
# at the count of arrivals and at the world file.
_POLL = 0.01


class Arrivals(NamedTuple):
    """What every rank wrote at a re-formation, in rank order (_arrive)."""

    completed: List[int]
    hook_steps: List[int]
    changed: List[bool]


def _meet(store: Any, prefix: str, rank: int, world_size: int, completed: int, hook_step: int, timeout: float,
          moved: Optional[Callable[[], Tuple[Optional[Dict[str, Any]], bool]]] = None,
          changed: bool = False) -> Arrivals:
    """Arrives at re-formation prefix and waits for every rank: returns what each one wrote. Raises ReformError naming the ranks that did not arrive within timeout,
    and _WorldChanged when moved, asked while it waits, returns a new world; while it says hold, the
    rendezvous does not end, every rank arrived or not (the agent moves the workers into another world)."""
    _arrive(store, prefix, rank, completed, hook_step, changed)
    keys = [f"{prefix}/rank{r}" for r in range(world_size)]
    try:
        if moved is None:
            store.wait(keys, _timedelta(timeout))
        else:
            deadline = time.monotonic() + timeout
            while True:
                world, hold = moved()
                if world is not None:
                    raise _WorldChanged(world)
                if not hold and store.add(f"{prefix}/arrived", 0) >= world_size:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("timed out")
                time.sleep(_POLL)
    except _WorldChanged:
        raise
    except Exception as e:
        if not _store_alive(store, prefix):
            raise ReformError(f"the workers' store failed ({e})") from e
        missing = [r for r in range(world_size) if not _arrived(store, prefix, r)]
        # A live rank that never comes waits in a collective the hook does
        # not run and nothing can abort (docs/in-process.md, Limits).
        raise ReformError(f"ranks {missing} did not arrive within {timeout:g} s ({e}): each is dead, or stuck in a "
                          "collective outside ddp_agent's hook, such as DDP's buffer broadcast (broadcast_buffers="
                          "True, a model with CUDA buffers), its bucket rebuild after a model's first step, or the "
                          "script's own") from e
    fields = [bytes(store.get(k)).decode().split() + ["0"] for k in keys]
    return Arrivals([int(f[0]) for f in fields], [int(f[1]) for f in fields], [f[2] == "1" for f in fields])


def _source(arrivals: Arrivals) -> Optional[int]:
    """The rank whose state the others take: the lowest that completed the most steps and did not change its
    parameters since (pure); None when every such rank did.

    A rank that failed after its optimizer step holds the next step's
    parameters (and momentum) without having completed it: taken as the
    source, the retried step would be applied twice. That happened to every
    rank when a collective of the script after the optimizer step failed
    them all (InProcess.all_reduce).
    """
    best = max(arrivals.completed)
    clean = [r for r, (c, ch) in enumerate(zip(arrivals.completed, arrivals.changed)) if c == best and not ch]
    return clean[0] if clean else None


def _group_store(store: Any, prefix: str, gen: int) -> Any:
    """The store of re-formation gen's process group: the same on the survivors and a joining spare."""
    return dist.PrefixStore(f"{prefix}/{gen}/pg", store)


def _continue_steps(hook: Any, step: int) -> None:
    """Numbers a new hook's steps on from the old hooks' (the same on every rank).

    The steps number the hook's collectives in ddp-agent's telemetry: a new
    hook counting from 0 again would give its collectives the keys of the
    old hook's, which the agent has seen complete (or hang) already.
    """
    schedule = getattr(hook, "_schedule", None)
    if schedule is not None:
        schedule.step = step


def _await_listener(addr: str, port: int, timeout: float) -> None:
    """Waits until addr:port accepts a connection, polling, up to timeout.

    A new store's process may still be starting (importing torch). torch's
    client retries a refused connection too, but a second or more apart:
    seconds of a re-formation, where this sees the listener within _POLL.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((addr, port), timeout=max(0.1, min(1.0, deadline - time.monotonic()))).close()
            return
        except OSError as e:
            if time.monotonic() > deadline:
                raise ReformError(f"the workers' new store at {addr}:{port} did not listen within {timeout:g} s ({e})") from e
            time.sleep(_POLL)


def _store_alive(store: Any, prefix: str) -> bool:
    """Whether the store still answers (a store whose process died fails every call at once)."""
    try:
        store.add(f"{prefix}/arrived", 0)
        return True
    except Exception:
        return False


def _arrived(store: Any, prefix: str, rank: int) -> bool:
    return store.add(f"{prefix}/in{rank}", 0) > 0


def _world_news(path: str) -> Tuple[Optional[Dict[str, Any]], bool]:
    """What ddp-agent's world file says to this process: (the world of a later generation than its own, or
    None; whether to hold its re-formation: the agent keeps the workers to move them into the next
    generation, whose world it does not know yet).

    The hold keeps a re-formation that every rank reached from ending in the
    old world: after a node joined, nobody is missing.
    """
    try:
        with open(path, encoding="utf-8") as f:
            world = json.load(f)
    except (OSError, ValueError):  # none yet; it is replaced whole, never written in place
        return None, False
    gen, own = int(world.get("generation", -1)), int(os.environ.get(_env.GENERATION) or 0)
    if world.get("moving"):
        # A later generation's mark too: the agent moved on before this
        # process read the world it was moved into; the next one follows.
        return None, gen >= own
    return (world, False) if gen > own else (None, False)


def _no_source(rank: int, best: int) -> str:
    return (f"rank {rank}: every rank that completed step {best} changed its parameters in step {best + 1} before "
            f"it failed (its optimizer's step ran): none holds step {best}'s state to retry from; falling back to "
            "a process restart. A collective of the script after the optimizer's step can fail every rank there: "
            "put it before optimizer.step()")


def _first_line(err: BaseException) -> str:
    """The error's type and the first line of its message (torch appends a traceback to a callback's)."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:300]


def _ms(t0: float) -> float:
    return round((time.monotonic() - t0) * 1e3, 1)


def _timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)
