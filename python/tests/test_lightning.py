"""ddp_agent.lightning without a launch: the strategy by name. Needs Lightning (the torch 2.x pass has it)."""

import pytest

pl = pytest.importorskip("lightning.pytorch")

from ddp_agent.lightning import DDPAgentStrategy  # noqa: E402


def test_strategy_by_name():
    """Trainer(strategy="ddp_agent") is DDPAgentStrategy once ddp_agent.lightning is imported."""
    trainer = pl.Trainer(strategy="ddp_agent", accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False)
    assert isinstance(trainer.strategy, DDPAgentStrategy)
    assert trainer.strategy.hook is None  # registered once the model is wrapped
