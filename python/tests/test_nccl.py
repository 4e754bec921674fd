"""The hook's NCCL transport, on the CPU, over the fake NCCL (shim/nccl/testdata/fakenccl.c).

The fake is a libnccl.so.2 that works on host memory, its ranks being
processes that share a directory; the shim loads it through
$DDP_AGENT_NCCL_LIB. With transport="nccl" a CPU bucket goes through the
same NCCL communicator a CUDA bucket would, with no stream, so real DDP on
gloo exercises everything of the NCCL path but the streams: the agreement
between ranks on whether NCCL is there, the bootstrap, avg or divide-first
by NCCL version, compression, failures with NCCL's own words, timeouts.

Parity: the fake sums in rank order in float32 and divides once (avg), so
the hook's parameters are bit-identical across ranks and close to DDP's
built-in all-reduce (which divides first, in gloo's order; as test_ddp
explains). With compression each rank casts to the half type and divides,
the fake sums the halves in float32 in rank order and rounds once; the
worker does exactly that with gloo (all_gather) as a reference, and the
hook must match it bit for bit.

PyTorch 2.x from PyPI brings its own NCCL (nvidia-nccl-*) into every process
that imports torch, and the shim takes an NCCL already there before
$DDP_AGENT_NCCL_LIB (as it must on a GPU: the one PyTorch uses). There the
workers get the fake through LD_PRELOAD, so it is the NCCL in the process
(source "process") and the real one, still loaded, is never called; the
three tests of a rank without NCCL cannot have one there and are skipped.

Skipped without gcc, or when the shim predates ddpshim_nccl_info.
"""

import ctypes
import ctypes.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List

import pytest
import torch

import _world
from _ddp_worker import STEPS
from test_ddp import MLP_PARAMS, assert_bit_identical, assert_close, load

ROOT = pathlib.Path(__file__).resolve().parents[2]
FAKE_SOURCE = ROOT / "shim" / "nccl" / "testdata" / "fakenccl.c"


def _shim_has_nccl() -> bool:
    try:
        return hasattr(ctypes.CDLL(os.environ["DDP_AGENT_SHIM"]), "ddpshim_nccl_info")
    except (KeyError, OSError):
        return False


pytestmark = [
    pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build the fake NCCL"),
    pytest.mark.skipif(not _shim_has_nccl(), reason="the shim has no ddpshim_nccl_info (rebuild: make build)"),
]

def _torch_nccl() -> str:
    """The libnccl that importing torch loaded into this process, or "" (Debian's torch has none)."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if os.path.basename(path).startswith("libnccl.so"):
                return path
    return ""


TORCH_NCCL = _torch_nccl()
needs_no_torch_nccl = pytest.mark.skipif(
    bool(TORCH_NCCL), reason=f"torch {torch.__version__} loads its own NCCL ({TORCH_NCCL}): no rank can lack one"
)

# ncclDataType_t and ncclRedOp_t values, as the fake records them.
FLOAT16, FLOAT32, BFLOAT16 = 6, 7, 9
SUM, AVG = 0, 4
COMPRESSED_DTYPE = {"none": FLOAT32, "fp16": FLOAT16, "bf16": BFLOAT16}
# Compressed gradients against the built-in float32 all-reduce after six
# steps (measured, 2 ranks: fp16 1e-6, bf16 1.2e-5 absolute at most).
COMPRESSED_TOLERANCE = {"fp16": dict(rtol=1e-3, atol=1e-4), "bf16": dict(rtol=1e-2, atol=1e-3)}


@pytest.fixture(scope="session")
def fake_nccl(tmp_path_factory) -> pathlib.Path:
    """The fake libnccl.so.2, built once per session."""
    out = tmp_path_factory.mktemp("fakenccl") / "libnccl.so.2"
    r = subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O2", "-pthread", "-o", str(out), str(FAKE_SOURCE)],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, f"building the fake NCCL failed:\n{r.stderr}"
    return out


class FakeDir:
    """A short directory for the fake's per-communicator files (they hold every bucket; removed after)."""

    def __enter__(self) -> str:
        # The fake's unique id holds the path: it must stay short, whatever $TMPDIR is.
        self.path = tempfile.mkdtemp(prefix="fakenccl-", dir="/tmp" if os.path.isdir("/tmp") else None)
        return self.path

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def fake_env(lib: pathlib.Path, fake_dir: str, cuda: bool = False, **knobs: str) -> Dict[str, str]:
    """The fake NCCL's environment; with cuda, the same library is the CUDA driver too (the shim's watchdog records events)."""
    env = {"DDP_AGENT_NCCL_LIB": str(lib), "FAKE_NCCL_DIR": fake_dir, "DDP_AGENT_CUDA_LIB": str(lib) if cuda else ""}
    if TORCH_NCCL:  # the fake goes before torch's NCCL in the process (see the module's comment)
        env["LD_PRELOAD"] = " ".join(p for p in (str(lib), os.environ.get("LD_PRELOAD", "")) if p)
    for k in ("FAKE_NCCL_VERSION", "FAKE_NCCL_INPROGRESS", "FAKE_NCCL_FAIL", "FAKE_NCCL_HANG", "FAKE_NCCL_RECORD",
              "FAKE_CUDA_KERNEL_MS", "FAKE_CUDA_FAIL"):
        env[k] = ""  # none inherited from the caller's environment
    for k, v in knobs.items():  # hang="stream" is FAKE_NCCL_HANG, cuda_kernel_ms="5" FAKE_CUDA_KERNEL_MS
        env["FAKE_CUDA_" + k[5:].upper() if k.startswith("cuda_") else f"FAKE_NCCL_{k.upper()}"] = v
    return env


