"""Real DDP on gloo with ddp_agent's hook, against DDP's built-in all-reduce.

Each world (2, 3 and 4 ranks) is launched once and trains every mode of
_ddp_worker.MODES twice from the same seed and data: with the built-in
all-reduce and with the hook. The hook's parameters must be bit-identical
across ranks and close to the built-in run's. They are not bit-identical to
it: the built-in reducer divides each rank's gradient by the world size and
then sums (x/n + y/n), the shim sums in its own order (chunks of a ring) and
divides once ((x + y)/n); the results differ in the last bits, which six SGD
steps carry into the parameters:

    float32: rtol 1e-5, atol 1e-6     (measured: < 1e-8 absolute)
    float64: rtol 1e-10, atol 1e-12
    float16: rtol 2e-3, atol 2e-3     (float16's epsilon is 1e-3)
"""

import pathlib
from typing import Dict, List

import pytest
import torch

import _world
from _ddp_worker import MODES, STEPS, split

TOLERANCE = {
    "float32": dict(rtol=1e-5, atol=1e-6),
    "float64": dict(rtol=1e-10, atol=1e-12),
    "float16": dict(rtol=2e-3, atol=2e-3),
}
TORCH_113 = torch.__version__.startswith("1.13")

# What PyTorch 1.13 does with _ddp_worker.MLP (a: 128x512, b and c: 512x512,
# d: 512x10, plus an unused 100x100 layer for find_unused) at bucket_cap_mb=0.5:
MLP_PARAMS = 596490  # a 66048 + b 262656 + c 262656 + d 5130
UNUSED_PARAMS = 10100
# The first iteration has one bucket holding every parameter (DDP's constructor
# uses an unlimited size when find_unused_parameters is off or static_graph is
# on). The reducer rebuilds the buckets in the order gradients arrived, before
# iteration 1 (iteration 2 with static_graph): the first rebuilt bucket is capped
# at dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB), the others at bucket_cap_mb, and a
# bucket closes once it reaches its cap: [d + c], [b], [a].
REBUILT_113 = [267786, 262656, 66048]
# With find_unused_parameters (and no static_graph) the constructor buckets by
# size in reverse definition order (first 1 MiB, then bucket_cap_mb), and the
# buckets are never rebuilt.
FIND_UNUSED_113 = [15742, 262656, 328192]


def load(workdir: pathlib.Path, world_size: int) -> List[dict]:
    return [torch.load(workdir / f"rank{r}.pt") for r in range(world_size)]


def assert_bit_identical(results: List[dict], what: str) -> None:
    for r, res in enumerate(results[1:], 1):
        for i, (a, b) in enumerate(zip(results[0]["params"], res["params"])):
            assert torch.equal(a, b), f"{what}: parameter {i} differs between rank 0 and rank {r}"


def assert_close(got: List[torch.Tensor], want: List[torch.Tensor], what: str) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        tol = TOLERANCE[str(w.dtype).replace("torch.", "")]
        assert torch.allclose(g, w, **tol), (
            f"{what}: parameter {i} ({w.dtype}) differs from the built-in all-reduce's by up to "
            f"{(g - w).abs().max().item():.3g} (tolerance {tol})"
        )


def buckets_per_step(schedule: Dict[int, list], steps: int) -> List[list]:
    """Expands the hook's change-point schedule to one bucket list per step."""
    out, current = [], None
    for step in range(steps):
        current = schedule.get(step, current)
        out.append(current)
    return out


# The shim's transport between ranks on one host: shared memory unless the
# config says "shm": false. The 3-rank world takes the TCP ring that ranks on
# different hosts use.
TRANSPORT = {2: "shm", 3: "tcp", 4: "shm"}


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"{n}ranks")
def parity_world(request, tmp_path_factory):
    world_size = request.param
    workdir = tmp_path_factory.mktemp(f"parity{world_size}")
    env = {"DDP_AGENT_SHIM_CONFIG": '{"shm": false}'} if TRANSPORT[world_size] == "tcp" else {}
    results = _world.run_world(workdir, world_size, ["parity", "--out", str(workdir)], timeout=240, env=env)
    _world.check_ok(results)
    return world_size, load(workdir, world_size)


