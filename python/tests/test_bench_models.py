"""examples/bench/hook_models.py end to end, smallest run: two real gloo ranks, ResNet-50 scaled down.

The benchmark's figures are not asserted (a loaded CI machine moves them);
what is: it runs on this PyTorch, the hook and DDP's default all-reduce leave
the two copies bit-identical on both ranks, and every call DDP made to the
hook was timed.
"""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_hook_models_smallest_run(tmp_path):
    out = tmp_path / "result.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "bench" / "hook_models.py"), "--models", "resnet50",
         "--rounds", "2", "--steps-per-round", "1", "--warmup", "1", "--timeout", "240", "--json", str(out)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())["models"]["resnet50"]
    assert res["identical"], res
    assert res["rounds"] == 2
    assert res["buckets_per_step"] >= 2, res  # the bucket cap scaled with the model: several buckets
    assert res["hook_us_per_bucket"] > 0 and res["hook_step_ms"] > 0 and res["default_step_ms"] > 0
    assert "| resnet50: ResNet-50" in r.stdout