def fake_source(lib: pathlib.Path) -> str:
    """Where the shim reports the fake came from: its path, or "process" when preloaded."""
    return "process" if TORCH_NCCL else str(lib)


# -- parity -------------------------------------------------------------------

# (ranks, FAKE_NCCL_VERSION, FAKE_NCCL_INPROGRESS): 2.20.5 has avg and
# bfloat16, 2.9.4 neither (float32 is divided first and summed, and there is
# no bf16 compression); the in-progress knob makes every non-blocking enqueue
# report ncclInProgress a few times first.
# The last: register(launch="thread"), the launcher thread issuing the buckets.
WORLDS = [(2, 22005, 0, "inline"), (3, 22005, 3, "inline"), (2, 2904, 0, "inline"), (3, 2904, 0, "inline"),
          (3, 22005, 3, "thread")]


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"{w[0]}ranks-v{w[1]}" + ("-inprogress" if w[2] else "")
                + ("-thread" if w[3] == "thread" else ""))
def nccl_world(request, tmp_path_factory, fake_nccl):
    world_size, version, inprogress, launch = request.param
    workdir = tmp_path_factory.mktemp(f"nccl{world_size}v{version}{launch}")
    compressions = ["none", "fp16", "bf16"] if version >= 21000 else ["none", "fp16"]
    record = workdir / "record.txt"
    with FakeDir() as fake_dir:
        env = fake_env(fake_nccl, fake_dir, version=str(version), inprogress=str(inprogress), record=str(record))
        results = _world.run_world(
            workdir, world_size,
            ["nccl", "--out", str(workdir), "--transport", "nccl", "--compressions", ",".join(compressions),
             "--launch", launch],
            timeout=240, env=env,
        )
    _world.check_ok(results)
    for r in load(workdir, world_size):
        for name in compressions:  # the launch asked for is the one that ran
            assert r[name]["launch"] == launch and r[name]["launcher_ran"] == (launch == "thread"), r[name]
    return dict(
        world_size=world_size, version=version, compressions=compressions, fake=fake_nccl,
        results=load(workdir, world_size), record=record.read_text().splitlines(),
    )


def test_parity_with_builtin_allreduce(nccl_world):
    results = nccl_world["results"]
    builtin = [r["builtin"] for r in results]
    init = [p.detach() for p in _init_params()]
    for name in nccl_world["compressions"]:
        hooked = [r[name] for r in results]
        assert_bit_identical(hooked, f"nccl, compression {name}")
        assert hooked[0]["steps"] == STEPS
        assert any(not torch.equal(p, q) for p, q in zip(hooked[0]["params"], init)), "the parameters never moved"
        for rank, (h, b) in enumerate(zip(hooked, builtin)):
            if name == "none":
                assert_close(h["params"], b["params"], f"nccl, rank {rank}")
                continue
            tol = COMPRESSED_TOLERANCE[name]
            for i, (g, w) in enumerate(zip(h["params"], b["params"])):
                assert torch.allclose(g, w, **tol), (
                    f"compression {name}, rank {rank}: parameter {i} differs from the built-in all-reduce's "
                    f"by up to {(g - w).abs().max().item():.3g} (tolerance {tol})"
                )
            emulated = results[rank][f"{name}_emulated"]["params"]
            for i, (g, w) in enumerate(zip(h["params"], emulated)):
                assert torch.equal(g, w), (
                    f"compression {name}, rank {rank}: parameter {i} differs from gloo's emulation of "
                    f"cast, divide, sum in rank order and round once, by up to {(g - w).abs().max().item():.3g}"
                )