@pytest.mark.parametrize("mode", MODES)
def test_parity_with_builtin_allreduce(parity_world, mode):
    world_size, results = parity_world
    hooked = [r[mode]["hook"] for r in results]
    builtin = [r[mode]["builtin"] for r in results]
    assert_bit_identical(hooked, f"{mode}, hook")
    assert_bit_identical(builtin, f"{mode}, built-in")
    for rank in range(world_size):
        assert_close(hooked[rank]["params"], builtin[rank]["params"], f"{mode}, rank {rank}")
    # The initial weights moved: the comparison is not of untouched models.
    init = _world_init_params(mode)
    assert any(not torch.equal(p, q) for p, q in zip(hooked[0]["params"], init))


def _world_init_params(mode: str) -> List[torch.Tensor]:
    from _ddp_worker import make_model

    return [p.detach() for p in make_model(mode).parameters()]


@pytest.mark.parametrize("mode", MODES)
def test_bucket_schedule(parity_world, mode):
    world_size, results = parity_world
    hooked = [r[mode]["hook"] for r in results]
    schedule = hooked[0]["schedule"]
    for rank, h in enumerate(hooked):
        assert h["schedule"] == schedule, f"rank {rank}'s buckets differ from rank 0's"
        assert h["steps"] == STEPS
        assert h["info"]["rank"] == rank and h["info"]["world_size"] == world_size, h["info"]
        assert h["info"]["transport"] == TRANSPORT[world_size], h["info"]
    per_step = buckets_per_step(schedule, STEPS)
    # Every bucket of every step went through the shim.
    assert hooked[0]["info"]["collectives"] == sum(len(b) for b in per_step), hooked[0]["info"]
    dtype = {"float64": "float64", "float16": "float16"}.get(mode, "float32")
    for step, buckets in enumerate(per_step):
        assert [b[0] for b in buckets] == list(range(len(buckets))), f"step {step}: bucket indices {buckets}"
        assert {b[2] for b in buckets} == {dtype}

    if mode == "float16":  # 512 parameters: one bucket throughout
        assert schedule == {0: [(0, 512, "float16")]}
        return
    total = MLP_PARAMS + (UNUSED_PARAMS if mode == "find_unused" else 0)
    for buckets in per_step:
        assert sum(b[1] for b in buckets) == total
    if mode == "find_unused":
        assert list(schedule) == [0], f"buckets changed with find_unused_parameters: {schedule}"
        assert len(schedule[0]) > 1
        if TORCH_113:
            assert [b[1] for b in schedule[0]] == FIND_UNUSED_113
        return
    rebuilt_at = 2 if mode == "static_graph" else 1
    assert list(schedule) == [0, rebuilt_at], f"want one bucket, then rebuilt at step {rebuilt_at}: {schedule}"
    assert schedule[0] == [(0, total, dtype)]
    assert len(schedule[rebuilt_at]) > 1
    if TORCH_113:
        assert [b[1] for b in schedule[rebuilt_at]] == REBUILT_113


def test_subgroups(parity_world):
    world_size, results = parity_world
    sub = [r["subgroups"] for r in results]
    names = []
    for group in split(world_size):
        assert_bit_identical([sub[r]["hook"] for r in group], f"group {group}")
        for i, r in enumerate(group):
            assert_close(sub[r]["hook"]["params"], sub[r]["builtin"]["params"], f"group {group}, rank {r}")
            h = sub[r]["hook"]
            assert (h["rank"], h["world_size"]) == (i, len(group)), h
            assert (h["info"]["rank"], h["info"]["world_size"]) == (i, len(group)), h["info"]
        assert len({sub[r]["hook"]["name"] for r in group}) == 1
        names.append(sub[group[0]]["hook"]["name"])
    # The same registration count on every rank, but each group's communicator has a name of its own.
    assert names[0] != names[1], names
    # The groups trained on different data.
    assert not torch.equal(sub[0]["hook"]["params"][0], sub[-1]["hook"]["params"][0])
    # A world hook after a hook the first group's ranks alone registered:
    # one name on every rank (it hung for the timeout when names counted
    # every registration of the process), and one result.
    assert len({s["world_after"]["name"] for s in sub}) == 1, [s["world_after"]["name"] for s in sub]
    assert_bit_identical([s["world_after"] for s in sub], "world hook after a subgroup's")


