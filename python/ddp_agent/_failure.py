"""The first failure of a hook: kept so that later buckets and the user can see it."""

import logging
from typing import Optional

log = logging.getLogger("ddp_agent")


class FirstError:
    """Holds the first failure of a collective or of opening a communicator.

    Every part of a hook records its failures here; only the first is kept
    (and logged). The NCCL transport reads it to refuse later buckets, since
    NCCL's ranks are out of step after a failure. Written by the training
    thread and the waiter thread; a lost race only changes which of two
    simultaneous failures is kept.
    """

    def __init__(self, name: str, rank: int) -> None:
        self.name = name
        self.rank = rank
        self.error: Optional[BaseException] = None

    def record(self, err: BaseException) -> None:
        """Keeps err if it is the first failure, and logs it."""
        if self.error is None:
            self.error = err
            log.error("ddp_agent: %s failed on rank %d: %s", self.name, self.rank, err)
