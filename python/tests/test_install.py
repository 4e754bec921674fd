"""`pip install --no-build-isolation ./python` works offline, the installed package finds its bundled library,
and the wheel's `ddp-agent` command runs a DDP job from a fresh venv with the venv's interpreter.

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
import statistics
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYTHON_DIR = ROOT / "python"
DEBIAN_PACKAGES = "python3-pip python3-setuptools python3-wheel"
BUNDLED = ("libddpshim.so", "ddp-agent", "ddp-agent-plugins")


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


def need_tools() -> None:
    missing = missing_tools()
    if missing:
        msg = f"{sys.executable} has no {missing}: {install_hint()}"
        if os.environ.get("DDP_AGENT_REQUIRE_TORCH"):
            pytest.fail(msg)
        pytest.skip(msg)


def source_copy(tmp_path: pathlib.Path) -> pathlib.Path:
    """A copy of python/ with the library and the agent's binaries bundled,
    as `make build` leaves it; building from a copy keeps pip's build/ and
    egg-info out of the tree. The binaries come from next to $DDP_AGENT_SHIM
    (bin/, where `make build` puts all three)."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(PYTHON_DIR / "pyproject.toml", src)
    shutil.copy(PYTHON_DIR / "setup.py", src)
    shutil.copytree(
        PYTHON_DIR / "ddp_agent", src / "ddp_agent", ignore=shutil.ignore_patterns("__pycache__", *BUNDLED)
    )
    bin_dir = pathlib.Path(os.environ["DDP_AGENT_SHIM"]).parent
    for name in BUNDLED:
        shutil.copy2(bin_dir / name, src / "ddp_agent" / name)
    return src


def clean_env() -> dict:
    """This environment without what points at the checkout or another index."""
    drop = ("DDP_AGENT_SHIM", "DDP_AGENT_PYTHON", "PYTHON_EXEC", "PYTHONPATH", "PIP_INDEX_URL")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def make_venv(venv: pathlib.Path, env: dict) -> pathlib.Path:
    """A fresh venv seeing this interpreter's torch; returns its python."""
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], env=env)
    see_outer_venv(venv)
    return venv / "bin" / "python"


def test_pip_install_offline(tmp_path):
    need_tools()
    src = source_copy(tmp_path)
    env = clean_env()
    py = make_venv(tmp_path / "venv", env)
    run([str(py), "-m", "pip", "install", "--no-build-isolation", "--no-index", str(src)], env=env, cwd=tmp_path)
    venv = tmp_path / "venv"

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
    assert (venv / "bin" / "ddp-agent").is_file(), "no ddp-agent console command"
    # The command names the release pip names, then the build.
    r = run([str(venv / "bin" / "ddp-agent"), "version"], env=env)
    assert r.stdout.startswith(f"ddp-agent {pkg_version} ("), r.stdout


def check_command_without_torch(agent: pathlib.Path, env: dict, tmp_path: pathlib.Path) -> None:
    """The console command works where torch cannot be imported (a login
    node, a slim sidecar image), and costs little more than the binary.

    torch is hidden by a package of that name that fails to import, first
    on PYTHONPATH, as a venv without torch fails. The time is the median of
    several runs against the bundled binary's own; the bound is loose (the
    goal is 50 ms; importing torch cost 2-3.5 s), so load cannot fail it."""
    hide = tmp_path / "no-torch" / "torch"
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    no_torch = dict(env, PYTHONPATH=str(hide.parent))
    binary = next((tmp_path / "venv" / "lib").glob("python3*/site-packages/ddp_agent/ddp-agent"))
    for args in (["version"], ["help"], ["plugins"]):
        r = subprocess.run([str(agent), *args], capture_output=True, text=True, timeout=60, env=no_torch)
        assert "torch" not in r.stderr, f"ddp-agent {' '.join(args)} without torch:\n{r.stderr}"
        want = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=60, env=no_torch)
        assert (r.returncode, r.stdout) == (want.returncode, want.stdout), f"{args}: {r}\nvs the binary's {want}"

    def median(cmd) -> float:
        times = []
        for _ in range(7):
            start = time.perf_counter()
            subprocess.run(cmd, capture_output=True, timeout=60, env=no_torch, check=True)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    added = median([str(agent), "version"]) - median([str(binary), "version"])
    print(f"the console command adds {added * 1000:.0f} ms to `ddp-agent version`")
    assert added < 0.5, f"the console command adds {added:.2f} s to the binary's start"


