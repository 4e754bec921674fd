"""The job's TCPStore, served by a process ddp-agent keeps for it.

Without spares, rank 0's worker serves the workers' store at
MASTER_ADDR:MASTER_PORT (``TORCHELASTIC_USE_AGENT_STORE=False``, as with
plain ``env://``), and the store dies with rank 0. Under
``ddp-agent run --spares N`` the agent of node rank 0 starts
``python -m ddp_agent._store`` instead, and tells every worker
``TORCHELASTIC_USE_AGENT_STORE=True``, so that all of them, rank 0 too, are
clients: the survivors of rank 0's death re-form through the store, and a
warm spare takes rank 0 (docs/in-process.md).

Where the node serving the store is lost, the survivor that becomes node
rank 0 has one of its idle warm spares serve the new generation's store
(``serve``, from ``_spare``): it has imported torch, where this process
would first.

The store is torch's own ``TCPStore`` server, whatever wire protocol the
workers' torch speaks. The process serves it until the agent ends it with
the attempt (or dies: the process has the agent's parent-death signal):
one store per attempt, as torchrun 2.x's workers expect of an agent's
store.
"""

import os
import signal
import sys
from datetime import timedelta


def serve(addr: str, port: str) -> None:
    """Serves the job's store on port until the process ends; a bind that fails exits with why."""
    import torch.distributed as dist

    try:
        # The server listens on every address; addr is where its own
        # client part connects.
        store = dist.TCPStore(addr, int(port), None, True, timedelta(seconds=60), wait_for_workers=False)
    except Exception as e:  # noqa: BLE001 - a bind that failed says why, and the agent restarts the attempt
        raise SystemExit(f"ddp_agent._store: cannot serve the job's store on port {port}: {e}") from e
    print(f"ddp_agent: serving the job's store on port {port} (pid {os.getpid()})", file=sys.stderr, flush=True)
    while store is not None:  # SIGTERM's default action ends the process, and the store with it
        signal.pause()


def main() -> None:
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    if not addr or not port.isdigit():
        raise SystemExit(f"ddp_agent._store: MASTER_ADDR and MASTER_PORT must name the store, got {addr!r}:{port!r}")
    serve(addr, port)


if __name__ == "__main__":
    main()
