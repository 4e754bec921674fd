"""Helpers of the e2e tests: run a process with a timeout, parse the agent's and train.py's output."""

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(REPO, "examples", "train.py")


@dataclass
class Result:
    cmd: list
    returncode: int
    stdout: str
    stderr: str
    elapsed: float

    @property
    def output(self):
        return self.stdout + self.stderr

    def logs(self):
        return "command: %s\nexit code %s after %.1fs\n--- stdout ---\n%s\n--- stderr ---\n%s" % (
            " ".join(self.cmd), self.returncode, self.elapsed, self.stdout[-6000:], self.stderr[-6000:])


def run(cmd, timeout, env=None, cwd=REPO, hint=""):
    """Runs cmd in a new session; past timeout, SIGKILLs the session and fails the test (with hint)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                         start_new_session=True, stdin=subprocess.DEVNULL)
    timed_out = False
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(p.pid, signal.SIGKILL)  # the session leader is still unreaped, so the group exists
        out, err = p.communicate()
    finally:
        if p.poll() is None:  # an exception other than the timeout (KeyboardInterrupt)
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    r = Result(cmd, p.returncode, out, err, time.monotonic() - t0)
    if timed_out:
        pytest.fail("timed out after %ss and killed %s\n%s" % (timeout, hint, r.logs()), pytrace=False)
    return r


def clean_env(**extra):
    """The test's environment without anything a launcher sets for its workers."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DDP_AGENT_SOCKET", "DDP_AGENT_GENERATION", "TORCHELASTIC_", "PET_"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                         "MASTER_ADDR", "MASTER_PORT")}
    env.update(extra)
    return env


_EVENTS = re.compile(r'msg="collective events".*?generation=(\d+).*?received=(\d+).*?dropped=(\d+)')


def collective_events(stderr):
    """Returns [(generation, received, dropped)] from the agent's `collective events` lines."""
    return [tuple(int(x) for x in m.groups()) for m in _EVENTS.finditer(stderr)]


_DIGEST = re.compile(r"params rank=(\d+) sha256=([0-9a-f]+)")


def param_digests(stdout):
    """Returns {rank: digest} from train.py's final `params` lines (the last one of each rank)."""
    return {int(r): d for r, d in _DIGEST.findall(stdout)}
