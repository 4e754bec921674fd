"""ddp_agent.InProcess: a rank's failed step is retried in the same processes, with the same result.

Real worlds of three gloo ranks (torchrun's environment, torch's store),
each with the hook on the shim's host transport. The reference is the same
run with no fault: every faulted run must end with its parameters, bit for
bit, having lost at most the step in progress, with every process the one
it started as.
"""

import pathlib

import pytest
import torch

import _world

WORKER = _world.TESTS_DIR / "_inprocess_worker.py"
WORLD = 2


def run(tmp_path: pathlib.Path, *args: str):
    results = _world.run_world(tmp_path, WORLD, ["--out", str(tmp_path), *args], script=WORKER, timeout=120)
    _world.check_ok(results)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)], results


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    res, _ = run(tmp_path_factory.mktemp("reference"))
    assert all(r["error"] is None and r["generation"] == 0 for r in res), res
    assert len({r["digest"] for r in res}) == 1, res
    return res[0]["digest"]


FAULTS = [(3, 0, "forward"), (6, 1, "corrupt"), (9, 1, "optimizer"), (11, 0, "corrupt")]


def test_faults_retried_in_process(tmp_path, reference):
    """Four faults in one run, each re-formed in process: rank 0 and rank 1, before the backward and after the optimizer step.

    Rank 0 corrupted is the source of nothing: wrap's DDP, which broadcasts rank 0's model, must not undo
    the move of rank 1's.
    """
    res, results = run(tmp_path, "--faults", ",".join(f"{s}:{r}:{h}" for s, r, h in FAULTS),
                       "--max-reforms", str(len(FAULTS)))
    text = _world.describe(results)
    for r in res:
        assert r["error"] is None, text
        assert r["pid_start"] == r["pid_end"], text
        assert r["generation"] == len(FAULTS) and len(r["reforms"]) == len(FAULTS), r["reforms"]
    for i, (step, rank, how) in enumerate(FAULTS):
        info = res[0]["reforms"][i]
        # At most the step in progress is lost: the retry is that step, or
        # the next when the others had completed it (a fault after the
        # optimizer step).
        assert info["retry"] == (step if how == "forward" else step + 1), info
        if how == "corrupt":  # its own state is garbage: a peer's is taken
            assert info["source"] != rank and info["completed"][rank] == step - 1, info
        # Fault to the retried step completed on every rank.
        fault = min(r["reforms"][i]["fault_at"] for r in res)
        took = max(r["completed_at"][info["retry"]] for r in res) - fault
        # Each rank timed its resumed step, the phase ddp-agent is told last.
        assert all(r["reforms"][i]["first_step_ms"] > 0 for r in res), [r["reforms"][i] for r in res]
        phases = {k: v for k, v in res[rank]["reforms"][i].items() if k.endswith("_ms")}
        print(f"rank {rank} {how} at step {step}: fault to the retried step done everywhere {took * 1e3:.0f} ms; {phases}")
        assert took < 10, (took, res[rank]["reforms"][i])
    assert [r["digest"] for r in res] == [reference] * WORLD, text


def test_fault_before_ddps_second_forward(tmp_path, reference):
    """A rank that fails before its forward in a DDP model's second step, the job's first and the re-formed
    model's, is re-formed in process: DDP's bucket rebuild, a gloo broadcast that nothing aborts, ran at the end
    of the first step, not in the others' second forward, where they waited for the failed rank until the
    rendezvous gave up (a review, 2026-12-01)."""
    faults = [(2, 1, "data"), (3, 0, "data")]
    res, results = run(tmp_path, "--faults", ",".join(f"{s}:{r}:{h}" for s, r, h in faults), "--max-reforms", "2")
    text = _world.describe(results)
    for r in res:
        assert r["error"] is None, text
        assert r["pid_start"] == r["pid_end"], text
        assert [i["retry"] for i in r["reforms"]] == [2, 3], r["reforms"]
        assert all(i["rendezvous_ms"] < 10_000 for i in r["reforms"]), r["reforms"]
    assert [r["digest"] for r in res] == [reference] * WORLD, text