def _init_params() -> List[torch.Tensor]:
    from _ddp_worker import make_model

    return list(make_model("default").parameters())


def test_ops_and_types_reach_nccl(nccl_world):
    """What the fake saw: one communicator per registration, avg only where the version has it."""
    world_size, version = nccl_world["world_size"], nccl_world["version"]
    avg = version >= 21000
    for rank in range(world_size):
        segments = _collectives_by_comm(nccl_world["record"], rank)
        assert len(segments) == len(nccl_world["compressions"]), segments
        for name, calls in zip(nccl_world["compressions"], segments):
            want_op = AVG if name == "none" and avg else SUM
            assert {(c["dtype"], c["op"]) for c in calls} == {(COMPRESSED_DTYPE[name], want_op)}, (name, calls[:3])
            assert all(c["inplace"] == 1 for c in calls)
            assert sum(c["count"] for c in calls) == STEPS * MLP_PARAMS, name
            info = nccl_world["results"][rank][name]["info"]
            assert info["collectives"] == len(calls), info
    for rank, r in enumerate(nccl_world["results"]):
        info = r["none"]["info"]
        assert (info["transport"], info["rank"], info["world_size"]) == ("nccl", rank, world_size), info
        assert info["nccl"]["source"] == fake_source(nccl_world["fake"]), info
        assert info["nccl"]["version"] == _version_string(version), info
        assert info["nccl"]["nonblocking"] == (version >= 21400), info


def _collectives_by_comm(record: List[str], rank: int) -> List[List[dict]]:
    """The fake's record of rank: its all-reduces, one list per communicator (split at each init)."""
    segments: List[List[dict]] = []
    for line in record:
        fields = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
        if fields.get("rank") != str(rank):
            continue
        if line.startswith("init "):
            segments.append([])
        elif line.startswith("allreduce "):
            segments[-1].append({k: int(fields[k]) for k in ("seq", "count", "dtype", "op", "inplace")})
    return segments


def _version_string(code: int) -> str:
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def test_cpu_buckets_never_touch_torch_cuda(nccl_world):
    for rank, r in enumerate(nccl_world["results"]):
        assert r["cuda_touched"] == [], f"rank {rank} called torch.cuda: {r['cuda_touched']}"


# -- failures -------------------------------------------------------------------

NCCL_SYSTEM_ERROR = "unhandled system error"  # ncclGetErrorString(ncclSystemError)


def run_fail(tmp_path, fake_nccl, *, timeout: float = 30, compression: str = "none", world_size: int = 2,
             per_rank_env=None, cuda: bool = False, steps: int = 6, step_sleep: float = 0, launch: str = "inline",
             **knobs) -> List[dict]:
    with FakeDir() as fake_dir:
        results = _world.run_world(
            tmp_path, world_size,
            ["nccl_fail", "--out", str(tmp_path), "--transport", "nccl", "--timeout", str(timeout),
             "--compressions", compression, "--steps", str(steps), "--step-sleep", str(step_sleep),
             "--launch", launch],
            timeout=timeout + steps * step_sleep + 60, env=fake_env(fake_nccl, fake_dir, cuda=cuda, **knobs),
            per_rank_env=per_rank_env,
        )
    _world.check_ok(results)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world_size)]


