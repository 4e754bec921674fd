"""register()'s options: the transports, the compressions and the collective timeout."""

import datetime
import os
from typing import Any, Callable, List, Optional, Union

import torch

from . import _env

ENV_TIMEOUT = _env.COLLECTIVE_TIMEOUT
"""Default collective timeout in seconds, when register() gets no timeout."""

DEFAULT_TIMEOUT_S = 600.0
"""Collective timeout without timeout=, $DDP_AGENT_COLLECTIVE_TIMEOUT or a process group that tells its own."""

MAX_TIMEOUT_S = 30 * 24 * 3600.0
"""The shim's bound on a timeout (ddpshim_open refuses more): a group's longer timeout is taken as this."""

TRANSPORTS = ("auto", "host", "nccl")
"""Values of register()'s transport."""

COMPRESSIONS = {"fp16": torch.float16, "bf16": torch.bfloat16}
"""Values of register()'s compression (besides None), and the type buckets are cast to."""

Timeout = Union[None, float, int, datetime.timedelta]

LAUNCHES = ("inline", "thread")
"""Values of register()'s launch: where a bucket's NCCL all-reduce is issued."""

ENV_LAUNCH = _env.HOOK_LAUNCH
"""Default launch, when register() gets none; else "inline"."""


def launch(value: Optional[str]) -> str:
    """Returns register()'s launch: the argument, else $DDP_AGENT_HOOK_LAUNCH, else "inline"; ValueError if unknown."""
    source = "launch"
    if value is None:
        value, source = os.environ.get(ENV_LAUNCH) or "inline", f"${ENV_LAUNCH}"
    if value not in LAUNCHES:
        raise ValueError(f"ddp_agent.register: {source}={value!r} is not supported; use one of {', '.join(LAUNCHES)}")
    return value


def check(transport: str, compression: Optional[str]) -> None:
    """Raises ValueError for a transport or compression register() does not support."""
    if compression is not None and compression not in COMPRESSIONS:
        raise ValueError(
            f"ddp_agent.register: compression={compression!r} is not supported; use None, "
            + " or ".join(repr(c) for c in COMPRESSIONS)
        )
    if transport not in TRANSPORTS:
        raise ValueError(
            f"ddp_agent.register: transport={transport!r} is not supported; use one of {', '.join(TRANSPORTS)}"
        )


def group_timeout(group: Any) -> Optional[float]:
    """The process group's own timeout in seconds (init_process_group's or new_group's timeout=), or None.

    DDP's own all-reduce waits that long for a peer, so the hook does too
    unless told otherwise. torch has no public accessor: 1.13 keeps it in
    the group's options, 2.x in its backends' (gloo for CPU tensors, NCCL
    for CUDA ones; init_process_group gives both the same).
    """
    reads: List[Callable[[], Any]] = [lambda: group.options._timeout]
    for device in ("cpu", "cuda"):
        reads.append(lambda device=device: group._get_backend(torch.device(device)).options._timeout)
    for read in reads:
        try:
            value = read()
        except Exception:  # not this torch's layout, or no backend for that device
            continue
        if isinstance(value, datetime.timedelta) and value.total_seconds() > 0:
            return value.total_seconds()
    return None


def timeout_ms(timeout: Timeout, group_seconds: Optional[float] = None) -> int:
    """Returns register()'s timeout in milliseconds.

    That is the argument, else $DDP_AGENT_COLLECTIVE_TIMEOUT, else
    group_seconds (the process group's own, group_timeout), else 600 s.
    Raises ValueError for a value that is not a positive, finite number of
    seconds, TypeError for a type that is neither seconds nor a timedelta.
    """
    if timeout is None:
        env = os.environ.get(ENV_TIMEOUT)
        if env:
            try:
                seconds = float(env)
            except ValueError:
                raise ValueError(f"${ENV_TIMEOUT}={env!r} is not a number of seconds") from None
            source = f"${ENV_TIMEOUT}"
        elif group_seconds is not None:
            # A group told to wait a year waits as long as the shim can.
            seconds, source = min(group_seconds, MAX_TIMEOUT_S), "the process group's timeout"
        else:
            seconds, source = DEFAULT_TIMEOUT_S, "default"
    elif isinstance(timeout, datetime.timedelta):
        seconds, source = timeout.total_seconds(), "timeout"
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds, source = float(timeout), "timeout"
    else:
        raise TypeError(f"timeout must be a datetime.timedelta or seconds, not {type(timeout).__name__}")
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{source} must be a positive, finite number of seconds, got {seconds}")
    if seconds > MAX_TIMEOUT_S:
        raise ValueError(f"{source} must be at most 30 days ({MAX_TIMEOUT_S:g} s), got {seconds:g}")
    return max(1, round(seconds * 1000))