def test_join_with_uneven_inputs(tmp_path):
    world_size = 3
    results = _world.run_world(tmp_path, world_size, ["join", "--out", str(tmp_path)], timeout=120)
    _world.check_ok(results)
    res = load(tmp_path, world_size)
    assert [r["batches"] for r in res] == [3, 5, 7]
    assert_bit_identical([r["hook"] for r in res], "join, hook")
    for rank in range(world_size):
        assert_close(res[rank]["hook"]["params"], res[rank]["builtin"]["params"], f"join, rank {rank}")
    # Joined ranks keep calling the hook (with zero-filled shadow buckets)
    # until the last rank is done: every rank saw all 7 iterations.
    assert [r["hook"]["steps"] for r in res] == [7, 7, 7]
    assert all(r["hook"]["schedule"] == res[0]["hook"]["schedule"] for r in res)


def test_dataloader_with_forked_workers(tmp_path):
    world_size = 2
    results = _world.run_world(tmp_path, world_size, ["dataloader", "--out", str(tmp_path)], timeout=120)
    _world.check_ok(results)
    res = load(tmp_path, world_size)
    assert_bit_identical(res, "dataloader")
    for r in res:
        assert r["steps"] == 8  # 2 epochs of 32 samples in batches of 8
        # Every sample came from a forked loader worker, where the shim refused to run.
        assert r["refused"] == [1] * 64, r["refused"]
        assert r["info"]["collectives"] == 1 + 7 * 3
        assert "ShimError" in r["after_close"] and "closed" in r["after_close"], r["after_close"]


@pytest.mark.parametrize(
    "how, codes",
    [
        ("kill", ("PEER", "TIMEOUT", "ABORTED")),  # its sockets close: the others notice at once
        ("stop", ("TIMEOUT", "PEER", "ABORTED")),  # SIGSTOP: its sockets stay open, only the timeout helps
        # An exception: the interpreter's exit handler closes the communicator
        # at once, without waiting for the others (who wait in backward), so
        # they see the peer go away well before their timeout.
        ("raise", ("PEER", "ABORTED")),
    ],
    ids=["killed", "stopped", "raised"],
)
def test_lost_rank_fails_the_others_within_the_timeout(tmp_path, how, codes):
    # Only a stopped rank needs the timeout; a dead one is noticed at once. A
    # generous timeout for those keeps a loaded CI machine (a rank descheduled
    # for seconds) from timing out a healthy step before the injected failure.
    world_size, timeout = 3, (5.0 if how == "stop" else 30.0)
    results = _world.run_world(
        tmp_path,
        world_size,
        ["die", "--out", str(tmp_path), "--timeout", str(timeout), "--die-rank", "1", "--die-step", "3",
         "--die-how", how],
        timeout=90,
        hung_ranks=[1] if how == "stop" else [],
    )
    assert results[1].returncode == (1 if how == "raise" else -9), _world.describe(results)
    if how == "raise":
        assert "InjectedFailure" in results[1].stderr, _world.describe(results)
    for rank in (0, 2):
        assert results[rank].returncode == 0, _world.describe(results)
        res = torch.load(tmp_path / f"rank{rank}.pt")
        assert res["error"] is not None, f"rank {rank} trained on without its peer: {res}"
        assert res["step"] == 3, (res, _world.describe(results))
        assert "ShimError" in res["error"] and "DDPSHIM_ERR_" in res["error"], res["error"]
        assert res["hook_error_code"] in codes, res
        limit = 5 if how != "stop" else timeout + 5
        assert res["seconds"] < limit, f"rank {rank} took {res['seconds']:.1f}s to fail: {res}"
        assert res["close_seconds"] < 5, res