# The worker of test_wheel_runs_ddp_job: it says which interpreter ran it.
WHICH = """
import os, sys
import ddp_agent
# One write(2) of under PIPE_BUF bytes, which no other worker's output
# splits: print() makes two (the text, then its newline) when stdout is
# unbuffered, and under torchrun two workers' lines once ran together.
os.write(1, f"worker python {sys.executable} rank {os.environ['RANK']}\\n".encode())
"""


def test_wheel_runs_ddp_job(tmp_path):
    """`make wheel`'s wheel in a fresh venv: `ddp-agent run` (no Go, no
    checkout on the path) runs the demo's DDP job with the hook, its workers
    on the venv's interpreter although another python3 is first on PATH."""
    need_tools()
    env = clean_env()
    wheel = os.environ.get("DDP_AGENT_WHEEL")
    if not wheel:
        out = tmp_path / "dist"
        run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
             "-w", str(out), str(source_copy(tmp_path))], env=env, cwd=tmp_path)
        wheel = str(next(out.glob("ddp_agent-*.whl")))
    assert "-py3-none-linux_" in wheel, f"{wheel}: not a platform wheel"
    py = make_venv(tmp_path / "venv", env)
    run([str(py), "-m", "pip", "install", "-q", "--no-index", wheel], env=env, cwd=tmp_path)

    # The venv is not activated: its bin/ holds ddp-agent, but the first
    # python3 on PATH is the system's, as with pyenv or conda in the way.
    agent = tmp_path / "venv" / "bin" / "ddp-agent"
    env["PATH"] = "/usr/bin:/bin"
    work = tmp_path / "work"
    work.mkdir()
    (work / "which.py").write_text(WHICH)
    r = run([str(agent), "run", "--standalone", "--nproc-per-node", "2", "which.py"], env=env, cwd=work)
    ran = sorted(line.split()[2] for line in r.stdout.splitlines() if "worker python" in line)
    assert ran == [str(py), str(py)], f"workers ran on {ran}, not {py}:\n{r.stdout}\n{r.stderr}"
    # python -m ddp_agent is the same command (as python -m torch.distributed.run is torchrun).
    r = run([str(py), "-m", "ddp_agent", "run", "--standalone", "--nproc-per-node", "2", "which.py"], env=env, cwd=work)
    ran = sorted(line.split()[2] for line in r.stdout.splitlines() if "worker python" in line)
    assert ran == [str(py), str(py)], f"python -m ddp_agent: workers ran on {ran}, not {py}:\n{r.stdout}\n{r.stderr}"

    check_command_without_torch(agent, env, tmp_path)

    # The torchrun the docs name for Debian's torch 1.13 on Python 3.11
    # (plain torchrun elsewhere), from the installed package.
    r = run([str(py), "-m", "ddp_agent.torchrun", "--standalone", "--nproc_per_node", "2", "which.py"], env=env, cwd=work)
    assert sorted(line.split()[-1] for line in r.stdout.splitlines() if "worker python" in line) == ["0", "1"], r.stdout

    train = ROOT / "examples" / "train.py"
    r = run([str(agent), "run", "--standalone", "--nproc-per-node", "2", str(train), "--steps", "6",
             "--ckpt-dir", str(work / "ckpt"), "--comm-hook", "ddp-agent"], env=env, cwd=work)
    out = r.stdout + r.stderr
    assert "comm hook: ddp-agent" in out, out
    sums = {line.split("sha256=")[1] for line in out.splitlines() if "params rank=" in line}
    assert len(sums) == 1 and out.count("params rank=") == 2, f"ranks disagree or missing:\n{out}"
