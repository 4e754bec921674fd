"""End-to-end tests: the real ddp-agent binary (and torchrun) with real Python workers.

Every process runs in its own session with a timeout; on timeout the whole
session is SIGKILLed (ddp-agent's workers, which lead their own process
groups, die with the agent through PR_SET_PDEATHSIG).

    make build && /usr/bin/python3 -m pytest python/tests/e2e

DDP_AGENT_BIN overrides <repo>/bin/ddp-agent; DDP_AGENT_PYTHON the workers'
interpreter (default /usr/bin/python3); DDP_AGENT_TORCHRUN_COMPAT the torchrun
wrapper (default <repo>/scripts/torchrun_compat.py).
"""

import os
import subprocess

import pytest

from e2e_helpers import REPO


@pytest.fixture(scope="session")
def python():
    py = os.environ.get("DDP_AGENT_PYTHON", "/usr/bin/python3")
    if subprocess.run([py, "-c", "import torch"], capture_output=True, timeout=120).returncode != 0:
        pytest.fail("%s cannot import torch (apt-get install python3-torch, or set DDP_AGENT_PYTHON)" % py)
    return py


@pytest.fixture(scope="session")
def agent_bin():
    path = os.environ.get("DDP_AGENT_BIN") or os.path.join(REPO, "bin", "ddp-agent")
    if not os.access(path, os.X_OK):
        pytest.fail("%s not found: run make build (or set DDP_AGENT_BIN)" % path)
    return path


@pytest.fixture(scope="session")
def shim_path(agent_bin):
    """libddpshim.so: DDP_AGENT_SHIM, else next to ddp-agent (as make build lays them out)."""
    for path in (os.environ.get("DDP_AGENT_SHIM"), os.path.join(os.path.dirname(agent_bin), "libddpshim.so"),
                 os.path.join(REPO, "python", "ddp_agent", "libddpshim.so")):
        if path and os.path.exists(path):
            return os.path.abspath(path)
    pytest.fail("libddpshim.so not found next to %s: run make build (or set DDP_AGENT_SHIM)" % agent_bin)


@pytest.fixture(scope="session")
def torchrun_compat():
    path = os.environ.get("DDP_AGENT_TORCHRUN_COMPAT") or os.path.join(REPO, "scripts", "torchrun_compat.py")
    if not os.path.exists(path):
        pytest.fail("torchrun wrapper %s not found (set DDP_AGENT_TORCHRUN_COMPAT)" % path)
    return os.path.abspath(path)
