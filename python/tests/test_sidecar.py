"""The hook's side of ddp-agent sidecar: finding the socket, the job's identity, the communicators' config.

The sidecar itself and the whole path (torchrun, the hook, the sidecar's
analysis and Abort) are tested end to end in agent/e2e/sidecar_test.go.
"""

import logging
import os
import socket
import stat

import pytest

from ddp_agent import _sidecar, _stacks
from ddp_agent._bootstrap import Communicators

LAUNCHER_ENV = ("DDP_AGENT_SOCKET", "DDP_AGENT_GENERATION", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                "SLURM_JOB_ID", "SLURM_STEP_ID", "LOCAL_WORLD_SIZE", "GROUP_RANK", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                "MASTER_ADDR", "MASTER_PORT", "DDP_AGENT_SHIM_CONFIG", "XDG_RUNTIME_DIR", "DDP_AGENT_STACK_DIR")


@pytest.fixture
def clean(monkeypatch, tmp_path):
    for k in LAUNCHER_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the default socket path lies under it: empty
    return monkeypatch


def listen(path):
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(1)
    return s


def test_default_socket_follows_the_sidecars_rule(clean, tmp_path):
    assert _sidecar.default_socket() == os.path.join(str(tmp_path), f"ddp-agent-sidecar-{os.getuid()}", "sidecar.sock")
    clean.setenv("XDG_RUNTIME_DIR", "/run/user/7")
    assert _sidecar.default_socket() == "/run/user/7/ddp-agent/sidecar.sock"
    clean.setenv("DDP_AGENT_SOCKET", "/x/s.sock")
    assert _sidecar.default_socket() == "/x/s.sock"


def test_find(clean, tmp_path):
    assert _sidecar.find() is None  # nothing there: no sidecar
    path = _sidecar.default_socket()
    s = listen(path)
    try:
        assert _sidecar.find() == path
        clean.setenv("DDP_AGENT_GENERATION", "0")  # under ddp-agent run: the agent's socket, not a sidecar
        assert _sidecar.find() is None
        clean.delenv("DDP_AGENT_GENERATION")
        os.chmod(os.path.dirname(path), 0o777)  # a directory others can write: refused
        assert _sidecar.find() is None
        os.chmod(os.path.dirname(path), 0o700)
    finally:
        s.close()
    open(os.path.join(str(tmp_path), "plain"), "w").close()
    clean.setenv("DDP_AGENT_SOCKET", os.path.join(str(tmp_path), "plain"))
    assert _sidecar.find() is None  # not a socket


def test_job_identity(clean):
    clean.setenv("MASTER_ADDR", "node0")
    clean.setenv("MASTER_PORT", "29500")
    assert _sidecar.job_id() == "node0:29500"
    clean.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's default --rdzv-id names no job
    assert _sidecar.job_id() == "node0:29500"
    clean.setenv("SLURM_JOB_ID", "77")
    clean.setenv("SLURM_STEP_ID", "2")
    assert _sidecar.job_id() == "slurm-77.2"
    clean.setenv("TORCHELASTIC_RUN_ID", "run-1")
    assert _sidecar.job_id() == "run-1"
    # The same names as the sidecar's dirName (agent/sidecar TestNames).
    assert _sidecar.dir_name("job-1.a_b") == "job-1.a_b"
    assert _sidecar.dir_name("a b/c:1") == "a_b_c_1-81b7dab8"
    assert _sidecar.dir_name("..") == "..-5ec1f7e7"
    assert _sidecar.dir_name("x" * 70) == "x" * 48 + "-c71bd109"


def test_job_info(clean):
    clean.setenv("TORCHELASTIC_RUN_ID", "r")
    clean.setenv("LOCAL_WORLD_SIZE", "2")
    clean.setenv("MASTER_ADDR", "10.0.0.1")
    info = _sidecar.job_info("/d/sidecar.sock", rank=3, world_size=4)
    assert info == {"job": "r", "world_size": "4", "local_world_size": "2", "group_rank": "1",
                    "master_addr": "10.0.0.1", "relay": "", "gpu": "", "stack_dir": "/d/stacks/r"}
    assert all(isinstance(v, str) for v in info.values())  # the shim takes strings only
    clean.setenv("GROUP_RANK", "0")
    assert _sidecar.job_info("/d/sidecar.sock", rank=3, world_size=4)["group_rank"] == "0"


