"""A warm spare: a process ddp-agent keeps beside the workers to take a dead rank's place.

``ddp-agent run --spares N`` starts ``python -u -m ddp_agent._spare
SCRIPT ARGS...`` (``-m MODULE ARGS...`` for a module) on each node, N times,
with a worker's environment less the variables of a rank. It pays now what
a new worker would pay after a fault: the interpreter, torch, this package,
and the modules the script imports at its top level (the script itself does
not run). Then it waits on the pipe named by ``$DDP_AGENT_SPARE_FD``.

With ``$DDP_AGENT_JOIN`` set instead, the process is a new worker that
already has its rank: the other nodes' workers carry on in process from the
last generation (a node joined or was lost), and it joins their
re-formation at once, as a spare given that rank would.

When a worker dies, the agent writes one JSON line there: the rank and the
variables that make it that rank. The spare sets them, arranges for the
script's ``init_process_group`` to join the survivors' re-formation
(``inprocess._expect_join``) and runs the script as ``__main__``, which
reaches ``ddp_agent.InProcess`` and trains from the step the others retry.
The agent also starts its node's first workers this way, warm before the
node joins the rendezvous (``$DDP_AGENT_SPARE_READY_FD``: one byte written
there says the imports are done): their line's ``mode`` is ``"start"`` (the
script runs as under torchrun) or ``"join"`` (as with ``$DDP_AGENT_JOIN``).
Where the node that served the workers' store was lost and this node
serves the next one, the line is ``{"store": {"addr": ..., "port": ...}}``
instead: the spare serves the store (``_store.serve``).
The end of the pipe without a line means the spare is not needed: it exits 0.
"""

import ast
import importlib
import importlib.util
import json
import os
import runpy
import sys
import time
from typing import List, Optional, Tuple

from . import _env


def _target(argv: List[str]) -> Tuple[bool, str, List[str]]:
    """(is a module, script or module name, its arguments) from the spare's argv."""
    if not argv or argv == ["-m"]:
        raise SystemExit("ddp_agent._spare: usage: python -m ddp_agent._spare SCRIPT [ARGS...] | -m MODULE [ARGS...]")
    if argv[0] == "-m":
        return True, argv[1], argv[2:]
    return False, argv[0], argv[1:]


def _source(module: bool, target: str) -> Optional[str]:
    """The file of the script or module, None when it has none (a namespace, a missing one)."""
    if not module:
        return target
    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.has_location else None


def _imports(path: str) -> List[str]:
    """The modules a script imports at its top level (in ``try`` blocks too), in order."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return []
    names: List[str] = []
    body = list(tree.body)
    while body:
        node = body.pop(0)
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Try):
            body[:0] = node.body
    return names


def _warm(path: Optional[str]) -> int:
    """Imports what the script imports; returns how many modules it could. A failing one fails later, in the script."""
    n = 0
    for name in _imports(path) if path else []:
        try:
            importlib.import_module(name)
            n += 1
        except Exception:  # the script meets it again, with its own handling
            pass
    return n


def _warm_torch() -> None:
    """Runs what a first training step imports on its way: torch 2.x imports torch._dynamo at the
    first optimizer (1.3 s of the 1.5 s a spare took to join, on the 2-core VM). On the CPU and
    with the RNG state restored; CUDA waits for the rank's device. Then the state move's own
    operations (_state.warm)."""
    import torch

    from . import _state

    with torch.random.fork_rng(devices=[]):
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.zeros(1, 2)).sum().backward()
        optimizer.step()
    _state.warm()


def main(argv: List[str]) -> None:
    t0 = time.monotonic()
    module, target, args = _target(argv)
    if not module:
        sys.path[0] = os.path.dirname(os.path.abspath(target))  # as `python SCRIPT` has it
    if os.environ.pop(_env.JOIN, None):  # a new worker, its rank given at start
        _run(module, target, args, new=True)
        return
    fd = int(os.environ.pop(_env.SPARE_FD))  # not for the script's own children
    ready = os.environ.pop(_env.SPARE_READY_FD, None)
    import torch  # the cost a new worker pays after a fault; this process pays it before

    from . import hook, inprocess  # noqa: F401

    _warm_torch()
    n = _warm(_source(module, target))
    print(f"ddp_agent: warm spare ready (pid {os.getpid()}): torch {torch.__version__} and {n} modules of "
          f"{target} imported in {time.monotonic() - t0:.2f} s", file=sys.stderr, flush=True)
    if ready is not None:  # the agent waits for this before its node joins the rendezvous
        with os.fdopen(int(ready), "wb") as f:
            f.write(b"r")
    with os.fdopen(fd, "rb") as f:
        line = f.readline()
    if not line:
        return  # the attempt ended without needing this spare
    assignment = json.loads(line)
    if "store" in assignment:  # the node serving the job's store was lost: this node serves the new one
        from . import _store

        print(f"ddp_agent: warm spare (pid {os.getpid()}) serves the job's store", file=sys.stderr, flush=True)
        _store.serve(str(assignment["store"]["addr"]), str(assignment["store"]["port"]))
        return
    os.environ.update({str(k): str(v) for k, v in assignment["env"].items()})
    mode = assignment.get("mode", "replace")
    print(f"ddp_agent: warm spare (pid {os.getpid()}) takes rank {assignment['rank']} "
          f"(local rank {assignment['local_rank']}{'' if mode == 'replace' else ', ' + mode})", file=sys.stderr, flush=True)
    # "start": the job's first workers, the script as torchrun runs it.
    _run(module, target, args, new=mode == "join", join=mode != "start")


def _run(module: bool, target: str, args: List[str], new: bool = False, join: bool = True) -> None:
    """Runs the script as ``__main__``; with join, its ``init_process_group`` joins the others' re-formation."""
    if join:
        from . import inprocess

        inprocess._expect_join(new=new)
    sys.argv = [target, *args]
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except Exception as e:
        _record(e)
        raise


def _record(err: Exception) -> None:
    """Writes err to ``$TORCHELASTIC_ERROR_FILE`` as torch's ``@record`` does, unless the script's own did.

    Called in the except clause (the traceback is the one being handled).
    The agent puts the file in its root-cause report, and takes it as the
    sign that a worker has raised and its exit follows: under load its
    interpreter's teardown takes seconds (a node that joins as the job
    ends, agent/latejoin.go). A script without ``@record`` writes none;
    run by a spare, it has the file all the same.
    """
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    try:
        ErrorHandler().record_exception(err)
    except OSError as e:  # the script's exception, not this, must be its last words
        print(f"ddp_agent: could not write the error file {path}: {e}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
