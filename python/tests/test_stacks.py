"""The stack dump the agent asks a hung rank for (ddp_agent._stacks)."""

import os
import subprocess
import sys
import textwrap

PYTHON_DIR = os.path.join(os.path.dirname(__file__), "..")

PROGRAM = textwrap.dedent("""
    import os, signal, sys, threading, time
    from ddp_agent import _stacks
    path = _stacks.enable()
    print(path, flush=True)

    def waiting_in_a_thread():
        time.sleep(30)

    threading.Thread(target=waiting_in_a_thread, daemon=True).start()

    def stuck_in_the_step():
        os.kill(os.getpid(), _stacks.STACK_SIGNAL)  # what the agent sends
        time.sleep(0.5)
        print("still alive", flush=True)

    stuck_in_the_step()
""")


def run(tmp_path, **env):
    full = dict(os.environ, PYTHONPATH=PYTHON_DIR, **env)
    return subprocess.run([sys.executable, "-c", PROGRAM], env=full, capture_output=True, text=True, timeout=60)


def test_sigusr2_writes_every_threads_stack(tmp_path):
    r = run(tmp_path, DDP_AGENT_STACK_DIR=str(tmp_path / "stacks"), RANK="3")
    assert r.returncode == 0, r.stderr
    path = r.stdout.splitlines()[0]
    assert path.startswith(str(tmp_path / "stacks" / "rank3-pid")) and path.endswith(".txt"), path
    assert "still alive" in r.stdout  # the signal did not kill the process
    dump = open(path).read()
    assert "stuck_in_the_step" in dump and "waiting_in_a_thread" in dump, dump


def test_without_the_agent_nothing_is_registered(tmp_path):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    env.pop("DDP_AGENT_STACK_DIR", None)
    r = subprocess.run(
        [sys.executable, "-c", "from ddp_agent import _stacks; print(_stacks.enable())"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0 and r.stdout.strip() == "None", r
