"""ddp_agent._store, the workers' store in a process of its own (``ddp-agent run --spares``).

The agent's side (starting it on node rank 0 before the workers, its exit
as a fault) is tested in agent/supervisor; workers that make their process
group through it, and survive rank 0's death, in agent/e2e (TestWarmSpare,
on torch 1.13 and 2.x). Here a real store process serves a real client.
"""

import os
import socket
import subprocess
import sys
from datetime import timedelta

import torch.distributed as dist

import _world
from conftest import PYTHON_DIR


def start(port: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    return subprocess.Popen([sys.executable, "-m", "ddp_agent._store"], env=env, stderr=subprocess.PIPE, text=True)


def test_serves_until_ended():
    port = _world.free_port()
    p = start(str(port))
    try:
        # A client retries its connection until the server listens, as the workers do.
        a = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=60))
        b = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=60))
        a.set("k", "v")
        assert b.get("k") == b"v"
        assert b.add("n", 2) == 2 and a.add("n", 3) == 5
        del a, b  # a client that goes leaves the store serving the others
        c = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=60))
        assert c.get("k") == b"v"
        assert p.poll() is None
    finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
    assert f"serving the job's store on port {port}" in err, err


def test_bad_port_is_a_clear_error():
    p = start("not-a-port")
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0
    assert "MASTER_ADDR and MASTER_PORT must name the store" in err, err


def test_port_taken_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        p = start(str(s.getsockname()[1]))
        _, err = p.communicate(timeout=60)
    assert p.returncode != 0
    assert "cannot serve the job's store on port" in err, err

