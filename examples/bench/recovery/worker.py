# Worker of the node-loss recovery benchmark (examples/bench/recovery).
#
# A real distributed job: it joins the gloo process group from the
# launcher's env:// variables, then all-reduces a small tensor every ~50 ms
# until a peer disappears, when the collective raises and the worker exits
# non-zero, which is what makes its launcher notice and re-rendezvous.
#
# It appends JSON lines to $RECOVERY_BENCH_LOG, each with one write() on an
# O_APPEND descriptor, so the lines of all workers of all nodes never
# interleave:
#   {"phase": "start", ...}  at script start, before PyTorch is imported
#   {"phase": "init", ...}   as soon as init_process_group returned: the
#                            worker runs user code in contact with the world
#   {"phase": "fail", ...}   a collective failed; the worker exits 1 next
#   {"phase": "orphan", ...} its launcher died (torchrun leaves its workers
#                            behind); the worker exits 1 next
# Fields: t (time.time()), rank, world, gen (TORCHELASTIC_RESTART_COUNT, or
# DDP_AGENT_GENERATION under ddp-agent), pid, node (GROUP_RANK), launcher
# (RECOVERY_BENCH_NODE: the index of the launcher process that started it).
import time

T_START = time.time()

import json
import os
import sys

LOG = os.environ["RECOVERY_BENCH_LOG"]
PARENT = os.getppid()


def _int_env(name, default=-1):
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


def _gen():
    # ddp-agent's generation is job-wide; torchrun's restart count is
    # per agent. Either way it tells the attempts of one node apart.
    g = os.environ.get("DDP_AGENT_GENERATION")
    if g is None:
        g = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    try:
        return int(g)
    except ValueError:
        return -1


def log(phase, t=None, **extra):
    rec = {
        "t": time.time() if t is None else t,
        "phase": phase,
        "rank": _int_env("RANK"),
        "world": _int_env("WORLD_SIZE"),
        "gen": _gen(),
        "pid": os.getpid(),
        "node": _int_env("GROUP_RANK"),
        "launcher": _int_env("RECOVERY_BENCH_NODE"),
    }
    rec.update(extra)
    line = (json.dumps(rec) + "\n").encode()
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write() of a short line: atomic under O_APPEND
    finally:
        os.close(fd)


def main():
    log("start", t=T_START)

    from datetime import timedelta

    import torch
    import torch.distributed as dist

    # env:// from the launcher's MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE. The
    # timeout bounds the init (store and barrier) and every collective, so a
    # worker never hangs for gloo's default 30 minutes.
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    log("init")

    x = torch.ones(16)
    step = 0
    while True:
        try:
            dist.all_reduce(x)
        except Exception as e:  # a peer is gone: gloo raises at once
            log("fail", step=step, error=("%s: %s" % (type(e).__name__, e))[:300])
            sys.stderr.write("recovery worker rank %d: collective failed at step %d: %s\n"
                             % (dist.get_rank(), step, e))
            sys.stderr.flush()
            # Skip interpreter teardown (gloo's destructors can block on a
            # dead peer); the launcher only needs a non-zero exit.
            os._exit(1)
        x.fill_(1.0)
        step += 1
        if os.getppid() != PARENT:
            # Our launcher is gone (torchrun does not take its workers along
            # when it dies): do not live on as an orphan.
            log("orphan", step=step)
            os._exit(1)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