@pytest.mark.parametrize("shared", [False, True], ids=["own-store", "launchers-store"])
def test_bootstrap_gives_up_within_the_timeout(tmp_path, shared):
    """Under torchrun the addresses go through torch's store, whose own timeout
    is 30 minutes: a rank that never opens must fail the others within the
    hook's timeout instead. Where the launcher's agent serves the store, the
    ranks first agree on the attempt over their group (a broadcast, whose
    own wait on gloo is 30 minutes too): bounded the same."""
    timeout = 3.0
    args = ["absent", "--out", str(tmp_path), "--timeout", str(timeout)] + (["--shared-store"] if shared else [])
    results = _world.run_world(tmp_path, 2, args, timeout=60)
    assert all(r.returncode == 0 for r in results), _world.describe(results)
    res = torch.load(tmp_path / "rank0.pt")
    want = "not every rank of the hook's group reached its first bucket" if shared else "did not publish"
    assert res["error"] is not None and want in res["error"], res
    assert timeout - 0.5 <= res["seconds"] <= timeout + 5, res


def test_host_transport_with_compression(tmp_path):
    """compression= on the host transport: cast, divide, sum, copy back (as PyTorch's compress hooks).

    With two ranks the shim's sum of two halves rounds once, which is what
    the worker's gloo emulation does, so the results match it bit for bit.
    """
    world_size = 2
    results = _world.run_world(
        tmp_path, world_size,
        ["nccl", "--out", str(tmp_path), "--transport", "host", "--compressions", "none,fp16,bf16"],
        timeout=120,
    )
    _world.check_ok(results)
    res = load(tmp_path, world_size)
    tolerance = {"fp16": dict(rtol=1e-3, atol=1e-4), "bf16": dict(rtol=1e-2, atol=1e-3)}
    for name in ("none", "fp16", "bf16"):
        assert_bit_identical([r[name] for r in res], f"host, compression {name}")
        assert res[0][name]["info"]["transport"] == TRANSPORT[world_size]
        for rank in range(world_size):
            got, want = res[rank][name]["params"], res[rank]["builtin"]["params"]
            if name == "none":
                assert_close(got, want, f"host, rank {rank}")
                continue
            for i, (g, w) in enumerate(zip(got, want)):
                assert torch.allclose(g, w, **tolerance[name]), f"{name}, rank {rank}, parameter {i}"
            emulated = res[rank][f"{name}_emulated"]["params"]
            assert all(torch.equal(g, w) for g, w in zip(got, emulated)), f"{name}, rank {rank}: not the emulation's"
    assert not all(torch.equal(g, w) for g, w in zip(res[0]["bf16"]["params"], res[0]["none"]["params"]))
    assert res[0]["cuda_touched"] == []


def test_ranks_of_different_restart_counts_bootstrap(tmp_path):
    """After torchrun's rescale a node whose worker failed counts a restart and the others do not: the
    ranks' TORCHELASTIC_RESTART_COUNT differ, on a store that is new for the attempt anyway. The hook's
    bootstrap keys must not be named by it (they were: the ranks waited for each other until the timeout)."""
    results = _world.run_world(
        tmp_path, 2, ["nccl", "--out", str(tmp_path), "--transport", "host", "--timeout", "10"], timeout=90,
        per_rank_env={0: {"TORCHELASTIC_RESTART_COUNT": "1"}, 1: {"TORCHELASTIC_RESTART_COUNT": "0"}},
    )
    _world.check_ok(results)
    res = load(tmp_path, 2)
    assert_bit_identical([r["none"] for r in res], "host, restart counts 1 and 0")


def test_bootstrap_ignores_an_earlier_attempts_keys(tmp_path):
    """torchrun 2.5 and later give every restart the same store (their agent's), and the hook's bootstrap
    read the addresses the attempt before had left there: rank 0 dialled a dead peer until the timeout,
    and the restarted job hung (a first-hour review found it under torch 2.15's torchrun). The keys are
    now named by a token the ranks agree on over their group."""
    results = _world.run_world(tmp_path, 2, ["stale", "--out", str(tmp_path), "--shared-store"], timeout=150)
    _world.check_ok(results)
    res = load(tmp_path, 2)
    assert_bit_identical([r["hooked"] for r in res], "hook after stale keys")
    for rank in range(2):
        assert_close(res[rank]["hooked"]["params"], res[rank]["builtin"]["params"], f"rank {rank}")

