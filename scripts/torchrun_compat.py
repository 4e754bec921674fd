"""torchrun that also runs on Debian's PyTorch 1.13 under Python 3.11, from a checkout.

    /usr/bin/python3 scripts/torchrun_compat.py --standalone --nproc_per_node 2 examples/train.py

The wrapper is the package's ``ddp_agent.torchrun`` (``python3 -m ddp_agent.torchrun`` where the
wheel is installed); see there why it is needed. This script runs the checkout's copy.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from ddp_agent.torchrun import run  # noqa: E402

if __name__ == "__main__":
    sys.exit(run())
