"""examples/gpu_check.sh without a GPU: the dry run, a bad argument, and the skip path.

So that a lent GPU's minutes go to the GPU rather than to a typo: the script
parses its arguments, imports everything its checks import, loads the shim
and asks it for NCCL, under this interpreter (Debian's torch 1.13) and, when
present, the torch 2 virtual environment ($DDP_AGENT_TORCH2_PYTHON, default
~/.cache/ddp-agent/torch2-venv/bin/python, with the real NCCL wheel).
"""

import os
import pathlib
import subprocess
import sys
from typing import List

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "gpu_check.sh"


def _torch2_python() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.environ.get("DDP_AGENT_TORCH2_PYTHON") or os.path.join(cache, "ddp-agent", "torch2-venv", "bin", "python")


def _pythons() -> List[pytest.param]:
    out = [pytest.param(sys.executable, id="this-python")]
    t2 = _torch2_python()
    if os.path.abspath(t2) == os.path.abspath(sys.executable):
        return out  # the torch 2 pass: this-python is the venv
    out.append(pytest.param(t2, id="torch2-venv", marks=pytest.mark.skipif(
        not os.access(t2, os.X_OK), reason=f"no torch 2 venv at {t2} (set DDP_AGENT_TORCH2_PYTHON)")))
    return out


def _run(python: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=python)
    env.pop("MASTER_PORT", None)
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("python", _pythons())
def test_dry_run(python: str) -> None:
    r = _run(python, "--dry-run", "--only", "parity-fp32,overlap", "--steps", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gpu_check: would run: parity-fp32, overlap (steps 3," in r.stdout, r.stdout
    assert "gpu_check.sh: dry run passed" in r.stdout, r.stdout
    assert "ddpshim" in r.stdout  # the shim loaded and told its version


@pytest.mark.parametrize("python", _pythons())
def test_bad_argument(python: str) -> None:
    r = _run(python, "--dry-run", "--only", "parity-fp32,no-such-check")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "unknown check(s) no-such-check; known: nccl-one-rank," in r.stderr, r.stderr


@pytest.mark.parametrize("python", _pythons())
def test_no_device(python: str) -> None:
    probe = subprocess.run([python, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=120)
    if probe.stdout.strip() != "False":
        pytest.skip(f"a CUDA device is present (or torch fails): {probe.stdout.strip()} {probe.stderr[-200:]}")
    r = _run(python, "--only", "nccl-one-rank")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("gpu_check: no CUDA device")]
    assert len(lines) == 1, r.stderr
