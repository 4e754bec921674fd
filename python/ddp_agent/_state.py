"""Moving the model's and optimizer's state from a healthy rank to the others, for a re-formation in process.

The state goes through the new hook's host communicator when there is one
(CPU tensors, the shim's host transport): one broadcast from the source
(ddpshim_broadcast) of every tensor whose bytes are whole 4-byte words,
each straight from the source's memory into the others', and of one buffer
that packs the rest (bools, odd counts of 1- and 2-byte elements). Over
shared memory a receiver reads the source's tensors once, straight from
its memory (a system call per 4 MiB), while the source writes a share of
them into the receivers. Without that communicator (CUDA tensors, a
hook-less wrap), and for tensors that are not contiguous,
torch.distributed's broadcast does it.

The state went through all-reduces before (the source's values against the
receivers' negative zeros, the identity of IEEE addition), one per tensor:
every byte was read and written twice after the receivers had filled their
buffers, and each collective paid a round of the ranks' synchronisation.
docs/in-process.md has the figures.
"""

import time
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from . import _shim

# The bucket that labels the state's broadcast in ddp-agent's telemetry: no
# DDP bucket has that index, so it never takes a gradient collective's key,
# and the agent counts no training step for it (telemetry.StateBucket).
STATE_BUCKET = 2**31 - 1


def move(tensors: List[torch.Tensor], src: int, rank: int, comm: Optional[_shim.Comm], *,
         label_step: int) -> Tuple[int, float]:
    """Makes every rank's tensors the source's; returns the bytes moved and the milliseconds it took.

    Every rank passes its tensors in the same order, shapes and dtypes
    (the layout the source published). label_step is the step the
    broadcast carries in the agent's telemetry.
    """
    b = Broadcast(tensors, comm, rank == src)
    if comm is not None:
        # Every rank ready, its buffers listed and the source's odd
        # tensors packed, before the clock starts (the ranks wait for each
        # other here anyway), and the communicator's first collective (its
        # setup) paid: the time is the move's.
        _meet(comm, label_step)
    t0 = time.monotonic()
    b.run(src, rank, step=label_step, bucket=STATE_BUCKET)
    return b.nbytes, round((time.monotonic() - t0) * 1e3, 1)