@pytest.mark.parametrize(
    "knobs, words",
    [
        # The enqueue fails: the fake's ncclAllReduce sets an asynchronous
        # system error; ncclGetLastError (2.13+) adds the fake's own words.
        (dict(fail="allreduce"), ["injected allreduce failure", "bucket 0 is on the CPU"]),
        # ncclCommInitRankConfig fails: the communicator opens at the first bucket.
        (dict(fail="init"), ["injected init failure", "ncclCommInitRankConfig"]),
        # A blocking communicator (before 2.14) reports it by its async error; no ncclGetLastError before 2.13.
        (dict(fail="allreduce", version="2904"), ["ncclAllReduce", "bucket 0 is on the CPU"]),
    ],
    ids=["allreduce", "init", "allreduce-blocking"],
)
def test_nccl_failure_raises_in_backward_with_nccls_words(tmp_path, fake_nccl, knobs, words):
    for rank, res in enumerate(run_fail(tmp_path, fake_nccl, **knobs)):
        assert res["error"] is not None, f"rank {rank} trained on: {res}"
        assert res["step"] == 0 and res["steps_done"] == 0, res
        assert "ShimError" in res["error"], res["error"]
        for w in [NCCL_SYSTEM_ERROR, *words]:
            assert w in res["error"], f"rank {rank}: {w!r} not in {res['error']}"
            assert w in res["hook_error_message"], res
        assert res["seconds"] < 10, res
        # The hook keeps the failure and refuses the next bucket at once.
        assert res["hook_error_code"] is not None, res
        assert "ShimError" in res["later"] and "earlier failure" in res["later"], res["later"]
        assert NCCL_SYSTEM_ERROR in res["later"], res["later"]
        assert res["later_seconds"] < 1, res
        assert res["close_seconds"] < 5, res


def test_nccl_failure_from_the_launcher_thread_raises_in_backward(tmp_path, fake_nccl):
    """launch="thread": the failure happens on the launcher thread; backward still raises it, with NCCL's words."""
    for rank, res in enumerate(run_fail(tmp_path, fake_nccl, launch="thread", fail="allreduce")):
        assert res["error"] is not None, f"rank {rank} trained on: {res}"
        assert res["step"] == 0 and res["steps_done"] == 0, res
        assert "ShimError" in res["error"], res["error"]
        for w in (NCCL_SYSTEM_ERROR, "injected allreduce failure", "bucket 0 is on the CPU"):
            assert w in res["error"], f"rank {rank}: {w!r} not in {res['error']}"
            assert w in res["hook_error_message"], res
        assert res["seconds"] < 10, res
        assert "ShimError" in res["later"] and "earlier failure" in res["later"], res["later"]
        assert res["close_seconds"] < 5, res


def test_hung_nccl_times_out(tmp_path, fake_nccl):
    timeout = 3.0
    for rank, res in enumerate(run_fail(tmp_path, fake_nccl, timeout=timeout, hang="allreduce")):
        assert res["error"] is not None and res["step"] == 0, res
        assert res["hook_error_code"] == "TIMEOUT", res
        assert "timeout" in res["error"] and "DDPSHIM_ERR_TIMEOUT" in res["error"], res["error"]
        assert timeout - 0.5 <= res["seconds"] <= timeout + 5, res
        assert res["later_code"] == "ABORTED" and res["later_seconds"] < 1, res
        assert res["close_seconds"] < 5, res


def test_gpu_side_hang_aborts_at_the_timeout(tmp_path, fake_nccl):
    """Each enqueue succeeds, but the first collective never completes on the
    "GPU" (the fake driver's stream stays busy, as when a peer never joins):
    the shim's watchdog aborts the communicator at the timeout, and the next
    hook call raises, naming the step and bucket that hung."""
    timeout, step_sleep = 1.0, 0.2
    results = run_fail(tmp_path, fake_nccl, timeout=timeout, cuda=True, hang="stream", steps=40, step_sleep=step_sleep)
    for rank, res in enumerate(results):
        assert res["error"] is not None, f"rank {rank} trained on: {res}"
        assert res["hook_error_code"] == "ABORTED", res
        assert re.search(r"all-reduce of step 0 bucket \d+ .* has not completed on the GPU", res["error"]), res["error"]
        assert f"(timeout {timeout:g}s)" in res["error"], res["error"]
        # Aborted at the timeout (polled every millisecond), raised at the next
        # bucket; the slack is for a loaded 2-core machine, not for the watchdog.
        assert timeout <= res["since_start"] <= timeout + 2 * step_sleep + 4, res
        assert res["later_code"] == "ABORTED" and res["later_seconds"] < 1, res
        assert res["close_seconds"] < 5, res


def test_gpu_timing_leaves_training_alone(tmp_path, fake_nccl):
    """With the fake driver and collectives that take 5 ms on the "GPU", the
    watchdog times every collective and training runs to the end."""
    results = run_fail(tmp_path, fake_nccl, cuda=True, cuda_kernel_ms="5")
    for rank, res in enumerate(results):
        assert res["error"] is None and res["steps_done"] == 6, res
        assert res["hook_error_code"] is None, res


