"""A PyTorch Lightning job with ddp_agent's comm hook: the lines that change
are the import and ``strategy=DDPAgentStrategy()`` (docs/lightning.md).

    ddp-agent run --standalone --nproc-per-node 2 examples/frameworks/lightning_train.py
    torchrun --standalone --nproc-per-node 2 examples/frameworks/lightning_train.py   # beside a sidecar

CPU and gloo by default. The faults the tests inject: --fail-rank raises at
--fail-at-step on the first attempt; --slow-rank sleeps --slow-seconds in
every training step, before its backward (a persistent straggler).
"""

import argparse
import hashlib
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl

try:
    from ddp_agent.lightning import DDPAgentStrategy
except ImportError:  # not installed: the checkout's python/ (as a user has it installed)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    from ddp_agent.lightning import DDPAgentStrategy


def say(line):
    """Prints line in one write(2): ranks that share a stdout (srun's, torchrun's, a pipe) then
    never run two lines together, as print's separate writes of the text and the newline can."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--comm-hook", choices=["ddp-agent", "none"], default="ddp-agent")
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-at-step", type=int, default=-1)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-seconds", type=float, default=0.05)
    p.add_argument("--step-seconds", type=float, default=0.0, help="every rank sleeps this long per step")
    return p.parse_args()


class Model(pl.LightningModule):
    def __init__(self, args):
        super().__init__()
        self.args = args
        self.net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))

    def training_step(self, batch, _):
        a, rank = self.args, self.global_rank
        if rank == a.fail_rank and self.global_step == a.fail_at_step and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            raise RuntimeError(f"rank {rank} fails at step {self.global_step} on purpose")
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        if a.step_seconds:
            time.sleep(a.step_seconds)
        if rank == a.slow_rank:
            time.sleep(a.slow_seconds)  # between forward and backward: compute
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main():
    args = parse_args()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.steps * args.batch_size * 4, 32, generator=g)
    data = DataLoader(TensorDataset(x, (x[:, :4] @ torch.randn(4, 4, generator=g)).argmax(1)), batch_size=args.batch_size)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    nodes = int(os.environ.get("WORLD_SIZE", "1")) // local
    strategy = DDPAgentStrategy(process_group_backend="gloo") if args.comm_hook == "ddp-agent" else "ddp"
    trainer = pl.Trainer(accelerator="cpu", devices=local, num_nodes=nodes, strategy=strategy, max_steps=args.steps,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    model = Model(args)
    rank = trainer.global_rank
    say(f"rank {rank}/{trainer.world_size} comm hook: {args.comm_hook} "
          f"restart_count {os.environ.get('TORCHELASTIC_RESTART_COUNT', '?')}")
    trainer.fit(model, data)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    say(f"params rank={rank} sha256={digest}")
    say(f"rank {rank} done: steps={trainer.global_step}")


if __name__ == "__main__":
    main()
