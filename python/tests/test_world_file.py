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
    write(path, generation=3, world_size=4, ranks={"7": 1})
    world, hold = inprocess._world_news(str(path))
    assert world["ranks"] == {"7": 1} and not hold


def test_meet_without_a_move(store):
    """Both ranks arrive: each one's last completed step and hook step, in rank order."""
    other = threading.Thread(target=lambda: inprocess._arrive(store, "p/1", 1, 9, 90))
    other.start()
    completed, hooks = inprocess._meet(store, "p/1", 0, 2, 10, 100, 5.0, lambda: (None, False))
    other.join()
    assert completed == [10, 9] and hooks == [100, 90]


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
    assert inprocess._meet(store, "p/2", 0, 2, 10, 100, 30.0, lambda: answers.pop(0)) == ([10, 9], [100, 90])


def test_meet_times_out_naming_the_missing(store):
    t0 = time.monotonic()
    with pytest.raises(inprocess.ReformError, match=r"ranks \[1, 2\] did not arrive within 0.3 s"):
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
    assert loop._prefix == "ddp_agent/inprocess/restart_1/generation_4"
    with pytest.raises(inprocess.ReformError, match="without this process"):
        loop._adopt({"generation": 5, "restart_count": 1, "world_size": 2, "group_rank": 0, "nnodes": 1, "ranks": {}})