def test_config_with_and_without_a_sidecar(clean):
    h = Communicators("ddp_agent-1", rank=1, world_size=2, timeout_ms=5000)
    today = {"rank": 1, "world_size": 2, "transport": "host", "timeout_ms": 5000, "name": "ddp_agent-1",
             "bootstrap": "external"}
    clean.setenv("WORLD_SIZE", "2")
    clean.setenv("RANK", "1")
    assert h.config() == today  # no sidecar: exactly as before
    path = _sidecar.default_socket()
    s = listen(path)
    try:
        clean.setenv("TORCHELASTIC_RESTART_COUNT", "3")
        clean.setenv("LOCAL_RANK", "1")
        cfg = h.config()
        assert cfg["bootstrap"] == "external"  # still through torch's store
        assert (cfg["sidecar"], cfg["generation"], cfg["local_rank"], cfg["global_rank"]) == (path, 3, 1, 1)
        assert cfg["sidecar_job"]["world_size"] == "2"
        # DDP_AGENT_SOCKET alone names a sidecar, not ddp-agent run's socket.
        clean.setenv("DDP_AGENT_SOCKET", path)
        assert h.config()["bootstrap"] == "external"
        clean.setenv("WORLD_SIZE", "4")  # a subgroup: no sidecar, as no agent
        assert "sidecar" not in h.config()
    finally:
        s.close()


def test_stacks_beside_a_sidecar(clean, monkeypatch):
    path = _sidecar.default_socket()
    s = listen(path)
    clean.setenv("RANK", "0")
    clean.setenv("TORCHELASTIC_RUN_ID", "job/1")
    monkeypatch.setattr(_stacks, "_path", None)
    monkeypatch.setattr(_stacks, "_file", None)
    try:
        got = _stacks.enable()
        assert got == os.path.join(os.path.dirname(path), "stacks", _sidecar.dir_name("job/1"), f"rank0-pid{os.getpid()}.txt")
        assert os.path.exists(got)
        assert stat.S_IMODE(os.stat(os.path.dirname(got)).st_mode) == 0o700
    finally:
        s.close()


def test_under_srun(clean):
    # Plain srun sets no WORLD_SIZE or RANK: the hook takes Slurm's.
    clean.setenv("SLURM_NTASKS", "2")
    clean.setenv("SLURM_PROCID", "1")
    clean.setenv("SLURM_JOB_ID", "9")
    h = Communicators("ddp_agent-1", rank=1, world_size=2, timeout_ms=5000)
    path = _sidecar.default_socket()
    s = listen(path)
    try:
        cfg = h.config()
        assert (cfg["sidecar"], cfg["global_rank"], cfg["sidecar_job"]["job"]) == (path, 1, "slurm-9")
    finally:
        s.close()


def test_says_once_that_a_sidecar_cannot_watch_an_unlaunched_process(clean, caplog, monkeypatch):
    """mp.spawn (or ranks given to init_process_group directly) leaves no WORLD_SIZE, from which the
    sidecar would learn the job's shape: such a job trained unwatched beside a sidecar, without a word."""
    monkeypatch.setattr(_sidecar, "_warned", {})
    h = Communicators("ddp_agent-1", rank=1, world_size=2, timeout_ms=5000)
    with caplog.at_level(logging.WARNING, logger="ddp_agent"):
        assert "sidecar" not in h.config()  # no sidecar there: nothing to say
    assert not caplog.records
    monkeypatch.setattr(_sidecar, "_warned", {})
    path = _sidecar.default_socket()
    s = listen(path)
    try:
        with caplog.at_level(logging.WARNING, logger="ddp_agent"):
            assert "sidecar" not in h.config()
            assert "sidecar" not in h.config()
        said = [r.getMessage() for r in caplog.records if "has no WORLD_SIZE" in r.getMessage()]
        assert len(said) == 1 and path in said[0], caplog.records
    finally:
        s.close()
