"""pytest configuration for the ddp_agent suite.

Run from the repository root:

    make build
    DDP_AGENT_SHIM=bin/libddpshim.so /usr/bin/python3 -m pytest -q python/tests

$DDP_AGENT_SHIM defaults to <root>/bin/libddpshim.so (made absolute, since
workers run in other directories); the in-tree package (python/) comes first
on sys.path and on the workers' PYTHONPATH.
"""

import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYTHON_DIR = ROOT / "python"


def pytest_configure(config: pytest.Config) -> None:
    shim = os.environ.get("DDP_AGENT_SHIM") or str(ROOT / "bin" / "libddpshim.so")
    shim = os.path.abspath(shim)
    if not os.path.isfile(shim):
        raise pytest.UsageError(
            f"libddpshim.so not found at {shim} (from $DDP_AGENT_SHIM or <repo>/bin): "
            f"run `make build` in {ROOT} first"
        )
    os.environ["DDP_AGENT_SHIM"] = shim
    if str(PYTHON_DIR) not in sys.path:
        sys.path.insert(0, str(PYTHON_DIR))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(PYTHON_DIR), os.environ.get("PYTHONPATH", "")) if p)
