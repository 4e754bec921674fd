"""`pip install --no-build-isolation ./python` works offline, and the installed package finds its bundled library.

Needs pip, setuptools and wheel for /usr/bin/python3 (Debian 12: python3-pip,
which pulls in python3-setuptools and python3-wheel). The venv is made
--without-pip and uses the system's pip through --system-site-packages, so
python3-venv (ensurepip) is not needed. Run from a venv (the PyTorch 2.x one
that scripts/deps.sh torch2 makes), the new venv sees that venv's packages
too, so it imports the same torch. Without pip, setuptools or wheel the test
is skipped, unless $DDP_AGENT_REQUIRE_TORCH is set (as under `make test`):
then it fails.
"""

import os
import pathlib
import shutil
import site
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYTHON_DIR = ROOT / "python"
DEBIAN_PACKAGES = "python3-pip python3-setuptools python3-wheel"


def missing_tools() -> str:
    """Returns what is missing to build and install the package, or ""."""
    for module, what in (("pip", "pip"), ("venv", "venv"), ("setuptools", "setuptools"), ("wheel", "wheel")):
        r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True)
        if r.returncode != 0:
            return what
    return ""


def install_hint() -> str:
    if sys.prefix != sys.base_prefix:
        return f"{sys.executable} -m pip install pip setuptools wheel (or: scripts/deps.sh torch2)"
    return f"apt-get install -y {DEBIAN_PACKAGES}"


def see_outer_venv(venv: pathlib.Path) -> None:
    """Makes venv see the packages of the venv this test runs in, if it runs in one.

    `python -m venv --system-site-packages` from a venv bases the new one on
    the base interpreter, whose site-packages hold another torch (Debian's)
    or none; a .pth file adds this venv's site-packages after the new venv's own.
    """
    if sys.prefix == sys.base_prefix:
        return
    inner = next((venv / "lib").glob("python3*/site-packages"))
    (inner / "outer-venv.pth").write_text("".join(p + "\n" for p in site.getsitepackages()))


def run(cmd, **kwargs) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kwargs)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r


def test_pip_install_offline(tmp_path):
    missing = missing_tools()
    if missing:
        msg = f"{sys.executable} has no {missing}: {install_hint()}"
        if os.environ.get("DDP_AGENT_REQUIRE_TORCH"):
            pytest.fail(msg)
        pytest.skip(msg)

    # A copy of python/ with the library bundled, as `make build` leaves it;
    # building from a copy keeps pip's build/ and egg-info out of the tree.
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(PYTHON_DIR / "pyproject.toml", src)
    shutil.copytree(PYTHON_DIR / "ddp_agent", src / "ddp_agent", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(os.environ["DDP_AGENT_SHIM"], src / "ddp_agent" / "libddpshim.so")

    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("DDP_AGENT_SHIM", "PYTHONPATH", "PIP_INDEX_URL")}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], env=env)
    see_outer_venv(venv)
    py = venv / "bin" / "python"
    run([str(py), "-m", "pip", "install", "--no-build-isolation", "--no-index", str(src)], env=env, cwd=tmp_path)

    out = tmp_path / "elsewhere"
    out.mkdir()
    code = (
        "import ddp_agent, torch\n"
        "print(ddp_agent.__file__)\n"
        "print(ddp_agent.shim_path())\n"
        "print(ddp_agent.shim_version())\n"
        "print(ddp_agent.__version__)\n"
    )
    code += "print(torch.__file__)\n"
    r = run([str(py), "-c", code], env=env, cwd=out)
    module, shim, version, pkg_version, torch_file = r.stdout.splitlines()
    import torch

    assert torch_file == torch.__file__, f"the venv imported {torch_file}, not {torch.__file__}"
    site = venv / "lib"
    assert pathlib.Path(module).is_relative_to(site), f"imported {module}, not the installed copy"
    assert pathlib.Path(shim) == pathlib.Path(module).parent / "libddpshim.so"
    assert version.startswith("ddpshim "), version
    r = run([str(py), "-m", "pip", "show", "ddp-agent"], env=env)
    assert f"Version: {pkg_version}" in r.stdout, r.stdout
