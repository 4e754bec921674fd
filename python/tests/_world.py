"""Launches a world of real worker processes (torchrun's environment, no torchrun) for the tests.

Every rank is a process of its own session, so a rank and its children
(DataLoader workers) are killed together; every wait has a deadline, and
whatever is still running at the deadline is killed, so a hang fails the
test instead of the suite.
"""

import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import time
from typing import Dict, List, NamedTuple, Optional, Sequence

TESTS_DIR = pathlib.Path(__file__).resolve().parent
PYTHON_DIR = TESTS_DIR.parent
ROOT = PYTHON_DIR.parent
WORKER = TESTS_DIR / "_ddp_worker.py"


class RankResult(NamedTuple):
    rank: int
    returncode: int
    stdout: str
    stderr: str


def free_port() -> int:
    """Returns a TCP port that was free a moment ago on 127.0.0.1, below the kernel's ephemeral range.

    A worker binds the port a second or more later, once it has imported
    torch. A port of the ephemeral range (what binding port 0 gives) may be
    taken meanwhile as the local port of any outgoing connection on the
    machine: CI saw rank 0 fail with EADDRINUSE while other suites ran.
    Below the range only another test's choice can take it.
    """
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    rng = random.Random()
    for _ in range(100):
        port = rng.randrange(10000, max(10001, low))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # a machine whose low ports are all taken
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment of a test worker: ours, the in-tree package first, no agent socket."""
    env = dict(os.environ)
    for k in ("DDP_AGENT_SOCKET", "DDP_AGENT_GENERATION", "TORCHELASTIC_RESTART_COUNT"):
        env.pop(k, None)  # the tests run their own bootstrap, even when run under ddp-agent
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PYTHON_DIR), env.get("PYTHONPATH", "")) if p)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def run_world(
    workdir: pathlib.Path,
    world_size: int,
    args: Sequence[str],
    *,
    timeout: float = 120,
    env: Optional[Dict[str, str]] = None,
    script: pathlib.Path = WORKER,
    hung_ranks: Sequence[int] = (),
    per_rank_env: Optional[Dict[int, Dict[str, str]]] = None,
) -> List[RankResult]:
    """Runs script with args as world_size ranks and returns their results in rank order.

    env is added to every rank's environment, then per_rank_env[rank] to that rank's.

    Blocks until every rank has exited, or timeout seconds; then kills the
    stragglers (and their children) and raises AssertionError with their logs.
    hung_ranks are expected not to exit: they are killed once the others have.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = []
    files = []
    try:
        for rank in range(world_size):
            rank_env = worker_env(env)
            rank_env.update(
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(world_size),
                LOCAL_WORLD_SIZE=str(world_size),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
            rank_env.update((per_rank_env or {}).get(rank, {}))
            out = open(workdir / f"rank{rank}.stdout", "w+")
            err = open(workdir / f"rank{rank}.stderr", "w+")
            files.append((out, err))
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(script), *args],
                    env=rank_env,
                    cwd=str(workdir),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + timeout
        hung = []
        for rank, p in enumerate(procs):
            if rank in hung_ranks:
                continue
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung.append(p)
        for rank in hung_ranks:
            _kill(procs[rank])
        results = []
        for rank, (p, (out, err)) in enumerate(zip(procs, files)):
            if p in hung:
                _kill(p)
            out.seek(0)
            err.seek(0)
            results.append(RankResult(rank, p.returncode, out.read(), err.read()))
        if hung:
            raise AssertionError(
                f"world of {world_size} ({' '.join(args)}) did not finish within {timeout:.0f}s; "
                f"killed ranks {[procs.index(p) for p in hung]}\n" + describe(results)
            )
        return results
    finally:
        for p in procs:
            _kill(p)
        for out, err in files:
            out.close()
            err.close()


def _kill(p: subprocess.Popen) -> None:
    """Kills p's session (p and its children), then reaps p."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def describe(results: Sequence[RankResult]) -> str:
    """The exit codes and log tails of every rank, for assertion messages."""
    parts = []
    for r in results:
        parts.append(
            f"--- rank {r.rank}: exit {r.returncode}\n"
            f"stdout:\n{_tail(r.stdout)}\nstderr:\n{_tail(r.stderr)}"
        )
    return "\n".join(parts)


def check_ok(results: Sequence[RankResult]) -> None:
    """Asserts that every rank exited 0."""
    bad = [r.rank for r in results if r.returncode != 0]
    assert not bad, f"ranks {bad} failed\n" + describe(results)
