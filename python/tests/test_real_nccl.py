"""ddp_agent.info(transport="nccl") in the torch 2 virtual environment, on the real NCCL wheel.

The environment ($DDP_AGENT_TORCH2_PYTHON, default
~/.cache/ddp-agent/torch2-venv/bin/python) has PyTorch's CUDA build and
nvidia-nccl-cu12; no device is needed to load NCCL and read its version.
The shim must report the version of the wheel's nccl.h (info imports torch,
whose NCCL the shim then finds as libnccl.so.2; $DDP_AGENT_NCCL_LIB names
the same library as the last resort). Skipped
without that environment unless $DDP_AGENT_REQUIRE_NCCL is set.
"""

import json
import os
import pathlib
import re
import subprocess

import pytest

from test_gpu_check import _torch2_python

PROBE = """
import json
import ddp_agent
print(json.dumps(ddp_agent.info(transport="nccl")["nccl"]))
"""


def _venv_nccl(python: str) -> pathlib.Path:
    out = subprocess.run([python, "-c", "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) "
                          "if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])"],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        pytest.fail(f"{python}: no nvidia.nccl: {out.stderr[-300:]}")
    return pathlib.Path(out.stdout.strip())


@pytest.fixture(scope="module")
def venv() -> str:
    python = _torch2_python()
    if not os.access(python, os.X_OK):
        if os.environ.get("DDP_AGENT_REQUIRE_NCCL"):
            pytest.fail(f"no torch 2 venv at {python} and DDP_AGENT_REQUIRE_NCCL is set")
        pytest.skip(f"no torch 2 venv at {python} (set DDP_AGENT_TORCH2_PYTHON)")
    return python


def test_info_reports_real_version(venv: str) -> None:
    nccl_dir = _venv_nccl(venv)
    lib = nccl_dir / "lib" / "libnccl.so.2"
    m = re.search(r"^#define NCCL_VERSION_CODE (\d+)", (nccl_dir / "include" / "nccl.h").read_text(), re.M)
    code = int(m.group(1))
    want = f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    env = dict(os.environ, DDP_AGENT_NCCL_LIB=str(lib))
    env.pop("LD_LIBRARY_PATH", None)
    r = subprocess.run([venv, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info.get("found"), info
    assert info["version"] == want, info
    assert info["source"] in ("process", "libnccl.so.2", str(lib)), info
