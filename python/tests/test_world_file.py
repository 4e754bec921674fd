"""The world file: how ddp-agent moves the workers of a shrunk job into their new world, in process.

The agent writes the file (agent/keep.go); InProcess's rendezvous polls it
while it waits for ranks that may be gone. A real TCPStore serves the
rendezvous here; the end-to-end path (agents, a lost node) is
agent/e2e TestLostNodeShrinksInProcess.
"""

import datetime
import json
import os
import socket
import threading
import time

import pytest
import torch.distributed as dist

from ddp_agent import _env, inprocess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", free_port(), None, True, datetime.timedelta(seconds=10))


def write(path, **world):
    path.write_text(json.dumps(world))


def test_world_news(tmp_path, monkeypatch):
    path = tmp_path / "world.json"
    monkeypatch.setenv(_env.GENERATION, "2")
    assert inprocess._world_news(str(path)) == (None, False)  # none yet
    path.write_text("{not json")
    assert inprocess._world_news(str(path)) == (None, False)
    write(path, generation=1, moving=True)
    assert inprocess._world_news(str(path)) == (None, False)  # an earlier generation's
    write(path, generation=2, world_size=4, ranks={})
    assert inprocess._world_news(str(path)) == (None, False)  # this process's own generation
    write(path, generation=2, moving=True)
    assert inprocess._world_news(str(path)) == (None, True)  # the agent moves it: hold
    write(path, generation=3, moving=True)
    assert inprocess._world_news(str(path)) == (None, True)  # moved on again before this process read it: hold
    write(path, generation=3, world_size=4, ranks={"7": 1})
    world, hold = inprocess._world_news(str(path))
    assert world["ranks"] == {"7": 1} and not hold


def test_meet_without_a_move(store):
    """Both ranks arrive: each one's last completed step and hook step, in rank order."""
    other = threading.Thread(target=lambda: inprocess._arrive(store, "p/1", 1, 9, 90))
    other.start()
    completed, hooks, changed = inprocess._meet(store, "p/1", 0, 2, 10, 100, 5.0, lambda: (None, False), True)
    other.join()
    assert completed == [10, 9] and hooks == [100, 90] and changed == [True, False]


def test_meet_moved_into_a_new_world(store):
    """Rank 1 never comes; the agent's world, once there, ends the wait at once."""
    world = {"generation": 1}
    asked = []

    def moved():
        asked.append(time.monotonic())
        return (world if len(asked) > 3 else None), False

    with pytest.raises(inprocess._WorldChanged) as e:
        inprocess._meet(store, "p/1", 0, 2, 10, 100, 30.0, moved)
    assert e.value.world is world and len(asked) == 4


def test_meet_held_though_every_rank_arrived(store):
    """A node joined: every rank of the old world arrives, and the hold keeps them until the new world is known."""
    inprocess._arrive(store, "p/1", 1, 9, 90)
    answers = [(None, True)] * 5 + [({"generation": 4}, False)]
    with pytest.raises(inprocess._WorldChanged) as e:
        inprocess._meet(store, "p/1", 0, 2, 10, 100, 30.0, lambda: answers.pop(0))
    assert e.value.world == {"generation": 4} and not answers
    # Released without a new world (the hold lifted), it ends in the old one.
    inprocess._arrive(store, "p/2", 1, 9, 90)
    answers = [(None, True)] * 3 + [(None, False)]
    assert inprocess._meet(store, "p/2", 0, 2, 10, 100, 30.0, lambda: answers.pop(0)) == ([10, 9], [100, 90],
                                                                                          [False, False])


@pytest.mark.parametrize("completed, changed, want", [
    ([5, 5, 5], [False, False, False], 0),
    ([5, 6, 6], [False, False, False], 1),  # rank 0 failed in its optimizer's step: its peers completed it
    ([5, 5, 5], [True, False, True], 1),  # ranks 0 and 2 changed their parameters in step 6, rank 1 did not
    ([5, 6, 6], [True, True, False], 2),  # rank 1 completed 6, then changed its parameters in step 7
    ([5, 5], [True, True], None),  # both stepped: no rank holds step 5's state
    ([4, 5], [False, True], None),  # rank 0 holds an older step's
    ([-1, 7], [False, False], 1),  # a warm spare, no step
])
def test_source(completed, changed, want):
    assert inprocess._source(inprocess.Arrivals(completed, [0] * len(completed), changed)) == want


def test_meet_times_out_naming_the_missing(store):
    t0 = time.monotonic()
    with pytest.raises(inprocess.ReformError, match=r"ranks \[1, 2\] did not arrive within 0.3 s .*: each is dead, or "
                       r"stuck in a collective outside ddp_agent's hook, such as DDP's buffer broadcast"):
        inprocess._meet(store, "p/1", 0, 3, 10, 100, 0.3, lambda: (None, False))
    assert time.monotonic() - t0 < 5


def test_adopt(monkeypatch):
    """The process becomes the rank the file gives its pid, with the new world's variables and prefix."""
    for k in ("RANK", "ROLE_RANK", "WORLD_SIZE", "ROLE_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
              "TORCHELASTIC_RESTART_COUNT", _env.GENERATION):
        monkeypatch.setenv(k, "0")
    loop = inprocess.InProcess.__new__(inprocess.InProcess)
    loop.rank, loop.world_size = 5, 6
    loop._adopt({"generation": 4, "restart_count": 1, "world_size": 4, "group_rank": 1, "nnodes": 2,
                 "ranks": {str(os.getpid()): 3}})
    assert (loop.rank, loop.world_size) == (3, 4)
    assert os.environ["RANK"] == "3" and os.environ["WORLD_SIZE"] == "4" and os.environ["GROUP_RANK"] == "1"
    assert os.environ[_env.GENERATION] == "4" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "1"
    assert loop._prefix == "ddp_agent/inprocess/generation_4"
    with pytest.raises(inprocess.ReformError, match="without this process"):
        loop._adopt({"generation": 5, "restart_count": 1, "world_size": 2, "group_rank": 0, "nnodes": 1, "ranks": {}})