@pytest.fixture(scope="module")
def reference_batchnorm(tmp_path_factory):
    """Each rank's digest of a run with a BatchNorm and a module that replaces its buffer, whose buffers went through
    the shim: DDP's own broadcast gives the same bytes."""
    res, _ = run(tmp_path_factory.mktemp("reference-batchnorm"), "--batchnorm")
    ddp, _ = run(tmp_path_factory.mktemp("reference-ddp-buffers"), "--batchnorm", "--ddp-buffers")
    assert all(r["error"] is None and r["shim_buffers"] for r in res), res
    assert not any(r["shim_buffers"] for r in ddp), ddp
    assert [r["digest"] for r in res] == [r["digest"] for r in ddp]
    return [r["digest"] for r in res]


@pytest.mark.parametrize("rank", [0, 1])
def test_fault_while_peers_broadcast_buffers(tmp_path, reference_batchnorm, rank):
    """A rank that fails before its forward, in a model with buffers under DDP's broadcast_buffers=True, is re-formed
    in process: the others wait in the buffers' broadcast from rank 0, which runs through the shim, whose abort fails
    it at once. Through DDP's own broadcast, rank 0's fault left them there until the rendezvous gave up
    (docs/in-process.md, Limits). Then the other rank fails after its forward at step 5, where DDP broadcast nothing
    (step 4 ended with an evaluation): every rank puts back its buffers as step 5 found them, or the retried step
    would count its batch twice."""
    faults = [(3, rank, "data"), (5, 1 - rank, "forward")]
    res, results = run(tmp_path, "--batchnorm", "--faults", ",".join(f"{s}:{r}:{h}" for s, r, h in faults),
                       "--max-reforms", "2")
    text = _world.describe(results)
    for r in res:
        assert r["error"] is None, text
        assert r["pid_start"] == r["pid_end"], text
        assert [i["retry"] for i in r["reforms"]] == [3, 5], r["reforms"]
        assert all(i["rendezvous_ms"] < 10_000 for i in r["reforms"]), r["reforms"]
    assert [r["digest"] for r in res] == reference_batchnorm, text


def test_buffers_kept_without_broadcast(tmp_path):
    """Under broadcast_buffers=False each rank keeps its own buffers, and a step retried after a fault past the
    forward starts from them as the step found them: the source's digest is the fault-free run's. (The other rank
    takes the source's buffers with its state, its own statistics lost: docs/in-process.md.)"""
    (tmp_path / "ref").mkdir()
    (tmp_path / "faults").mkdir()
    ref, _ = run(tmp_path / "ref", "--batchnorm", "--no-broadcast-buffers")
    res, results = run(tmp_path / "faults", "--batchnorm", "--no-broadcast-buffers", "--faults", "6:1:forward")
    text = _world.describe(results)
    for r in res:
        assert r["error"] is None and [i["retry"] for i in r["reforms"]] == [6], text
    assert res[0]["digest"] == ref[0]["digest"], text
    assert res[0]["reforms"][0]["source"] == 0, res[0]["reforms"]


def test_retry_draws_the_failed_attempts_random_numbers(tmp_path):
    """A retried step draws the random numbers its failed attempt drew (dropout here): every rank's torch generator
    is put back as the step found it, and the parameters are the fault-free run's. Without that, a review's dropout
    run ended with another digest. Rank 1 failing past its gradient all-reduce at step 10 lets rank 0 complete the
    step and fail in the next: step 11 is retried, rank 0's generator put back as step 11 found it, rank 1's left
    where it is, past its forward of step 10."""
    (tmp_path / "ref").mkdir()
    (tmp_path / "faults").mkdir()
    ref, _ = run(tmp_path / "ref", "--dropout")
    res, results = run(tmp_path / "faults", "--dropout", "--faults", "4:1:forward,7:0:data,10:1:backward")
    text = _world.describe(results)
    assert all(r["error"] is None and r["generation"] == 0 for r in ref), ref
    for rank, r in enumerate(res):
        assert r["error"] is None and r["pid_start"] == r["pid_end"], text
        want = [(4, True), (7, True), (11, rank == 0)]
        assert [(i["retry"], i["random_restored"]) for i in r["reforms"]] == want, r["reforms"]
    assert [r["digest"] for r in res] == [r["digest"] for r in ref], text


