"""DDP's buffer broadcast through the hook's host communicator, which a failing rank can abort.

Under ``broadcast_buffers=True`` (DDP's default) a DDP model whose module
has buffers (BatchNorm's running statistics) broadcasts them from rank 0 at
the start of every forward, over the process group. That broadcast has no
abort: a rank 0 that raised before its forward (its data failed) left the
others in it, and an in-process re-formation waited for them until its
rendezvous gave up and the job fell back to the process restart
(docs/in-process.md, Limits).

``InProcess`` gives such a model a buffer hook (DDP's
``_register_buffer_comm_hook``, PyTorch 1.12 and later, at DDP's own point:
before the forward) that makes the same broadcast through the shim, as the
state's move does (``_state.Broadcast``): an abort of the failing rank's
communicator fails its peers' broadcast at once, and their step goes on to
the re-formation. The bytes are the ones DDP's broadcast gives, so a run's
result is the same.
"""

from typing import Any, Dict, List, Optional

import torch

from . import _state

# The bucket that labels the buffers' broadcast in ddp-agent's telemetry:
# no DDP bucket has that index (_state.STATE_BUCKET is the one above). It
# carries the step whose forward it starts, the step its gradients' buckets
# carry after it.
BUFFERS_BUCKET = 2**31 - 2

# DDP's authoritative rank for buffers when it does not run its join
# context, which a buffer hook is not told of.
_ROOT = 0


class Buffers:
    """The buffer hook's state: ddp_agent's hook, whose host communicator and step count it uses, the broadcast
    prepared for the buffers, and a copy of them as the step's first broadcast left them.

    Under broadcast_buffers every rank's buffers are rank 0's at the start
    of a step's first forward, which then updates them in place
    (BatchNorm's running statistics take the batch's). A step that fails
    after that forward and is retried must start from the copy, or its
    batch counts twice: the copy is what ``InProcess`` restores.
    """

    def __init__(self, hook: Any) -> None:
        self.hook = hook
        # The buffers' addresses when the broadcast and the copy were
        # prepared: the same from step to step unless a module replaced a
        # buffer. Prepared once, a step pays the broadcast and the copy only
        # (with 159 buffers, preparing took as long again).
        self._key: List[int] = []
        self._plan: Optional[_state.Broadcast] = None
        self._tensors: List[torch.Tensor] = []
        self._copy: List[torch.Tensor] = []
        self._kept = False  # the copy is this step's (since the last completed step)

    def broadcast(self, tensors: List[torch.Tensor]) -> None:
        """Rank 0's tensors into every rank's, then their copy unless this step has one (gradient accumulation's
        later forwards)."""
        hook = self.hook
        comm = None if hook.closed else hook._comms.get("host")
        if comm is None:
            raise RuntimeError(f"ddp_agent: {hook.name}'s host communicator is closed: no buffer broadcast")
        key = [t.data_ptr() for t in tensors]
        plan = self._plan
        if key != self._key or plan is None:
            plan = _state.Broadcast(tensors, comm, hook.rank == _ROOT)
            # A plan that packs tensors (odd sizes) or leaves some to torch
            # is made again each time: the source's packed bytes are the
            # step's.
            self._plan = None if plan.odd or plan.rest else plan
            if key != self._key:
                self._key, self._tensors, self._kept = key, tensors, False
                self._copy = [torch.empty_like(t) for t in tensors]
        with torch.no_grad():
            plan.run(_ROOT, hook.rank, step=hook.step, bucket=BUFFERS_BUCKET)
            if not self._kept:
                for c, t in zip(self._copy, tensors):
                    c.copy_(t)
                self._kept = True

    def step_completed(self) -> None:
        self._kept = False

    def restore(self) -> bool:
        """Puts back the copy of the failed step's start, if it has one; returns whether it did."""
        if not self._kept:
            return False
        with torch.no_grad():
            for t, c in zip(self._tensors, self._copy):
                t.copy_(c)
        self._kept = False
        return True


def install(ddp: Any, hook: Any) -> Optional[Buffers]:
    """Registers the shim's buffer broadcast on ddp where it can take DDP's; returns its state, or None.

    It can where ddp broadcasts buffers (``broadcast_buffers``), has some,
    all on the CPU, no buffer hook of its own, and hook's host communicator
    is open. Elsewhere DDP's broadcast stays (CUDA buffers: NCCL's).
    """
    if hook is None or getattr(hook, "_comms", None) is None or hook._comms.get("host") is None:
        return None
    if not callable(getattr(ddp, "_register_buffer_comm_hook", None)) or hasattr(ddp, "buffer_hook"):
        return None
    if not getattr(ddp, "broadcast_buffers", False):
        return False
    buffers = list(ddp.module.buffers())
    if not buffers or any(b.device.type != "cpu" for b in buffers):
        return None
    if getattr(getattr(ddp, "_join_config", None), "enable", False):
        return None  # DDP's join picks another authoritative rank, through a collective of its own
    from torch.nn.parallel.distributed import _BufferCommHookLocation

    state = Buffers(hook)
    ddp._register_buffer_comm_hook(state, _broadcast, _BufferCommHookLocation.PRE_FORWARD)
    return state


def _broadcast(state: Buffers, buffers: Dict[str, torch.Tensor]) -> None:
    """The buffer hook, before the forward: returns None, the broadcast completed (DDP waits for nothing)."""
    state.broadcast(list(buffers.values()))
