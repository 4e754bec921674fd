"""``python -m ddp_agent``: the ``ddp-agent`` command, as ``python -m
torch.distributed.run`` is torchrun. The workers' ``--python`` defaults to
the interpreter that ran it."""

from ._cli import main

if __name__ == "__main__":
    main()
