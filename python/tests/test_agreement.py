"""The NCCL agreement's decision, from every rank's answer, without a store."""

from ddp_agent._agreement import NcclPlan, decide


def _rank(found=True, version="2.20.5", avg=True, bfloat16=True, error="", source="libnccl.so.2"):
    return {"found": found, "version": version, "source": source, "avg": avg, "bfloat16": bfloat16, "error": error}


def test_every_rank_has_nccl():
    everyone = [_rank(), _rank(version="2.18.1", bfloat16=False)]
    got = decide(everyone, everyone[0])
    assert got == NcclPlan(True, True, False, "", "NCCL 2.18.1, 2.20.5 (libnccl.so.2 here)"), got


def test_ranks_without_nccl_are_named_with_their_reasons():
    everyone = [_rank(), _rank(found=False, error="no libnccl"), _rank(found=False), _rank(found=False, error="no libnccl")]
    got = decide(everyone, everyone[0])
    assert not got.ok and not got.avg and not got.bfloat16 and got.describe == "", got
    assert got.why == "NCCL cannot be loaded on 3 of 4 ranks (ranks 1, 3: no libnccl; rank 2: NCCL not found)", got
