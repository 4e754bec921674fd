"""Whether all ranks use NCCL, and with which features: agreed at the first NCCL bucket.

All ranks reach their first NCCL bucket at the same bucket, so they decide
together whether to use NCCL (a rank without it would otherwise hang the
others' bootstrap) and which features all have. :func:`decide` makes the
decision from every rank's answer; :class:`NcclAgreement` gathers the
answers through torch's store and remembers the outcome.
"""

import json
import logging
from typing import Any, Dict, List, NamedTuple, Optional

from . import _shim
from ._bootstrap import Communicators
from ._failure import FirstError
from ._shim import ShimError, Status

log = logging.getLogger("ddp_agent")


class NcclPlan(NamedTuple):
    """What every rank agreed on at the first NCCL bucket."""

    ok: bool  # every rank has NCCL
    avg: bool  # every rank's NCCL has ncclAvg
    bfloat16: bool  # every rank's NCCL has ncclBfloat16
    why: str  # when not ok: the ranks without NCCL and their reasons
    describe: str  # when ok: "NCCL 2.20.5 (libnccl.so.2)"


def summary() -> Dict[str, Any]:
    """Returns this rank's answer: whether it can load NCCL, its version, source and features."""
    try:
        mine = _shim.nccl_info()
    except ShimError as e:
        mine = {"found": False, "error": str(e)}
    features = mine.get("features") or {}
    return {
        "found": bool(mine.get("found")),
        "version": str(mine.get("version") or ""),
        "source": str(mine.get("source") or ""),
        "avg": bool(features.get("avg")),
        "bfloat16": bool(features.get("bfloat16")),
        "error": str(mine.get("error") or ""),
    }


def decide(everyone: List[Dict[str, Any]], mine: Dict[str, Any]) -> NcclPlan:
    """Returns the plan for every rank's summary (in rank order); mine names this rank's NCCL source."""
    missing: Dict[str, List[int]] = {}  # reason -> ranks
    for r, s in enumerate(everyone):
        if not s["found"]:
            missing.setdefault(s["error"] or "NCCL not found", []).append(r)
    if missing:
        n = sum(len(ranks) for ranks in missing.values())
        reasons = "; ".join(f"{_ranks(ranks)}: {reason}" for reason, ranks in missing.items())
        why = f"NCCL cannot be loaded on {n} of {len(everyone)} ranks ({reasons})"
        return NcclPlan(False, False, False, why, "")
    versions = sorted({s["version"] for s in everyone})
    describe = f"NCCL {', '.join(versions)} ({mine['source']} here)"
    return NcclPlan(True, all(s["avg"] for s in everyone), all(s["bfloat16"] for s in everyone), "", describe)


class NcclAgreement:
    """Agrees on an :class:`NcclPlan` once, at the first call of :meth:`plan`, and remembers it (or its failure)."""

    def __init__(self, comms: Communicators, failure: FirstError) -> None:
        self._comms = comms
        self._failure = failure
        self._plan: Optional[NcclPlan] = None
        self._error: Optional[BaseException] = None

    def plan(self) -> NcclPlan:
        """Returns what all ranks agreed on about NCCL; agrees at the first call (blocks for the store)."""
        if self._plan is not None:
            return self._plan
        if self._error is not None:
            raise ShimError(
                Status.UNAVAILABLE,
                f"the NCCL check of {self._comms.name} failed earlier: {self._error}",
                "ddp_agent hook",
            )
        try:
            self._plan = self._agree()
        except Exception as e:
            self._error = e
            self._failure.record(e)
            raise
        return self._plan

    def _agree(self) -> NcclPlan:
        """Exchanges every rank's summary through torch's store and decides; blocks up to the timeout."""
        self._comms.agree_attempt()  # first: a collective every rank must reach (Communicators.agree_attempt)
        mine = summary()
        name = self._comms.name_of("nccl")
        values = self._comms.exchange(name, "nccl", json.dumps(mine), f"NCCL check of {name}", "whether it has NCCL")
        plan = decide([json.loads(v) for v in values], mine)
        if not plan.ok:
            if mine["found"]:
                log.warning("ddp_agent: %s", plan.why)
            return plan
        log.info("ddp_agent: %s: %s, avg %s, bfloat16 %s", name, plan.describe, plan.avg, plan.bfloat16)
        return plan


def _ranks(ranks: List[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