def test_adopt_moves_to_the_new_store(monkeypatch, store):
    """A world whose store another node serves (the store's node was lost): the process becomes its client."""
    old = dist.TCPStore("127.0.0.1", free_port(), None, True, datetime.timedelta(seconds=10))
    for k in ("RANK", "ROLE_RANK", "WORLD_SIZE", "ROLE_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
              "TORCHELASTIC_RESTART_COUNT", _env.GENERATION):
        monkeypatch.setenv(k, "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(old.port))
    loop = inprocess.InProcess.__new__(inprocess.InProcess)
    loop.rank, loop.world_size, loop.timeout, loop._store = 1, 3, 10.0, old
    world = {"generation": 2, "restart_count": 0, "world_size": 2, "group_rank": 0, "nnodes": 1,
             "ranks": {str(os.getpid()): 0}, "master_addr": "127.0.0.1", "master_port": store.port}
    loop._adopt(world)
    store.set("mark", "new store")
    assert bytes(loop._store.get("mark")) == b"new store"
    assert os.environ["MASTER_PORT"] == str(store.port)
    kept = loop._store
    loop._adopt(dict(world, generation=3))  # the same store: the same client
    assert loop._store is kept


def test_rendezvous_after_the_store_died(tmp_path, monkeypatch, store):
    """The store fails mid-rendezvous (its node was lost): the rank waits for the world file, moves to the
    new store it names and meets there.

    The dead store is a stand-in whose every call fails, as a client's of a
    killed server does: a real torch 1.13 client in this process, its
    server killed, aborted the whole pytest run once in CI (its poll
    thread's error, a race). agent/e2e TestLostStoreNodeShrinksInProcess
    kills a real store's node under real workers."""
    for k in ("RANK", "ROLE_RANK", "WORLD_SIZE", "ROLE_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
              "TORCHELASTIC_RESTART_COUNT", _env.GENERATION):
        monkeypatch.setenv(k, "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))  # the dead store's
    path = tmp_path / "world.json"
    monkeypatch.setenv(_env.WORLD_FILE, str(path))
    loop = inprocess.InProcess.__new__(inprocess.InProcess)
    loop.rank, loop.world_size, loop.timeout, loop._index, loop._completed = 2, 3, 20.0, 0, 41
    loop._store, loop._keep = _DeadStore(), None
    loop._prefix = inprocess._prefix()

    def agent():
        time.sleep(0.5)
        write(path, generation=0, moving=True)
        time.sleep(0.5)
        write(path, generation=2, restart_count=0, world_size=1, group_rank=0, nnodes=1,
              ranks={str(os.getpid()): 0}, master_addr="127.0.0.1", master_port=store.port)

    threading.Thread(target=agent).start()
    index, arrivals = loop._rendezvous(42, RuntimeError("peer failed"), 7, False)
    assert (index, arrivals) == (1, ([41], [7], [False]))
    assert (loop.rank, loop.world_size) == (0, 1)
    assert os.environ["MASTER_PORT"] == str(store.port)


class _DeadStore:
    """A client of a store whose process died: every call fails at once."""

    def set(self, *a):
        raise RuntimeError("Connection reset by peer")

    add = get = wait = set


def test_rendezvous_store_lost_and_no_world(tmp_path, monkeypatch):
    """The store is gone and ddp-agent moves the workers nowhere: ReformError within timeout (a process restart)."""
    monkeypatch.setenv(_env.WORLD_FILE, str(tmp_path / "world.json"))
    monkeypatch.setenv(_env.GENERATION, "1")
    loop = inprocess.InProcess.__new__(inprocess.InProcess)
    loop.rank, loop.world_size, loop.timeout, loop._index, loop._completed = 0, 2, 0.5, 0, 3
    loop._prefix = "p"
    loop._store, loop._keep = _DeadStore(), None
    t0 = time.monotonic()
    with pytest.raises(inprocess.ReformError, match="store is gone .* into no new world within 0.5 s"):
        loop._rendezvous(4, RuntimeError("peer failed"), 0, False)
    assert time.monotonic() - t0 < 5


def test_rendezvous_moved_into_a_smaller_world(tmp_path, monkeypatch, store):
    """A rank waits for one that is gone; the world file moves it into a world of its own, on the same store."""
    for k in ("RANK", "ROLE_RANK", "WORLD_SIZE", "ROLE_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
              "TORCHELASTIC_RESTART_COUNT", _env.GENERATION):
        monkeypatch.setenv(k, "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    path = tmp_path / "world.json"
    monkeypatch.setenv(_env.WORLD_FILE, str(path))
    loop = inprocess.InProcess.__new__(inprocess.InProcess)
    loop.rank, loop.world_size, loop.timeout, loop._index, loop._completed, loop._store = 0, 2, 20.0, 0, 9, store
    loop._prefix = inprocess._prefix()
    threading.Timer(0.3, lambda: write(path, generation=1, restart_count=0, world_size=1, group_rank=0, nnodes=1,
                                       ranks={str(os.getpid()): 0}, master_addr="127.0.0.1",
                                       master_port=store.port)).start()
    assert loop._rendezvous(10, RuntimeError("peer failed"), 3, True) == (1, ([9], [3], [True]))
    assert loop.world_size == 1 and loop._store is store
