"""The node's sidecar (``ddp-agent sidecar``): finding it, and what the hook tells it.

Under a launcher other than ``ddp-agent run`` (torchrun, srun, a Kubeflow
job), a sidecar may run on the node. The hook finds its socket at
``$DDP_AGENT_SOCKET``, else ``$XDG_RUNTIME_DIR/ddp-agent/sidecar.sock``, else
``$TMPDIR/ddp-agent-sidecar-<uid>/sidecar.sock`` (``/tmp`` without
``$TMPDIR``): the same rule as the sidecar's (agent/sidecar/socket.go). The
communicators still bootstrap through torch's store; they only send the
sidecar their events and obey its Abort. No socket, or one in a directory
of another user, means no sidecar: the hook works exactly as without one.
"""

import hashlib
import logging
import os
import re
import socket
import stat
from typing import Dict, Optional

from . import _env

log = logging.getLogger("ddp_agent")

ENV_SOCKET = _env.SOCKET


def under_run() -> bool:
    """Whether ddp-agent run launched this worker (it sets the generation for its workers)."""
    return bool(os.environ.get(_env.GENERATION))


def default_socket() -> str:
    """The sidecar's socket path for this user, as the sidecar computes it."""
    if os.environ.get(ENV_SOCKET):
        return os.environ[ENV_SOCKET]
    if os.environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(os.environ["XDG_RUNTIME_DIR"], "ddp-agent", "sidecar.sock")
    return os.path.join(os.environ.get("TMPDIR") or "/tmp", f"ddp-agent-sidecar-{os.getuid()}", "sidecar.sock")


_warned: Dict[str, bool] = {}


def find() -> Optional[str]:
    """Returns the sidecar's socket when one is there for this user, else None.

    The directory must be this user's and closed to others: a socket
    another user planted would see this job's events and could abort it.
    """
    if under_run():
        return None
    path = default_socket()
    try:
        st = os.stat(path)
        dst = os.stat(os.path.dirname(path) or ".")
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode) or not _answers(path):
        return None
    if dst.st_uid != os.getuid() or dst.st_mode & 0o022:
        if not _warned.get(path):
            _warned[path] = True
            log.warning(
                "ddp_agent: ignoring the sidecar socket %s: its directory is not this user's alone (owner uid %d, mode %o)",
                path,
                dst.st_uid,
                dst.st_mode & 0o777,
            )
        return None
    return path


def _answers(path: str) -> bool:
    """Whether a sidecar accepts on the socket (a killed one leaves its file behind)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def job_id() -> str:
    """The job's identity, the same on every rank: the launcher's run id, else the scheduler's job, else the master."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":  # torchrun's default --rdzv-id is "none"
        return run_id
    if os.environ.get("SLURM_JOB_ID"):
        step = os.environ.get("SLURM_STEP_ID")
        return f"slurm-{os.environ['SLURM_JOB_ID']}" + (f".{step}" if step else "")
    return f"{os.environ.get('MASTER_ADDR', 'localhost')}:{os.environ.get('MASTER_PORT', '0')}"


def dir_name(job: str) -> str:
    """A job id made a directory name, as the sidecar's dirName (agent/sidecar/job.go).

    Letters, digits, '.', '_' and '-' are kept, anything else becomes '_';
    a name changed so, or long, gets a hash of the id, so that two ids never
    share a directory.
    """
    name = re.sub(r"[^A-Za-z0-9._-]", "_", job)
    if name == job and len(job) <= 64 and job.strip("."):
        return name
    return name[:48] + "-" + hashlib.sha256(job.encode("utf-8")).hexdigest()[:8]


def stack_dir(socket: str) -> str:
    """Where this job's ranks write their Python stacks for the sidecar's hang reports."""
    return os.path.join(os.path.dirname(socket), "stacks", dir_name(job_id()))


def _env_int(*names: str, default: int) -> int:
    for n in names:
        v = os.environ.get(n)
        if v:
            try:
                return int(v.split("(")[0].split(",")[0])  # SLURM_TASKS_PER_NODE: "4(x2)"
            except ValueError:
                continue
    return default


def say_unlaunched() -> None:
    """Says once, when a sidecar listens, that it will not see this process: no launcher named its job.

    mp.spawn, or a script that passes rank and world size to
    init_process_group itself, leaves no WORLD_SIZE (nor RANK) in the
    environment, from which the sidecar would learn the job's shape; the
    job then trained unwatched without a word.
    """
    if _warned.get("unlaunched"):
        return
    _warned["unlaunched"] = True
    sock = find()
    if sock:
        log.warning(
            "ddp_agent: a sidecar listens at %s, but this process has no WORLD_SIZE (mp.spawn, or ranks given "
            "to init_process_group directly), so it does not watch this job; set WORLD_SIZE, RANK, LOCAL_RANK "
            "and LOCAL_WORLD_SIZE in each process, as torchrun does",
            sock,
        )


def world_size() -> int:
    """The job's world from the launcher (-1: unknown): torchrun's WORLD_SIZE, else srun's task count."""
    return _env_int("WORLD_SIZE", "SLURM_NTASKS", default=-1)


def rank() -> Optional[str]:
    """This worker's global rank from the launcher: torchrun's RANK, else srun's SLURM_PROCID."""
    return os.environ.get("RANK") or os.environ.get("SLURM_PROCID")


def generation() -> int:
    """The launcher's restart count: a sidecar follows the job's generations with it."""
    return _env_int("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT", default=0)


def local_rank() -> int:
    return _env_int("LOCAL_RANK", "SLURM_LOCALID", default=0)


def job_info(socket: str, rank: int, world_size: int, gpu: str = "", relay: str = "") -> Dict[str, str]:
    """What a sidecar needs of this worker's job (wire.Hello.Job), every value a string."""
    local_world = _env_int("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", default=1)
    local_world = max(1, min(local_world, world_size))
    group_rank = _env_int("GROUP_RANK", "SLURM_NODEID", default=rank // local_world)
    return {
        "job": job_id(),
        "world_size": str(world_size),
        "local_world_size": str(local_world),
        "group_rank": str(group_rank),
        "master_addr": os.environ.get("MASTER_ADDR", ""),
        "relay": relay,
        "gpu": gpu,
        "stack_dir": stack_dir(socket),
    }
