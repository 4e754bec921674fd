"""ddp_agent._spare, the warm spare: what it imports before it is needed, and how it takes a rank.

The agent's side (starting spares, writing the assignment) is tested in
agent/supervisor; a spare joining a real re-formation in agent/e2e
(TestWarmSpare, on torch 1.13 and 2.x). Here a real spare process reads a
real pipe, as under ``ddp-agent run --spares``.
"""

import json
import os
import subprocess
import sys
import textwrap
import threading
from datetime import timedelta

import torch.distributed as dist

from ddp_agent import _env, _spare

import _world
from conftest import PYTHON_DIR


def test_imports_are_the_scripts_top_level_ones(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import os, json as j
        from collections import OrderedDict
        from . import sibling
        try:
            import yaml
        except ImportError:
            yaml = None
        def main():
            import only_when_called
    """))
    assert _spare._imports(str(script)) == ["os", "json", "collections", "yaml"]
    script.write_text("def broken(:\n")
    assert _spare._imports(str(script)) == []
    assert _spare._imports(str(tmp_path / "missing.py")) == []


def test_target():
    assert _spare._target(["train.py", "--lr", "1"]) == (False, "train.py", ["--lr", "1"])
    assert _spare._target(["-m", "pkg.train", "--lr", "1"]) == (True, "pkg.train", ["--lr", "1"])


SCRIPT = """
import os, sys
import torch.distributed as dist
print("script ran as", __name__, "argv", sys.argv[1:], "RANK", os.environ.get("RANK"),
      "LOCAL_RANK", os.environ.get("LOCAL_RANK"), "fd", os.environ.get("{fd}"),
      "init", dist.init_process_group.__qualname__, flush=True)
"""


def _spare_process(tmp_path, line):
    """Runs a spare of a script that prints what it was given; writes line (or nothing) to its pipe."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(fd=_env.SPARE_FD))
    r, w = os.pipe()
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR), **{_env.SPARE_FD: str(r)})
    env.pop("RANK", None)
    p = subprocess.Popen([sys.executable, "-u", "-m", "ddp_agent._spare", str(script), "--lr", "0.5"], env=env,
                         pass_fds=(r,), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.close(r)
    with os.fdopen(w, "w") as f:
        f.write(line)
    out, err = p.communicate(timeout=120)
    return p.returncode, out, err


def test_released_spare_exits_without_running_the_script(tmp_path):
    code, out, err = _spare_process(tmp_path, "")
    assert code == 0, err
    assert "warm spare ready" in err and "modules of" in err
    assert "script ran" not in out


def test_assigned_spare_runs_the_script_as_the_rank(tmp_path):
    line = json.dumps({"rank": 3, "local_rank": 1, "env": {"RANK": "3", "LOCAL_RANK": "1", "ROLE_RANK": "3"}}) + "\n"
    code, out, err = _spare_process(tmp_path, line)
    assert code == 0, err
    assert "takes rank 3 (local rank 1)" in err
    # As __main__, with its arguments and the rank's variables; the pipe's
    # variable is gone; init_process_group will join the re-formation.
    assert ("script ran as __main__ argv ['--lr', '0.5'] RANK 3 LOCAL_RANK 1 fd None "
            "init _expect_join.<locals>.init_process_group") in out, out + err


def test_warm_start_says_ready_then_runs_as_the_mode_says(tmp_path):
    """A first worker started warm ($DDP_AGENT_SPARE_READY_FD): one byte on that fd once its imports are
    done, before any rank is given; then "start" runs the script as torchrun would (torch's own
    init_process_group), "join" as a new worker joining the others' re-formation."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(fd=_env.SPARE_READY_FD))
    for mode, init in (("start", "init_process_group"), ("join", "_expect_join.<locals>.init_process_group")):
        r, w = os.pipe()
        rr, rw = os.pipe()
        env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR), **{_env.SPARE_FD: str(r), _env.SPARE_READY_FD: str(rw)})
        env.pop("RANK", None)
        p = subprocess.Popen([sys.executable, "-u", "-m", "ddp_agent._spare", str(script)], env=env,
                             pass_fds=(r, rw), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        os.close(r)
        os.close(rw)
        with os.fdopen(rr, "rb") as ready:
            assert ready.read() == b"r", p.communicate(timeout=120)  # the byte, then the end: it closed the fd
        line = {"rank": 2, "local_rank": 0, "env": {"RANK": "2", "LOCAL_RANK": "0", "ROLE_RANK": "2"}, "mode": mode}
        with os.fdopen(w, "w") as f:
            f.write(json.dumps(line) + "\n")
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert f"takes rank 2 (local rank 0, {mode})" in err
        assert f"script ran as __main__ argv [] RANK 2 LOCAL_RANK 0 fd None init {init}" in out, out + err


def test_joining_worker_runs_the_script_at_once(tmp_path):
    """$DDP_AGENT_JOIN: a new worker with its rank already, no pipe; it runs the script to join the others."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(fd=_env.JOIN))
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR), RANK="4", LOCAL_RANK="0", **{_env.JOIN: "1"})
    env.pop(_env.SPARE_FD, None)
    r = subprocess.run([sys.executable, "-u", "-m", "ddp_agent._spare", str(script), "--lr", "0.5"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "warm spare ready" not in r.stderr  # nothing to wait for
    # The mark is gone from its environment (its own children are no joiners).
    assert ("script ran as __main__ argv ['--lr', '0.5'] RANK 4 LOCAL_RANK 0 fd None "
            "init _expect_join.<locals>.init_process_group") in r.stdout, r.stdout + r.stderr


def test_a_raising_script_leaves_the_error_file(tmp_path):
    """The script raises: the spare writes $TORCHELASTIC_ERROR_FILE as torch's @record would, in the
    layout the agent reads, and leaves the one the script's own @record wrote; one it cannot write
    it says so of, without hiding the script's exception."""
    script = tmp_path / "train.py"
    error_file = tmp_path / "error.json"
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR), RANK="4", LOCAL_RANK="0", TORCHELASTIC_ERROR_FILE=str(error_file),
               **{_env.JOIN: "1"})
    for own in (True, False):
        error_file.unlink(missing_ok=True)
        script.write_text(textwrap.dedent(f"""
            import json, os
            def main():
                if {own}:  # as torch's @record: the file, then the exception goes on
                    with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
                        json.dump({{"message": "the script's own"}}, f)
                raise RuntimeError("boom")
            main()
        """))
        r = subprocess.run([sys.executable, "-u", "-m", "ddp_agent._spare", str(script)], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "RuntimeError: boom" in r.stderr, r.stderr
        written = json.loads(error_file.read_text())
        if own:
            assert written == {"message": "the script's own"}
            continue
        assert written["message"]["message"] == "RuntimeError: boom", written
        assert 'train.py", line 7, in main' in written["message"]["extraInfo"]["py_callstack"], written
        assert int(written["message"]["extraInfo"]["timestamp"]) > 0
    # A file it cannot write (the script without its own @record, as last): said, and the script's
    # exception stays its last words.
    env["TORCHELASTIC_ERROR_FILE"] = str(tmp_path / "missing" / "error.json")
    r = subprocess.run([sys.executable, "-u", "-m", "ddp_agent._spare", str(script)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "could not write the error file" in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "RuntimeError: boom", r.stderr


def test_spare_serves_the_store(tmp_path):
    """{"store": ...}: the node serving the workers' store was lost; the spare serves the new one, not the script."""
    port = _world.free_port()
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(fd=_env.SPARE_FD))
    r, w = os.pipe()
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR), **{_env.SPARE_FD: str(r)})
    p = subprocess.Popen([sys.executable, "-u", "-m", "ddp_agent._spare", str(script)], env=env, pass_fds=(r,),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.close(r)
    err = ""
    try:
        with os.fdopen(w, "w") as f:
            f.write(json.dumps({"store": {"addr": "127.0.0.1", "port": port}}) + "\n")
        client = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=60))
        client.set("k", "v")
        assert client.get("k") == b"v" and p.poll() is None
        # The server answers before its TCPStore constructor returns, and
        # so before it says it serves (a CI run ended it in between): wait
        # for the line, or the process's end, at most 60 s.
        timer = threading.Timer(60, p.terminate)
        timer.start()
        for line in p.stderr:
            err += line
            if "serving the job's store on port" in line:
                break
        timer.cancel()
    finally:
        p.terminate()
        out, rest = p.communicate(timeout=30)
        err += rest
    assert "serves the job's store" in err and f"serving the job's store on port {port}" in err, err
    assert "script ran" not in out