class Broadcast:
    """A broadcast of tensors from one rank, prepared: one collective of the shim for what it can take.

    comm's broadcast takes every CPU tensor whose bytes are whole 4-byte
    words, each in place, and one buffer that packs the rest (packed here
    on the source); CUDA tensors, tensors that are not contiguous, and all
    of them without comm go through torch.distributed's broadcast, one
    each. A tensor listed twice (a tied weight) goes once.
    """

    def __init__(self, tensors: List[torch.Tensor], comm: Optional[_shim.Comm], source: bool) -> None:
        self.comm = comm
        self.whole: List[torch.Tensor] = []
        self.odd: List[torch.Tensor] = []
        self.rest: List[torch.Tensor] = []
        self.nbytes = 0
        seen = set()
        for t in tensors:
            alias = (t.data_ptr(), t.numel(), t.dtype)
            if alias in seen:
                continue
            seen.add(alias)
            nbytes = t.numel() * t.element_size()
            self.nbytes += nbytes
            if comm is None or t.device.type != "cpu" or not t.is_contiguous():
                self.rest.append(t)
            elif nbytes % 4:
                # Packed: the broadcast counts 4-byte words. Small tensors were
                # packed too while each tensor was a collective of its own; as
                # entries of one broadcast they cost nothing to send, and
                # unpacking train.py's ten took 0.2 ms of a 1.5 ms move.
                self.odd.append(t)
            else:
                self.whole.append(t)
        self.packed = _pack(self.odd, source) if comm is not None else None
        words = self.whole + [self.packed] if self.odd else self.whole
        self._ptrs = [t.data_ptr() for t in words]
        self._counts = [t.numel() * t.element_size() // 4 for t in words]

    def run(self, src: int, rank: int, *, step: int, bucket: int) -> None:
        """Broadcasts from src (the same call on every rank); step and bucket label the shim's collective.

        Raises the shim's error when a rank fails or aborts meanwhile.
        """
        if self.comm is not None and self.packed is not None:
            if self._ptrs:
                work = self.comm.broadcast(self._ptrs, self._counts, _shim.DType.INT32, src, step=step, bucket=bucket)
                try:
                    work.wait()
                finally:
                    work.free()
            if rank != src:
                _unpack(self.packed, self.odd)
        for t in self.rest:
            _broadcast(t, src)


def _meet(comm: _shim.Comm, label_step: int) -> None:
    """Waits for every rank of comm (a one-element all-reduce)."""
    one = torch.zeros(1)
    work = comm.allreduce(one.data_ptr(), 1, _shim.DType.FLOAT32, _shim.Op.SUM, step=label_step, bucket=STATE_BUCKET)
    try:
        work.wait()
    finally:
        work.free()


def warm() -> None:
    """Runs move's local part once on small tensors, before a re-formation needs it (InProcess, a warm spare).

    A process's first use of each of torch's operations costs more than
    the operation: packing and unpacking train.py's 31 KB of small tensors
    (packed then) took 0.4 ms the first time and 0.03 ms the third, on the
    2-core VM.
    """
    tensors = [torch.zeros(3), torch.zeros(2, dtype=torch.int64), torch.zeros((), dtype=torch.bool)]
    _unpack(_pack(tensors, False), tensors)
    _pack(tensors, True)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """t's bytes as a flat uint8 view (t contiguous)."""
    return t.reshape(-1).view(torch.uint8)


def _pack(tensors: List[torch.Tensor], source: bool) -> torch.Tensor:
    """One buffer of whole 4-byte words for tensors' bytes: filled with them on the source, empty elsewhere."""
    size = sum(t.numel() * t.element_size() for t in tensors)
    if not source:
        return torch.empty(size + -size % 4, dtype=torch.uint8)
    return torch.cat([_bytes(t) for t in tensors] + [torch.zeros(-size % 4, dtype=torch.uint8)])


def _unpack(packed: torch.Tensor, tensors: List[torch.Tensor]) -> None:
    """Copies _pack's buffer back into tensors."""
    offset = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        _bytes(t).copy_(packed[offset:offset + n])
        offset += n


def _broadcast(t: torch.Tensor, src: int) -> None:
    """torch.distributed's broadcast of t, a bool tensor's too (gloo has no bool: its bytes go)."""
    if t.dtype != torch.bool:
        dist.broadcast(t, src)
        return
    raw = t.contiguous().view(torch.uint8)
    dist.broadcast(raw, src)
    if raw.data_ptr() != t.data_ptr():
        t.copy_(raw.view(torch.bool))


def optimizer_layout(optimizer: Any) -> Dict[str, Any]:
    """The optimizer's state as the source has it: which tensors, and every other value."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    tensors, values = [], []
    for i, p in enumerate(params):
        for k, v in sorted(optimizer.state.get(p, {}).items()):
            if isinstance(v, torch.Tensor):
                tensors.append((i, k, tuple(v.shape), v.dtype))
            else:
                values.append((i, k, v))
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    return {"tensors": tensors, "values": values, "groups": groups}


def apply_layout(optimizer: Any, layout: Dict[str, Any]) -> None:
    """Gives this rank's optimizer the source's layout: the tensors to receive into, the other values."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for g, saved in zip(optimizer.param_groups, layout["groups"]):
        g.update(saved)
    state: Dict[Any, Dict[str, Any]] = {}
    for i, k, shape, dtype in layout["tensors"]:
        old = optimizer.state.get(params[i], {}).get(k)
        ok = isinstance(old, torch.Tensor) and tuple(old.shape) == shape and old.dtype == dtype
        # Zeros, as torch's optimizers make their state (zeros_like, clone):
        # the pages are this process's before the move writes them. Left
        # empty, they faulted in during the broadcast, one at a time: 2 ms
        # of a 4.2 MB move on the 2-core VM, three times the copy itself.
        state.setdefault(params[i], {})[k] = old if ok else torch.zeros(shape, dtype=dtype, device=params[i].device)
    for i, k, v in layout["values"]:
        state.setdefault(params[i], {})[k] = v
    optimizer.state.clear()
    optimizer.state.update(state)
