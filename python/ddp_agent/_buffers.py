"""A model's CPU buffers under ``InProcess``: broadcast through the shim, and kept as each step found them.

Under ``broadcast_buffers=True`` (DDP's default) a DDP model whose module
has buffers (BatchNorm's running statistics) broadcasts them from rank 0
before a forward, over the process group. That broadcast has no abort: a
rank 0 that raised before its forward (its data failed) left the others in
it, and an in-process re-formation waited for them until its rendezvous
gave up and the job fell back to the process restart (docs/in-process.md,
Limits). Here DDP's ``_sync_module_buffers`` (the same in PyTorch 1.13 and
2.x; DDP calls it where and when it broadcasts, from the rank it chose,
another under its ``join``) makes the same broadcast through the hook's
host communicator, as the state's move does (``_state.Broadcast``): an
abort of the failing rank's communicator fails its peers' broadcast at
once. The bytes are the ones DDP's broadcast gives, so a run's result is
the same. (DDP's buffer comm hook is not told the rank to broadcast from.)

A forward also updates the buffers in place (BatchNorm adds the batch to
its running statistics), so a step that fails after its forward and is
retried would count its batch twice. Each step starts with a copy of the
buffers, by name, which a re-formation puts back on a rank whose step
failed; a step's first broadcast refreshes it, so that every rank holds
the authoritative rank's values, as the step found them.
"""

import functools
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from . import _collectives, _state

# The bucket that labels the buffers' broadcast in ddp-agent's telemetry:
# no DDP bucket has that index (_state.STATE_BUCKET is the one above). It
# carries the step whose forward it starts, the step its gradients' buckets
# carry after it. A second broadcast in the same step (two forwards before
# a backward) takes a script collective's label: the ranks' records of one
# collective meet under (step, bucket).
BUFFERS_BUCKET = 2**31 - 2


class Buffers:
    """A DDP model's buffers under ``InProcess``: the step's copy, and the broadcast prepared for them."""

    def __init__(self, module: torch.nn.Module, hook: Any, labels: _collectives.Labels) -> None:
        self.module = module
        self.hook = hook
        self._labels = labels
        # The buffers' addresses, sizes and dtypes when the broadcast was
        # prepared: the same from step to step unless a module replaced or
        # resized a buffer. Prepared
        # once, a step pays the broadcast only (with 159 buffers, preparing
        # took as long again).
        self._key: List[Tuple[int, int, torch.dtype]] = []
        self._plan: Optional[_state.Broadcast] = None
        self._root = -1  # the rank the plan broadcasts from
        self._copy: Dict[str, torch.Tensor] = {}
        self._kept = False  # the copy is the step's in progress
        self._refreshed = False  # the step's first broadcast refreshed it
        self._last_step: Optional[int] = None  # the hook step of the last broadcast

    def step_started(self) -> None:
        """Copies the module's buffers, by name (at the start of a step)."""
        named = dict(self.module.named_buffers())
        if named.keys() != self._copy.keys():
            self._copy = {k: v for k, v in self._copy.items() if k in named}
        with torch.no_grad():
            for name, b in named.items():
                c = self._copy.get(name)
                if c is None or c.shape != b.shape or c.dtype != b.dtype:
                    self._copy[name] = c = torch.empty_like(b)
                c.copy_(b)
        self._kept, self._refreshed = True, False

    def step_completed(self) -> None:
        self._kept = False

    def restore(self) -> bool:
        """Puts back the copy of the failed step's start, if it has one, by name; returns whether it did.

        By name: a module may replace a buffer rather than update it (DDP
        picks such buffers up at each broadcast), and the step's tensors are
        then no longer the module's.
        """
        if not self._kept:
            return False
        with torch.no_grad():
            for name, saved in self._copy.items():
                prefix, _, leaf = name.rpartition(".")
                owner = self.module.get_submodule(prefix)
                current = owner._buffers.get(leaf)
                if current is not None and current.shape == saved.shape and current.dtype == saved.dtype:
                    current.copy_(saved)
                else:
                    owner._buffers[leaf] = saved.clone()
        self._kept = False
        return True

    def broadcast(self, tensors: List[torch.Tensor], root: int) -> bool:
        """Broadcasts tensors from root through the hook's host communicator; returns False where it cannot
        (the communicator closed: after ``InProcess.close``), leaving it to DDP's own broadcast."""
        hook = self.hook
        comm = _collectives.host(hook)
        if comm is None:
            return False
        key = [(t.data_ptr(), t.numel(), t.dtype) for t in tensors]
        plan = self._plan
        if key != self._key or plan is None or root != self._root:
            plan = _state.Broadcast(tensors, comm, hook.rank == root)
            # A plan that packs tensors (odd sizes) or leaves some to torch
            # is made again each time: the source's packed bytes are the
            # step's.
            self._plan = None if plan.odd or plan.rest else plan
            self._key, self._root = key, root
        step = hook.step
        bucket = BUFFERS_BUCKET if step != self._last_step else self._labels.next(step)
        self._last_step = step
        with torch.no_grad():
            plan.run(root, hook.rank, step=step, bucket=bucket)
        if self._kept and not self._refreshed:
            if hook.rank != root:  # the root's are what its copy holds
                self.step_started()
            self._refreshed = True
        return True


def track(ddp: Any, module: torch.nn.Module, hook: Any, labels: _collectives.Labels) -> Optional[Buffers]:
    """Keeps module's buffers for ``InProcess`` and broadcasts ddp's through the shim; returns their state, or None.

    Where module has buffers, all on the CPU, and hook's host communicator
    is open. Elsewhere nothing changes (CUDA buffers: DDP's broadcast,
    NCCL's, and no copy). Under ``broadcast_buffers=False`` DDP broadcasts
    nothing, and the buffers are only kept.
    """
    if _collectives.host(hook) is None:
        return None
    buffers = list(module.buffers())
    if not buffers or any(b.device.type != "cpu" for b in buffers):
        return None
    state = Buffers(module, hook, labels)
    default = getattr(type(ddp), "_sync_module_buffers", None)
    if callable(default) and hasattr(ddp, "modules_buffers"):
        ddp._sync_module_buffers = functools.partial(_sync_module_buffers, weakref.ref(ddp), state, default)
    return state


def untrack(ddp: Any) -> None:
    """Gives ddp its own buffer broadcast back (``InProcess.close``: the communicator goes)."""
    if ddp is not None:
        ddp.__dict__.pop("_sync_module_buffers", None)


def _sync_module_buffers(ddp_ref: Callable[[], Any], state: Buffers, default: Callable[[Any, int], None],
                         authoritative_rank: int) -> None:
    """DDP's ``_sync_module_buffers`` on one model: its buffers from authoritative_rank, through the shim.

    A buffer comm hook of the script's own goes first, as in DDP.
    """
    ddp = ddp_ref()
    if ddp is None:
        return
    if hasattr(ddp, "buffer_hook") or not state.broadcast(list(ddp.modules_buffers), authoritative_rank):
        default(ddp, authoritative_rank)