def test_fault_while_peers_reduce_the_loss(tmp_path, reference):
    """A rank that fails while the others all-reduce the loss through loop.all_reduce, before the optimizer's step,
    is re-formed in process: the shim's all-reduce aborts, where torch.distributed's left them waiting."""
    res, results = run(tmp_path, "--log", "before", "--faults", "4:1:backward,7:0:backward", "--max-reforms", "2")
    text = _world.describe(results)
    for r in res:
        assert r["error"] is None, text
        assert r["pid_start"] == r["pid_end"], text
        assert [i["retry"] for i in r["reforms"]] == [4, 7], r["reforms"]
        assert all(i["rendezvous_ms"] < 10_000 for i in r["reforms"]), r["reforms"]
    assert [r["digest"] for r in res] == [reference] * WORLD, text


@pytest.mark.parametrize("optimizer", ["sgd", "data-sgd"])
def test_no_source_after_every_optimizer_step(tmp_path, optimizer):
    """A fault before the script's all-reduce after the optimizer's step fails every rank there: each holds the
    next step's parameters without having completed it, and none is taken as the source, which would apply the
    step twice. Every rank falls back to the restart, saying why. data-sgd steps through p.data, which moves no
    version counter (nor does torch 2.x's fused SGD): the optimizer's step itself is what tells."""
    res, results = run(tmp_path, "--log", "after", "--faults", "4:1:optimizer", "--optimizer", optimizer)
    for r in res:
        assert r["error"] is not None and r["generation"] == 0, _world.describe(results)
    # The first to raise exits, and if it is rank 0 its store goes with it: the other may fail on the store first.
    said = [r["error"] for r in res if "ReformError" in r["error"] and "none holds step 3's state" in r["error"]]
    assert said, [r["error"] for r in res]


def test_gives_up_after_max_reforms(tmp_path):
    res, results = run(tmp_path, "--faults", "3:1:always", "--max-reforms", "2")
    for r in res:
        assert r["error"] is not None and r["generation"] == 2, _world.describe(results)
    assert "ReformError" in res[1]["error"] and "after 2 re-formations" in res[1]["error"], res[1]["error"]


def test_reform_ignores_an_earlier_attempts_keys(tmp_path, reference):
    """torchrun 2.5 and later give every restart the same store (their agent's), where a restarted attempt's
    re-formation met the arrivals that the attempt before had left under the same name, and took a dead
    rank's last step for its own. The re-formations' keys are now named by a token the ranks agree on when
    they make their InProcess."""
    res, results = run(tmp_path, "--faults", "3:1:forward", "--shared-store")
    text = _world.describe(results)
    for r in res:
        assert r["error"] is None, text
        assert r["pid_start"] == r["pid_end"], text
        assert r["generation"] == 1 and r["reforms"][0]["retry"] == 3, r["reforms"]
        assert r["reforms"][0]["completed"] == [2] * WORLD, r["reforms"]
    assert [r["digest"] for r in res] == [reference] * WORLD, text


def test_mistakes_refused_at_construction(monkeypatch, caplog):
    """What failed deep in the first re-formation (an AttributeError, a bare unpacking TypeError), or not at all (a
    hookless wrap, whose faults are never re-formed), is said when the loop is made."""
    import logging

    from ddp_agent import inprocess

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monkeypatch.setattr(inprocess.dist, "is_initialized", lambda: True)
    with pytest.raises(TypeError, match="has no param_groups"):
        inprocess.InProcess(model, object(), lambda m: (m, None))
    with pytest.raises(TypeError, match="has no state_dict"):
        inprocess.InProcess(model, opt, lambda m: (m, None), state=[object()])

    loop = inprocess.InProcess.__new__(inprocess.InProcess)
    loop.model, loop.rank, loop.timeout = model, 0, 60.0
    loop._wrap = lambda m: m  # the DDP model alone, no hook
    with pytest.raises(TypeError, match=r"wrap returned Linear, want \(ddp_model, hook\)"):
        loop._wrapped()
    loop._wrap = lambda m: (m, None)
    with caplog.at_level(logging.WARNING, logger="ddp_agent"):
        loop._wrapped()
        loop._wrapped()  # after a re-formation: said once
    said = [r.getMessage() for r in caplog.records if "without ddp_agent's hook" in r.getMessage()]
    assert len(said) == 1 and "falls back to the process restart" in said[0], caplog.text
