"""The launcher thread: issues NCCL buckets in order, off the autograd thread.

DDP calls the hook on the autograd thread, between the launches of
backward's kernels; every microsecond the hook holds that thread is a
microsecond backward's kernels are not being launched, and on a GPU where the
host sets the pace that is step time. With register(launch="thread") the
autograd thread only records where the bucket's gradients end on its stream
(one event), makes the Future and queues the bucket here; this thread makes
the comm stream wait for that event, has the shim enqueue the all-reduce and
completes the Future. Buckets are issued in the order DDP handed them over,
on every rank, as NCCL needs.

A failure here fails the bucket's Future and is the hook's failure: the next
hook call raises it (the hook refuses NCCL buckets after a failure), and the
hook call for a step's last bucket first waits until every bucket before it
has been issued and raises the failure, so that backward raises the shim's
error rather than DDP's reducer failing to read the Future.
"""

import logging
import queue
import threading
from typing import Callable, Optional

log = logging.getLogger("ddp_agent")


class Launcher:
    """One thread per hook that runs queued jobs in order; jobs catch their own errors."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: "queue.SimpleQueue[Optional[Callable[[], None]]]" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        # Jobs queued and jobs finished: one writer each (the hook's thread,
        # the launcher), so submit takes no lock; a drain waits on _cond.
        self._issued = 0
        self._done = 0
        self._draining = False
        self._cond = threading.Condition()

    def submit(self, job: Callable[[], None]) -> None:
        """Queues job; starts the thread at the first one. Does not block."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"ddp_agent-launcher-{self._name}", daemon=True)
            self._thread.start()
        self._issued += 1
        self._queue.put(job)

    def drain(self, timeout_s: float) -> bool:
        """Blocks until every queued job has run, at most timeout_s; returns whether they all have.

        Called by the thread that submits, so no job is queued meanwhile.
        """
        target = self._issued
        with self._cond:
            self._draining = True
            try:
                return self._cond.wait_for(lambda: self._done >= target, timeout_s)
            finally:
                self._draining = False

    def stop(self, timeout_s: float) -> None:
        """Lets the queued jobs run and stops the thread; blocks at most timeout_s."""
        thread = self._thread
        if thread is None:
            return
        self._queue.put(None)
        thread.join(timeout_s)
        if thread.is_alive():
            log.error("ddp_agent: launcher of %s still busy at close after %.0fs", self._name, timeout_s)

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                job()
            except BaseException:  # a job catches its own errors; this is a bug, not a bucket's failure
                log.exception("ddp_agent: launcher of %s: job raised", self._name)
            finally:
                self._done += 1
                if self._draining:  # set under _cond before the drainer looks at _done
                    with self._cond:
                        self._cond.notify_all()
