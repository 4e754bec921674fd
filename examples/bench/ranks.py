"""Ranks on this machine for the Python benchmarks: start N copies of a script with torchrun's environment, collect their JSON.

hook_cost.py and hook_models.py run their ranks the same way: each rank is
the benchmark itself re-run with ``--worker DIR`` (RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, each rank in a session of its
own so a failure kills its children), writes ``DIR/rank<N>.json`` and exits;
a rank that fails or runs past the timeout stops them all, with every
rank's last output in the message.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env():
    """This environment without what a launcher set for its own workers, the repo's package first on the path."""
    env = dict(os.environ)
    for k in ("DDP_AGENT_SOCKET", "DDP_AGENT_GENERATION", "TORCHELASTIC_RESTART_COUNT", "DDP_AGENT_SHIM_CONFIG"):
        env.pop(k, None)  # the hook bootstraps through torch's store, even when a benchmark runs under ddp-agent
    shim = os.path.join(REPO, "bin", "libddpshim.so")
    if not env.get("DDP_AGENT_SHIM") and os.path.exists(shim):
        env["DDP_AGENT_SHIM"] = shim
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(REPO, "python"), env.get("PYTHONPATH", "")) if p)
    return env


def run(name, script, tmp, env, timeout, world=2):
    """Runs world ranks of script (with this process's arguments and --worker tmp); returns their rank<N>.json, by rank.

    Exits the process with the ranks' output when one fails or they run past timeout.
    """
    env = dict(env, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), WORLD_SIZE=str(world))
    cmd = [sys.executable, os.path.abspath(script), "--worker", tmp] + [a for a in sys.argv[1:] if a != "--worker"]
    procs, logs = [], []
    try:
        for rank in range(world):
            log = open(os.path.join(tmp, "rank%d.log" % rank), "w+")
            logs.append(log)
            procs.append(subprocess.Popen(cmd, env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)), stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        failed = [r for r, p in enumerate(procs) if p.poll() != 0]
        if failed:
            stop(procs)  # a rank that failed leaves its peer waiting
            text = []
            for r, log in enumerate(logs):
                log.seek(0)
                text.append("--- rank %d (exit %s):\n%s" % (r, procs[r].returncode, log.read()[-3000:]))
            sys.exit("%s: ranks %s failed (or were still running after %.0fs)\n%s" % (name, failed, timeout,
                                                                                    "\n".join(text)))
    finally:
        stop(procs)
        for log in logs:
            log.close()
    out = []
    for rank in range(world):
        with open(os.path.join(tmp, "rank%d.json" % rank)) as f:
            out.append(json.load(f))
    return out


def write_result(tmp, rank, result):
    """A rank's result, written atomically as tmp/rank<N>.json."""
    path = os.path.join(tmp, "rank%d.json" % rank)
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)


def stop(procs):
    """Kills the ranks still running, with their children (each rank leads a session of its own)."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
