"""ddp-agent's comm hook in real DDP jobs, under ddp-agent and under torchrun."""

import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest
from e2e_helpers import HERE, REPO, TRAIN, clean_env, collective_events, param_digests, run

PROBE = os.path.join(HERE, "hook_probe.py")


def probes(stdout):
    """Returns {rank: probe dict} from hook_probe.py's PROBE records.

    Scans the whole output, not lines: under torchrun 1.13 the ranks share
    one pipe, and another rank's output may follow a record on its line.
    """
    out = {}
    dec = json.JSONDecoder()
    i = stdout.find("PROBE ")
    while i >= 0:
        d, end = dec.raw_decode(stdout, i + len("PROBE "))
        out[d["rank"]] = d
        i = stdout.find("PROBE ", end)
    return out


def agent_cmd(agent_bin, python, *args):
    return [agent_bin, "run", "--standalone", "--nproc-per-node", "2", "--python", python, "--stop-timeout", "20s",
            *args]


def test_train_under_agent(agent_bin, python, shim_path, tmp_path):
    """train.py with the hook under ddp-agent: succeeds, ranks agree, the agent receives the events.

    With 2 ranks, averaging is exact in either order ((a+b)/2 == a/2+b/2 in
    floating point), so the hook must also end bit-identical to DDP's
    built-in gloo all-reduce.
    """
    digests = {}
    for mode in ("ddp-agent", "none"):
        r = run(agent_cmd(agent_bin, python, TRAIN, "--steps", "8", "--log-every", "4",
                          "--ckpt-dir", str(tmp_path / mode), "--comm-hook", mode), timeout=120, env=clean_env())
        assert r.returncode == 0, r.logs()
        assert "[rank0]:done: steps=8" in r.stdout, r.logs()
        assert re.search(r"\[rank0\]:step_time comm_hook=%s steps=3 warmup=5 mean_ms=" % mode, r.stdout), r.logs()
        d = param_digests(r.stdout)
        assert set(d) == {0, 1} and d[0] == d[1], "ranks differ\n" + r.logs()
        digests[mode] = d[0]
        if mode == "ddp-agent":
            assert "[rank0]:comm hook: ddp-agent" in r.stdout, r.logs()
            events = collective_events(r.stderr)
            assert events, "no `collective events` line\n" + r.logs()
            gen, received, dropped = events[-1]
            assert gen == 0 and received > 0, r.logs()
        else:
            assert "comm hook: ddp-agent" not in r.stdout, r.logs()
    assert digests["ddp-agent"] == digests["none"], digests


def test_hook_bootstraps_through_agent(agent_bin, python, shim_path, tmp_path):
    """Under ddp-agent the hook's communicator is connected to the control socket and ships events."""
    r = run(agent_cmd(agent_bin, python, PROBE, "6"), timeout=90, env=clean_env())
    assert r.returncode == 0, r.logs()
    p = probes(r.stdout)
    assert set(p) == {0, 1}, r.logs()
    for rank, d in p.items():
        assert d["socket_env"], d
        info = d["info"]
        assert info["agent"] is True, (rank, info)
        assert info["rank"] == rank and info["world_size"] == 2, info
        assert info["transport"] in ("shm", "tcp"), info
        assert info["collectives"] > 0 and info["events_sent"] > 0, info
    assert p[0]["digest"] == p[1]["digest"], r.logs()
    events = collective_events(r.stderr)
    assert events and events[-1][1] > 0, r.logs()


def test_nccl_unique_id_through_agent(agent_bin, python, shim_path, tmp_path):
    """transport="nccl" under ddp-agent, on the fake NCCL: rank 0's unique id reaches rank 1 through the agent's KV."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc builds the fake NCCL")
    lib = tmp_path / "libnccl.so.2"
    src = os.path.join(REPO, "ncclshim", "nccl", "testdata", "fakenccl.c")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-pthread", "-o", str(lib), src], check=True, timeout=120)
    fake_dir = tempfile.mkdtemp(prefix="fakenccl-", dir="/tmp")  # short: the unique id holds the path
    try:
        env = clean_env(PROBE_TRANSPORT="nccl", DDP_AGENT_NCCL_LIB=str(lib), FAKE_NCCL_DIR=fake_dir, FAKE_NCCL_VERSION="22005")
        r = run(agent_cmd(agent_bin, python, PROBE, "4"), timeout=90, env=env)
    finally:
        shutil.rmtree(fake_dir, ignore_errors=True)
    assert r.returncode == 0, r.logs()
    p = probes(r.stdout)
    assert set(p) == {0, 1}, r.logs()
    for rank, d in p.items():
        info = d["info"]
        assert info["transport"] == "nccl" and info["connected"], (rank, info)
        assert info["agent"] is True and info["nccl"]["version"] == "2.20.5", (rank, info)
        assert info["collectives"] > 0, info
    assert p[0]["digest"] == p[1]["digest"], r.logs()


def test_train_under_torchrun(torchrun_compat, python, shim_path, tmp_path):
    """Under torchrun (no agent) the hook bootstraps through torch's store; ranks end bit-identical."""
    env = clean_env(DDP_AGENT_SHIM=shim_path)
    r = run([python, torchrun_compat, "--standalone", "--nproc_per_node", "2", TRAIN, "--steps", "8",
             "--log-every", "4", "--ckpt-dir", str(tmp_path), "--comm-hook", "ddp-agent"], timeout=150, env=env)
    assert r.returncode == 0, r.logs()
    assert "comm hook: ddp-agent" in r.stdout and "done: steps=8" in r.stdout, r.logs()
    digests = param_digests(r.stdout)
    assert set(digests) == {0, 1} and digests[0] == digests[1], r.logs()

    r = run([python, torchrun_compat, "--standalone", "--nproc_per_node", "2", PROBE, "6"], timeout=120, env=env)
    assert r.returncode == 0, r.logs()
    p = probes(r.stdout)
    assert set(p) == {0, 1}, r.logs()
    for rank, d in p.items():
        assert not d["socket_env"] and d["info"]["agent"] is False, d
        assert d["info"]["collectives"] > 0, d
    assert p[0]["digest"] == p[1]["digest"], r.logs()
