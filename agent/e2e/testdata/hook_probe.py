"""A tiny DDP job that registers ddp-agent's hook and reports what it bootstrapped.

Each rank trains a few steps, then prints one line

    PROBE {"rank": 0, "socket_env": true, "info": {...ddpshim_comm_info...}, "digest": "..."}

where info is the hook's communicator as the shim describes it (transport,
collectives, events_sent, agent: connected to ddp-agent's control socket).
Run under ddp-agent or torchrun; the e2e tests (hook_test.go) read the lines.
PROBE_TRANSPORT picks the hook's transport (default auto).
"""

import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python"))  # <repo>/python
import ddp_agent  # noqa: E402


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
    ddp = DDP(model, bucket_cap_mb=0.1)  # several buckets
    hook = ddp_agent.register(ddp, transport=os.environ.get("PROBE_TRANSPORT", "auto"))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1000 + rank)
    for _ in range(steps):
        x = torch.randn(16, 64, generator=g)
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    info = hook.info()  # ddpshim_comm_info of the hook's communicator
    deadline = time.monotonic() + 5
    while info["agent"] and not info["events_sent"] and time.monotonic() < deadline:
        time.sleep(0.05)  # events are shipped to the agent in batches, every ~200 ms
        info = hook.info()
    # One write: torchrun runs python -u, where print() writes the text and
    # the newline separately, and the two ranks share one pipe.
    line = "PROBE " + json.dumps({"rank": rank, "world_size": world, "socket_env": bool(os.environ.get("DDP_AGENT_SOCKET")),
                                  "info": info, "digest": h.hexdigest()})
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    dist.barrier()
    hook.close()
    hook.close()  # idempotent
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # skip torch 1.13's gloo teardown (see examples/train.py)


if __name__ == "__main__":
    main()
