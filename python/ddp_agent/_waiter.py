"""The waiter thread: completes the host all-reduces' Futures in issue order, failures included."""

import logging
import queue
import threading
from typing import Callable, Optional

import torch

from . import _shim
from ._failure import FirstError
from ._shim import ShimError

log = logging.getLogger("ddp_agent")


class Waiter:
    """One thread per hook that blocks in the shim (GIL released) on each host all-reduce in turn.

    A failed all-reduce fails its Future (never leaves it hanging) and is
    recorded as the hook's failure. The thread starts at the first
    :meth:`submit` and runs until :meth:`stop`.
    """

    def __init__(self, name: str, failure: FirstError) -> None:
        self._name = name
        self._failure = failure
        self._queue: "queue.SimpleQueue[Optional[tuple]]" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        # Host all-reduces queued and completed; one writer each (the hook's
        # thread, the waiter), so their difference is what is in flight.
        self._issued = 0
        self._completed = 0

    def submit(self, work: _shim.Work, buf: torch.Tensor, tensor: torch.Tensor, fut: torch.futures.Future) -> None:
        """Queues work; fut gets buf once it is done (tensor copied back into buf when it is not buf).

        Called with the communicators' lock held, so that stop() finds every
        submitted work ahead of its sentinel.
        """
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"ddp_agent-waiter-{self._name}", daemon=True)
            self._thread.start()
        self._issued += 1
        # buf and tensor stay referenced until the work is done
        self._queue.put((work, buf, tensor, fut))

    def stop(self, join_s: float, abort: Optional[Callable[[str], None]], at_exit: bool) -> None:
        """Waits for the queued work and stops the thread; blocks up to join_s (+5 s after an abort).

        abort (None without a communicator to abort) unblocks a waiter still
        stuck after join_s; at exit it is called first when work is in
        flight, since the peers may never answer.
        """
        thread = self._thread
        if thread is None:
            return
        in_flight = self._issued - self._completed
        if at_exit and in_flight and abort is not None:
            log.warning("ddp_agent: %s: exiting with %d all-reduces in flight; aborting", self._name, in_flight)
            abort("the process is exiting")
        self._queue.put(None)
        thread.join(join_s)
        if thread.is_alive() and abort is not None:
            log.error("ddp_agent: waiter of %s still blocked at close; aborting the communicator", self._name)
            abort("ddp_agent hook closed with work in flight")
            thread.join(5)

    def _loop(self) -> None:
        """Completes the host Futures in issue order; runs on the waiter thread until stop()."""
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
                self._failure.record(err)
                fut.set_exception(err)
            else:
                fut.set_result(buf)
            del item, work, buf, tensor, fut
