"""torchrun that also runs on Debian's PyTorch 1.13 under Python 3.11.

    python3 -m ddp_agent.torchrun --standalone --nproc_per_node 2 train.py

(from a checkout: ``scripts/torchrun_compat.py``, the same). Takes torchrun's arguments and runs ``torch.distributed.run.main`` with them,
so the tests and benchmarks can compare ddp-agent with torchrun using the
PyTorch the machine has.

Why a wrapper: torch 1.13's ``Std.from_str`` (how torchrun parses
``--redirects`` and ``--tee``, default "0") finds the member for a value by
iterating the ``IntFlag``. Python 3.11 changed what iterating a flag yields:
only the single-bit members, so NONE (0) and ALL (3) are never found and
``from_str("0")`` returns None, which torchrun then fails on before it starts
a worker. The fix looks the value up instead (``Std(3)`` is ALL on every
Python). Where ``from_str`` already works (torch 2.x, or Python before 3.11)
nothing is patched and this is plain torchrun.
"""

import re
import sys
from typing import Dict, Union

from torch.distributed.elastic.multiprocessing import api
from torch.distributed.run import main


def _from_str_broken() -> bool:
    """Reports whether Std.from_str loses the zero and multi-bit members (torch 1.13 on Python 3.11)."""
    return api.Std.from_str("0") is not api.Std.NONE or api.Std.from_str("3") is not api.Std.ALL


def _from_str(vm: str) -> Union["api.Std", Dict[int, "api.Std"]]:
    """Std.from_str as torch 1.13 means it: "3" -> ALL, "0:3,1:0" -> {0: ALL, 1: NONE}."""
    if re.match(api._VALUE_REGEX, vm):
        return api.Std(int(vm))
    if re.match(api._MAPPING_REGEX, vm):
        return {int(i): api.Std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match: <{api._VALUE_REGEX}> or <{api._MAPPING_REGEX}>")


def run() -> int:
    """torchrun's main, with Std.from_str fixed where it is broken."""
    if _from_str_broken():
        api.Std.from_str = staticmethod(_from_str)  # type: ignore[method-assign]
    return main()


if __name__ == "__main__":
    sys.exit(run())
