"""The comm hook under PyTorch Lightning: a DDP strategy that registers it.

    from ddp_agent.lightning import DDPAgentStrategy
    trainer = Trainer(strategy=DDPAgentStrategy(), ...)
    trainer = Trainer(strategy="ddp_agent", ...)   # the same, by name, once this module is imported

``DDPAgentStrategy`` is Lightning's ``DDPStrategy`` (every argument it takes
is passed on) that registers ``ddp_agent.register`` on the model once
Lightning has wrapped it in ``DistributedDataParallel``, and closes the hook
when the strategy tears down, before the process group goes. The hook's
own options (``transport``, ``compression``, ``timeout``, ``launch``) go in
``hook_options``.

Why not ``DDPStrategy(ddp_comm_hook=...)``: Lightning registers a comm hook
only when the model is on CUDA, so on CPU it is silently dropped, and the
hook needs a forward pre-hook beside it (the step count the agent reads),
which a bare ``ddp_comm_hook`` function cannot add.

Works with the ``lightning`` package (``lightning.pytorch``) and with
``pytorch_lightning``; importing this module imports one of them.
"""

from typing import Any, Dict, Optional

try:
    from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
except ImportError:  # the standalone package
    from pytorch_lightning.strategies import DDPStrategy, StrategyRegistry  # type: ignore[no-redef]

from .hook import Hook, register


class DDPAgentStrategy(DDPStrategy):
    """Lightning's DDP strategy with ddp_agent's gradient all-reduce."""

    strategy_name = "ddp_agent"

    def __init__(self, *args: Any, hook_options: Optional[Dict[str, Any]] = None, **kwargs: Any) -> None:
        if kwargs.get("ddp_comm_hook") is not None:
            raise ValueError("DDPAgentStrategy registers ddp_agent's comm hook; drop ddp_comm_hook")
        super().__init__(*args, **kwargs)
        self._hook_options = dict(hook_options or {})
        self.hook: Optional[Hook] = None

    def configure_ddp(self) -> None:
        super().configure_ddp()  # wraps the model in DistributedDataParallel
        self.hook = register(self.model, **self._hook_options)

    def teardown(self) -> None:
        # Before Lightning unwraps the model and the process group goes.
        if self.hook is not None:
            self.hook.close()
            self.hook = None
        super().teardown()


# By name too (Trainer(strategy="ddp_agent")), as Lightning's own
# strategies are: importing this module registers it.
if DDPAgentStrategy.strategy_name not in StrategyRegistry:
    StrategyRegistry.register(DDPAgentStrategy.strategy_name, DDPAgentStrategy,
                              description="DDP with ddp_agent's gradient all-reduce (ddp_agent.lightning)")