@needs_no_torch_nccl
def test_no_nccl_anywhere(tmp_path, fake_nccl):
    nowhere = tmp_path / "no-such-dir" / "libnccl.so.2"
    results = run_fail(tmp_path, fake_nccl, per_rank_env={r: {"DDP_AGENT_NCCL_LIB": str(nowhere)} for r in (0, 1)})
    for rank, res in enumerate(results):
        assert res["hook_error_code"] == "UNAVAILABLE", res
        assert "NCCL cannot be loaded on 2 of 2 ranks" in res["error"], res["error"]
        for place in ("process", "libnccl.so.2", str(nowhere)):
            assert place in res["error"], f"{place!r} not named: {res['error']}"
        assert res["seconds"] < 10, res


@needs_no_torch_nccl
def test_nccl_missing_on_one_rank_fails_all_at_once(tmp_path, fake_nccl):
    """Rank 1 has no NCCL: the ranks agree on it at the first bucket, instead of
    rank 0 waiting in the NCCL bootstrap for a rank that will never come."""
    nowhere = tmp_path / "no-such-dir" / "libnccl.so.2"
    results = run_fail(tmp_path, fake_nccl, timeout=60, per_rank_env={1: {"DDP_AGENT_NCCL_LIB": str(nowhere)}})
    for rank, res in enumerate(results):
        assert res["hook_error_code"] == "UNAVAILABLE", res
        assert re.search(r"NCCL cannot be loaded on 1 of 2 ranks \(rank 1: .*no-such-dir", res["error"]), res["error"]
        assert res["seconds"] < 10, res


def test_bf16_compression_needs_nccl_2_10(tmp_path, fake_nccl):
    for res in run_fail(tmp_path, fake_nccl, compression="bf16", version="2904"):
        assert "ValueError" in res["error"] and "2.10" in res["error"] and "2.9.4" in res["error"], res["error"]
        assert "compression='fp16'" in res["error"], res["error"]


# -- ddp_agent.info() ------------------------------------------------------------


def run_info(env: Dict[str, str]) -> Dict[str, dict]:
    code = "import json, ddp_agent\nprint(json.dumps({t: ddp_agent.info(t) for t in ('auto', 'host', 'nccl')}))\n"
    r = subprocess.run([sys.executable, "-c", code], env=_world.worker_env(env), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("version, want, features", [(22005, "2.20.5", True), (2904, "2.9.4", False)])
def test_info_reports_the_fake(fake_nccl, version, want, features):
    with FakeDir() as fake_dir:
        got = run_info(fake_env(fake_nccl, fake_dir, version=str(version)))
    auto = got["auto"]
    nccl = auto["nccl"]
    assert nccl["found"] is True and nccl["source"] == fake_source(fake_nccl) and nccl["version"] == want, nccl
    assert nccl["features"]["avg"] is features and nccl["features"]["bfloat16"] is features, nccl
    assert auto["shim"]["version"].startswith("ddpshim ") and auto["shim"]["path"] == os.environ["DDP_AGENT_SHIM"]
    assert auto["torch"]["version"] == torch.__version__
    assert auto["torch"]["cuda_available"] == torch.cuda.is_available()
    assert (auto["transport"]["cpu"], auto["transport"]["cuda"]) == ("host", "nccl"), auto["transport"]
    assert (got["host"]["transport"]["cpu"], got["host"]["transport"]["cuda"]) == ("host", None)
    assert (got["nccl"]["transport"]["cpu"], got["nccl"]["transport"]["cuda"]) == ("nccl", "nccl")


@needs_no_torch_nccl
def test_info_without_nccl_names_every_place_tried(tmp_path):
    if ctypes.util.find_library("nccl"):
        pytest.skip("this machine has an NCCL on the loader's path")
    nowhere = tmp_path / "no-such-dir" / "libnccl.so.2"
    got = run_info({"DDP_AGENT_NCCL_LIB": str(nowhere)})
    nccl = got["auto"]["nccl"]
    assert nccl["found"] is False, nccl
    for place in ("process", "libnccl.so.2", str(nowhere)):
        assert place in nccl["error"], f"{place!r} not in {nccl['error']}"
    auto = got["auto"]["transport"]
    assert (auto["cpu"], auto["cuda"]) == ("host", "torch.distributed"), auto
    assert nccl["error"] in auto["why"], auto
    assert (got["nccl"]["transport"]["cpu"], got["nccl"]["transport"]["cuda"]) == (None, None)
