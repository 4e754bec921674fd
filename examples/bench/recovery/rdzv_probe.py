# Read-only probe of torchrun's c10d rendezvous state, for the recovery
# benchmark's "where the time goes" breakdown (examples/bench/recovery).
#
#   python3 rdzv_probe.py HOST PORT RUN_ID OUT.jsonl [INTERVAL_S]
#
# torchrun (PyTorch 1.13) keeps the whole rendezvous state as one pickled,
# base64-encoded _RendezvousState under the store key "torch.rendezvous.<id>"
# (torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py). The
# probe connects to the TCPStore as a client, reads that key every INTERVAL_S
# (default 0.05 s) with a plain get (it never writes), and appends a JSON line
# to OUT.jsonl whenever the round, its completeness, the participants, the
# wait list or the last-call deadline change:
#   {"t": time.time(), "round": N, "complete": bool, "participants": n,
#    "wait_list": n, "deadline": epoch seconds or null,
#    "heartbeat_age": {node: seconds since its last keep-alive}}
import base64
import calendar
import json
import os
import pickle
import sys
import time
from datetime import timedelta

from torch.distributed import TCPStore

# Unpickling needs the state's classes.
import torch.distributed.elastic.rendezvous.dynamic_rendezvous  # noqa: F401

NULL_SENTINEL = b"Y2FuaW1hZGFt"


def epoch(dt):
    # The state's datetimes are naive UTC (datetime.utcnow()).
    return calendar.timegm(dt.utctimetuple()) + dt.microsecond / 1e6


def main():
    host, port, run_id, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    interval = float(sys.argv[5]) if len(sys.argv) > 5 else 0.05
    parent = os.getppid()
    store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=30))
    key = "torch.rendezvous." + run_id
    last = None
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    while os.getppid() == parent:
        now = time.time()
        raw = store.get(key)
        if raw != NULL_SENTINEL:
            state = pickle.loads(base64.b64decode(raw))
            deadline = epoch(state.deadline) if state.deadline else None
            sig = (state.round, state.complete, tuple(sorted(map(repr, state.participants))),
                   tuple(sorted(map(repr, state.wait_list))), deadline, state.closed)
            if sig != last:
                last = sig
                rec = {
                    "t": now,
                    "round": state.round,
                    "complete": state.complete,
                    "closed": state.closed,
                    "participants": len(state.participants),
                    "wait_list": len(state.wait_list),
                    "deadline": deadline,
                    "heartbeat_age": {repr(n): round(now - epoch(hb), 3) for n, hb in state.last_heartbeats.items()},
                }
                os.write(fd, (json.dumps(rec) + "\n").encode())
        time.sleep(interval)


if __name__ == "__main__":
    main()
