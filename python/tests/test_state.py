"""ddp_agent._state.move: the source's state on every rank, bit for bit, through the shim's broadcast.

Three real gloo ranks with the hook's host communicator: the source (rank
1, not 0) holds -0.0 and +0.0, infinities, float64, int64, a tied tensor
listed twice, a bool, float16 with 2-byte elements, an odd number of bytes,
a 0-dim and a complex tensor, and a non-contiguous one (broadcast by torch);
the others hold other values. Every rank must end with the source's bytes.
"""

import re

import _world

WORKER = _world.TESTS_DIR / "_state_worker.py"


def test_move_is_a_bit_exact_broadcast(tmp_path):
    results = _world.run_world(tmp_path, 3, [], script=WORKER, timeout=120)
    _world.check_ok(results)
    lines = [re.search(r"rank \d digest (\w+) bytes (\d+) signbit0 (\w+) signbit1 (\w+)", r.stdout) for r in results]
    assert all(lines), [r.stdout + r.stderr for r in results]
    assert len({m.group(1) for m in lines}) == 1, [m.group(0) for m in lines]
    # -0.0 stays -0.0 and +0.0 stays +0.0 on the receivers; the tied tensor counts once.
    assert all(m.group(3) == "True" and m.group(4) == "False" for m in lines), [m.group(0) for m in lines]
    assert {int(m.group(2)) for m in lines} == {1000 * 4 + 35 * 8 + 64 * 8 + 300 * 4 + 10 + 24 * 4 + 30000 * 4 + 80002 + 70001 + 4 + 160}
