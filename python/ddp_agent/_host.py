"""CPU buckets through the shim's host transport: started without blocking, completed by the waiter."""

import functools
from typing import Optional

import torch

from . import _buckets
from ._bootstrap import Communicators
from ._failure import FirstError
from ._shim import ShimError, Status
from ._waiter import Waiter


class HostTransport:
    """All-reduces CPU buckets with the shim's non-blocking all-reduce on its host communicator."""

    def __init__(self, comms: Communicators, failure: FirstError, compression: Optional[str]) -> None:
        self._comms = comms
        self._failure = failure
        self._compression = compression
        self._waiter = Waiter(comms.name, failure)

    def allreduce(self, buf: torch.Tensor, step: int, index: int) -> torch.futures.Future:
        """Starts the all-reduce of buf and returns its Future.

        Blocks only at the first bucket, to open the communicator. Raises
        ShimError when the shim refuses the work (e.g. ABORTED after an
        earlier failure); a failure later fails the Future.
        """
        self._comms.check_open()
        _buckets.check(buf, index)
        comm = self._comms.get("host") or self._comms.open("host", first=(step, index))
        tensor, op = _buckets.prepare(buf, self._comms.world_size, self._compression, avg=True)
        dtype, count = _buckets.shim_count(tensor)
        try:
            work = comm.allreduce(tensor.data_ptr(), count, dtype, op, step=step, bucket=index)
        except ShimError as e:  # e.g. ABORTED: an earlier failure, a peer gone, the agent's Abort
            self._failure.record(e)
            raise
        fut: torch.futures.Future = torch.futures.Future()
        # A Future completed by set_exception holds the exception as its
        # value; DDP's reducer would fail to read it as a tensor, with a
        # message that hides ours. then() turns it into a real error whose
        # message carries the ShimError's. Chained before the waiter is
        # woken: then() drops the GIL, and a waiter just woken would take it.
        result = fut.then(_value)
        with self._comms.lock:  # against a concurrent close(): queued before its sentinel, or not at all
            if self._comms.closed:
                work.free()
                raise ShimError(Status.CLOSED, f"ddp_agent hook {self._comms.name} was closed", "ddp_agent hook")
            self._waiter.submit(work, buf, tensor, fut)
        return result

    def stop(self, at_exit: bool) -> None:
        """Waits for the all-reduces in flight (aborting them at exit) and stops the waiter.

        Blocks up to the timeout plus 5 s; a waiter still stuck then has its
        communicator aborted.
        """
        abort = functools.partial(self._comms.abort, "host") if self._comms.get("host") is not None else None
        self._waiter.stop(self._comms.timeout_ms / 1000 + 5, abort, at_exit)


def _value(fut: torch.futures.Future) -> torch.Tensor:
    return fut.value()  # raises the ShimError given to set_exception
