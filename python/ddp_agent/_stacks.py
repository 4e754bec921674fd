"""Python stacks on request, for the agent's hang reports.

Under ``ddp-agent run`` each worker gets ``$DDP_AGENT_STACK_DIR``; beside a
``ddp-agent sidecar``, the directory is the job's under the sidecar's socket
(``_sidecar.stack_dir``). When a
collective hangs, the agent wants to show where the ranks that never
arrived are stuck, so :func:`enable` (called by ``register``) registers
:mod:`faulthandler` on SIGUSR2 to write every thread's stack into
``$DDP_AGENT_STACK_DIR/rank<RANK>-pid<PID>.txt``. The file exists from then on: it
tells the agent that the signal is safe to send (SIGUSR2's default action
would kill the process).
"""

import faulthandler
import logging
import os
import signal
import threading
from typing import IO, Optional

from . import _env
from . import _sidecar

ENV_STACK_DIR = _env.STACK_DIR
STACK_SIGNAL = signal.SIGUSR2

_lock = threading.Lock()
_file: Optional[IO[str]] = None  # kept open: faulthandler writes to its descriptor from the signal handler
_path: Optional[str] = None
_warned_signal = False


def _warn_signal_taken(handler: object) -> None:
    global _warned_signal
    _warned_signal = True
    logging.getLogger("ddp_agent").warning(
        "no Python stacks for hang reports: SIGUSR2 has the application's handler (%r)", handler
    )


def enable() -> Optional[str]:
    """Registers the stack dump when running under ddp-agent or beside its sidecar; returns the file's path, or None."""
    global _file, _path
    directory = os.environ.get(ENV_STACK_DIR)
    if not directory:
        sock = _sidecar.find()
        directory = _sidecar.stack_dir(sock) if sock else None
    rank = _sidecar.rank()  # RANK, or srun's SLURM_PROCID
    if not directory or rank is None:
        return None
    current = signal.getsignal(STACK_SIGNAL)
    if callable(current) or current == signal.SIG_IGN:
        # The application's own (a scheduler's preemption notice, say):
        # replacing it would break the application; chaining would run it
        # whenever the agent asks for a stack.
        if not _warned_signal:
            _warn_signal_taken(current)
        return None
    # Named after this process: the agent signals exactly the process that
    # registered (a wrapper script's child, say), after checking it is one
    # of the rank's worker processes.
    path = os.path.join(directory, f"rank{rank}-pid{os.getpid()}.txt")
    with _lock:
        if _path == path:
            return path
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            # Registered on a temporary name, renamed after: the file
            # exists only once the signal is safe to send.
            f = open(path + ".tmp", "w")
            faulthandler.register(STACK_SIGNAL, file=f, all_threads=True, chain=False)
            os.rename(path + ".tmp", path)
        except OSError as e:  # a diagnostic aid must never stop training
            logging.getLogger("ddp_agent").warning("no Python stacks for hang reports: %s", e)
            return None
        if _file is not None:
            _file.close()
        _file, _path = f, path
    return path
