"""The ``ddp-agent`` console command of an installed wheel.

The wheel carries the Go binary next to this package (with
``ddp-agent-plugins`` and ``libddpshim.so``, as ``make build`` lays out
``bin/``); this entry point replaces itself with it (``execv``: the same pid,
so Slurm's and Kubernetes' signals reach the agent itself). Its one addition:
``--python`` defaults to the interpreter this command was installed with
(through ``DDP_AGENT_PYTHON``), not the first ``python3`` on ``PATH``, which
on a machine with pyenv or conda is often one without torch or this package.
An explicit ``--python``, ``DDP_AGENT_PYTHON`` or ``PYTHON_EXEC`` still wins.

It imports no more than it needs (no torch, not even pathlib), so that it
works where torch is absent and adds milliseconds to the binary's start.
"""

import os
import sys

from . import _env

BINARY = "ddp-agent"


def binary_path() -> str:
    """The bundled ddp-agent binary."""
    return os.path.join(os.path.dirname(os.path.realpath(__file__)), BINARY)


def environ(env, python: str) -> dict:
    """env with DDP_AGENT_PYTHON defaulted to python, unless a choice is made already."""
    out = dict(env)
    if not out.get(_env.PYTHON) and not out.get("PYTHON_EXEC"):
        out[_env.PYTHON] = python
    return out


def main() -> None:
    exe = binary_path()
    if not os.access(exe, os.X_OK):
        sys.exit(
            f"ddp-agent: {exe} is missing or not executable: this install of the ddp_agent package "
            "has no agent binary (build the wheel with `make wheel`, or `make build` before `pip install ./python`)"
        )
    os.execve(exe, [BINARY] + sys.argv[1:], environ(os.environ, sys.executable))
