"""A worker's fault, recovered three ways side by side: in process, by ddp-agent's restart, by torchrun's.

    /usr/bin/python3 examples/bench/inprocess_recovery.py --agent bin/ddp-agent \\
        --torchrun-compat scripts/torchrun_compat.py --runs 5 [--fault kill|hang|node|store-node|join] [--fail-rank 0]

Each run trains examples/train.py (2 ranks, gloo, the ddp_agent hook on the
shim's host transport, --hidden 512, a checkpoint every 5 steps) and has
rank 1 (--fail-rank) fail at step 13: it raises (--fault raise), it is
killed with SIGKILL (--fault kill), or it hangs before its backward
(--fault hang: the agents run with --hang-timeout 3), under:

  in-process  ddp-agent run ... train.py --in-process: ddp_agent.InProcess
              re-forms the process group and the hook in the same processes
              and takes the state from a healthy peer; for a kill, with
              --spares 1: a warm spare takes the dead rank
  ddp-agent   ddp-agent run --max-restarts 1: every worker restarted,
              resuming from the step-10 checkpoint
  torchrun    torchrun --max-restarts 1 (scripts/torchrun_compat.py on
              PyTorch 1.13), the same resume; not for a hang, which torchrun
              does not detect: the others wait in gloo's collective until
              its timeout (30 minutes by default)

With --fault node, three nodes of one rank each (three launchers on
loopback, an etcd rendezvous for ddp-agent, torchrun's c10d one for
torchrun, --nnodes 2:3, every setting at its default) train with
--sleep-per-step 0.1, and once every rank has completed step 12 the third
node is SIGKILLed, its launcher with its worker: in process, --spares 1
keeps the survivors' processes and moves them into the world of 2 (no
checkpoint: the script runs no collective of its own mid-run, see
docs/in-process.md); the restarts resume from the step-10 checkpoint.

With --fault store-node, the same, but the node SIGKILLed is the first: its
worker is rank 0, so its node serves the workers' store (ddp-agent's under
--spares, rank 0's worker's without) and hosts torchrun's c10d rendezvous.
In process a survivor's warm spare serves a new store and the workers move
to it; ddp-agent's restart re-forms without it; torchrun's job fails.

With --fault join, two such nodes train (--steps 150) and a third joins once
both ranks have completed step 12: in process, the first two keep their
workers and the third's join their re-formation; the restarts start all
three nodes' workers again, from the step-10 checkpoint. The figure goes
from the third launcher's start to the moment every rank of the world of 3
has completed a step in it; a second table gives the first two nodes'
pause, from the later of their last steps in the world of 2 to that
moment.

The three launchers take turns run by run, so drift in the machine's load
hits them alike. Every rank logs, through $TRAIN_STEP_LOG, the wall clock
time at which it completed each step and at which the fault was raised; a
run's figures are:

  recovery    from the raise to the moment every rank has completed its
              first step of the next attempt (the restarted workers, or the
              generation re-formed in process)
  lost steps  steps completed before the fault and again after it: 0 in
              process (only the step in progress is done again), 2 for the
              restarts (steps 11 and 12, after the checkpoint at step 10)

It prints a Markdown table of the medians, minimums and maximums. With
--fault kill it also compares how fast the spare took the model's state (the
"bytes moved in" of its log line) with the shim's all-reduce bus bandwidth
for that size, measured by examples/bench/allreduce.py right after.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "examples", "train.py")
FAIL_STEP, STEPS, CKPT_EVERY = 13, 20, 5
HANG_TIMEOUT = 3  # seconds, the agents' --hang-timeout under --fault hang


def command(kind: str, args, workdir: str):
    train = [TRAIN, "--steps", str(STEPS), "--hidden", "512", "--log-every", "100", "--ckpt-every", str(CKPT_EVERY),
             "--ckpt-dir", os.path.join(workdir, "ckpt"), "--warmup-steps", "0"]
    if args.fault == "hang":
        train += ["--hang-rank", str(args.fail_rank), "--hang-at-step", str(FAIL_STEP)]
    else:
        train += ["--fail-rank", str(args.fail_rank), "--fail-at-step", str(FAIL_STEP)]
    if args.fault == "kill":
        train += ["--fail-signal", "KILL"]
    hang = ["--hang-timeout", str(HANG_TIMEOUT)] if args.fault == "hang" else []
    if kind == "in-process":
        spares = ["--spares", "1"] if args.fault != "raise" else []
        return [args.agent, "run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "0", *spares, *hang,
                "--python", args.python, "--log-dir", os.path.join(workdir, "logs"), *train, "--in-process"]
    if kind == "ddp-agent":
        return [args.agent, "run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", *hang, "--python",
                args.python, "--log-dir", os.path.join(workdir, "logs"), *train]
    return [args.python, args.torchrun_compat, "--standalone", "--nproc_per_node", "2", "--max_restarts", "1",
            *train]


NODE_KILL_AFTER = 12  # --fault node: the step every rank has completed when the third node is killed


JOIN_STEPS = 150  # --fault join: long enough for torchrun's rescale to come before the end


def node_command(kind: str, args, workdir: str, port: int) -> list:
    """One node's launcher of a --fault node or join run."""
    ckpt = ["--ckpt-every", "0"] if kind == "in-process" else ["--ckpt-every", str(CKPT_EVERY)]
    steps = JOIN_STEPS if args.fault == "join" else STEPS
    train = [TRAIN, "--steps", str(steps), "--hidden", "512", "--log-every", "100", *ckpt, "--ckpt-dir",
             os.path.join(workdir, "ckpt"), "--warmup-steps", "0", "--sleep-per-step", "0.1"]
    if kind == "torchrun":
        if args.fault == "join":
            # DDP's own all-reduce: after torchrun's rescale the nodes'
            # TORCHELASTIC_RESTART_COUNT can differ (a node whose worker
            # failed on the restarted peers counts a restart, the others
            # do not), and train.py resumes from its checkpoint only after
            # a restart: the ranks can start from different steps and run
            # different numbers of them. With the hook, the first rank to
            # finish then waited in its last collectives for good (the
            # second run of 2026-11-30 03:10); with DDP's own all-reduce
            # every run ended.
            train += ["--comm-hook", "none"]
        return [args.python, args.torchrun_compat, "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
                "--rdzv_id", "bench", "--nnodes", "2:3", "--nproc_per_node", "1", "--max_restarts", "1", *train]
    extra = ["--spares", "1"] if kind == "in-process" else []
    return [args.agent, "run", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "bench",
            "--nnodes", "2:3", "--nproc-per-node", "1", "--max-restarts", "1", *extra, "--python", args.python, *train,
            *(["--in-process"] if kind == "in-process" else [])]


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def completed_everywhere(log: str, world: int) -> int:
    """The last step that ranks 0..world-1 have all completed, per the step log; 0 when none."""
    last = {}
    try:
        for line in open(log):
            e = json.loads(line)
            if e["event"] == "step":
                last[e["rank"]] = max(last.get(e["rank"], 0), e["step"])
    except (OSError, ValueError):
        return 0
    return min(last.get(r, 0) for r in range(world))


def measure_node(kind: str, args) -> dict:
    """A --fault node run: three nodes, the third SIGKILLed with its worker once every rank completed step 12;
    or a --fault join run: two nodes, and a third joins once both ranks completed step 12."""
    join = args.fault == "join"
    with tempfile.TemporaryDirectory(prefix=f"inprocess-bench-node-{kind}-") as workdir:
        log = os.path.join(workdir, "steps.jsonl")
        env = dict(os.environ, TRAIN_STEP_LOG=log, PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="1")
        env.pop("DDP_AGENT_SOCKET", None)
        port = free_port()
        outs = [open(os.path.join(workdir, f"node{i}.log"), "w+") for i in range(3)]
        nodes = []

        def start() -> None:
            i = len(nodes)
            nodes.append(subprocess.Popen(node_command(kind, args, workdir, port), env=env, stdout=outs[i],
                                          stderr=subprocess.STDOUT, start_new_session=True))

        for i in range(2 if join else 3):
            start()
            time.sleep(1.0 if i == 0 else 0.2)  # the first hosts the rendezvous store
        deadline = time.monotonic() + 120
        while completed_everywhere(log, len(nodes)) < NODE_KILL_AFTER:
            if time.monotonic() > deadline or any(n.poll() is not None for n in nodes):
                for n in nodes:
                    kill_group(n)
                sys.exit(f"{kind}: step {NODE_KILL_AFTER} not reached\n" + tail(outs))
            time.sleep(0.005)
        victim = 0 if args.fault == "store-node" else 2
        if args.fault == "store-node" and not serves_store(outs[0]):
            for n in nodes:
                kill_group(n)
            sys.exit(f"{kind}: the first node's worker is not rank 0, the one whose node serves the store\n" + tail(outs))
        fault = time.time()
        if join:
            start()
        else:
            kill_group(nodes[victim])  # the node's launcher and its worker, at once
        keep = nodes if join else [n for i, n in enumerate(nodes) if i != victim]
        try:
            codes = [n.wait(timeout=300) for n in keep]
        except subprocess.TimeoutExpired:
            codes = None
        for n in nodes:
            kill_group(n)
        if codes != [0] * len(keep):
            if kind == "torchrun" and args.fault == "store-node":
                return {"failed": f"the launchers exited {codes}"}  # its rendezvous store went with the node
            sys.exit(f"{kind}: the launchers exited {codes}\n" + tail(outs))
        events = [json.loads(line) for line in open(log)]
    if join:
        return joined(events, fault)
    first = {}
    for e in sorted(events, key=lambda e: e["t"]):
        if e["event"] == "step" and e["attempt"] > 0 and e["t"] > fault and e["rank"] not in first:
            first[e["rank"]] = e["t"]
    before = {e["step"] for e in events if e["event"] == "step" and e["attempt"] == 0 and e["t"] <= fault}
    again = {e["step"] for e in events if e["event"] == "step" and e["attempt"] > 0}
    return {"recovery_s": max(first[r] for r in (0, 1)) - fault, "lost_steps": len(before & again)}


def joined(events: list, t0: float) -> dict:
    """A --fault join run's figures: from t0 to a step that every rank of the world of 3 completed, and the
    steps completed in the world of 2 and again in the world of 3."""
    by_step = {}
    for e in events:
        if e["event"] == "step" and e.get("world") == 3:
            by_step.setdefault(e["step"], {})[e["rank"]] = e["t"]
    done = [max(ranks.values()) for ranks in by_step.values() if len(ranks) == 3]
    if not done:
        sys.exit("join: no step completed by every rank of the world of 3")
    before = {e["step"] for e in events if e["event"] == "step" and e.get("world") == 2}
    last = {}  # each of the first two ranks' last step in the world of 2
    for e in events:
        if e["event"] == "step" and e.get("world") == 2:
            last[e["rank"]] = max(last.get(e["rank"], 0.0), e["t"])
    return {"recovery_s": min(done) - t0, "lost_steps": len(before & set(by_step)),
            "pause_s": min(done) - max(last.values())}


def serves_store(out) -> bool:
    """Whether a node's worker is rank 0: its node serves the workers' store (the agent's under --spares,
    rank 0's worker's without), and hosts torchrun's c10d rendezvous, the first launcher's."""
    out.flush()
    out.seek(0)
    return "rank 0/3 " in out.read()


def kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, 9)
    except ProcessLookupError:
        pass
    p.wait()


def tail(outs) -> str:
    text = []
    for f in outs:
        f.flush()
        f.seek(0)
        text.append(f.read()[-3000:])
    return "\n----\n".join(text)


def measure(kind: str, args) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"inprocess-bench-{kind}-") as workdir:
        log = os.path.join(workdir, "steps.jsonl")
        env = dict(os.environ, TRAIN_STEP_LOG=log, PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="1")
        env.pop("DDP_AGENT_SOCKET", None)
        r = subprocess.run(command(kind, args, workdir), env=env, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            sys.exit(f"{kind}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        events = [json.loads(line) for line in open(log)]
        moved = STATE_RE.search(r.stdout + r.stderr)
    fault = min(e["t"] for e in events if e["event"] == "fault")
    # The attempt after the fault: the restarted workers, or the
    # generation re-formed in process (train.py's attempt counts both).
    first = {}
    for e in sorted(events, key=lambda e: e["t"]):
        if e["event"] == "step" and e["attempt"] > 0 and e["rank"] not in first:
            first[e["rank"]] = e["t"]
    before = {e["step"] for e in events if e["event"] == "step" and e["attempt"] == 0}
    again = {e["step"] for e in events if e["event"] == "step" and e["attempt"] > 0}
    out = {"recovery_s": max(first.values()) - fault, "lost_steps": len(before & again)}
    if moved:
        out["state_bytes"], out["state_ms"] = int(moved.group(1)), float(moved.group(2))
    return out


FAULTS = {"raise": "raises", "kill": "is SIGKILLed", "hang": "hangs before its backward", "node": "is lost with its node",
          "store-node": "is lost with its node, which serves the store",
          "join": "joins"}
STATE_RE = re.compile(r"joined re-formation .* \((\d+) bytes moved in ([\d.]+) ms\)")


def shim_busbw(args, nbytes: int) -> float:
    """The shim's all-reduce bus bandwidth (GB/s) for nbytes on 2 ranks, by examples/bench/allreduce.py."""
    with tempfile.TemporaryDirectory(prefix="inprocess-bench-allreduce-") as workdir:
        out = os.path.join(workdir, "allreduce.json")
        size = nbytes // 4 * 4
        cmd = [args.agent, "run", "--standalone", "--nproc-per-node", "2", "--python", args.python,
               os.path.join(ROOT, "examples", "bench", "allreduce.py"), "--min-bytes", str(size), "--max-bytes", str(size),
               "--rounds", "3", "--json", out]
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="1")
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            sys.exit(f"allreduce.py: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return json.load(open(out))["rows"][0]["shim"]["busbw"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--agent", default=os.path.join(ROOT, "bin", "ddp-agent"))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--torchrun-compat", default=os.path.join(ROOT, "scripts", "torchrun_compat.py"))
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--fault", choices=["raise", "kill", "hang", "node", "store-node", "join"], default="raise",
                   help="the rank raises, is killed with SIGKILL, or hangs (in process: a warm spare takes its rank)")
    p.add_argument("--fail-rank", type=int, choices=[0, 1], default=1,
                   help="the rank that fails; rank 0's process no longer serves the store under --spares")
    args = p.parse_args()
    kinds = ["in-process", "ddp-agent", "torchrun"] if args.fault != "hang" else ["in-process", "ddp-agent"]
    results = {k: [] for k in kinds}
    start = time.time()
    for i in range(args.runs):
        for k in kinds[i % len(kinds):] + kinds[:i % len(kinds)]:
            results[k].append(measure_node(k, args) if args.fault in ("node", "store-node", "join") else measure(k, args))
            print(f"run {i + 1} {k}: {results[k][-1]}", file=sys.stderr)
    if args.fault == "join":
        print(f"\n{args.runs} runs each, {time.time() - start:.0f} s; 2 nodes of 1 rank, gloo, train.py --hidden 512 "
              f"--sleep-per-step 0.1, a third node joining after step {NODE_KILL_AFTER}; the figure goes from its "
              f"launcher's start; the restarts checkpoint every {CKPT_EVERY} steps, in process none\n")
    elif args.fault in ("node", "store-node"):
        which = "first node (group rank 0's: the workers' store, and torchrun's rendezvous)" \
            if args.fault == "store-node" else "third node"
        print(f"\n{args.runs} runs each, {time.time() - start:.0f} s; 3 nodes of 1 rank, gloo, train.py --hidden 512 "
              f"--sleep-per-step 0.1, the {which} SIGKILLed after step {NODE_KILL_AFTER}; the restarts checkpoint "
              f"every {CKPT_EVERY} steps, in process none\n")
    else:
        print(f"\n{args.runs} runs each, {time.time() - start:.0f} s; 2 ranks, gloo, train.py --hidden 512, "
              f"rank {args.fail_rank} {FAULTS[args.fault]} at step {FAIL_STEP}, checkpoint every {CKPT_EVERY} steps\n")
    if args.fault == "hang":
        print(f"The agents run with --hang-timeout {HANG_TIMEOUT}, which the figures include. torchrun is left out: "
              "it does not detect a hang, and the others wait in gloo's collective until its timeout "
              "(30 minutes by default).\n")
    print("| path | fault → every rank completed its first step of the next attempt (median, min-max) | completed steps done again | against in process |")
    print("|---|---|---|---|")
    base = statistics.median(r["recovery_s"] for r in results["in-process"])
    for k in kinds:
        failed = [r["failed"] for r in results[k] if "failed" in r]
        if failed:  # torchrun's rendezvous went with the store's node
            print(f"| {k} | the job failed in {len(failed)} of {len(results[k])} runs ({failed[0]}) | all | |")
            continue
        rec = sorted(r["recovery_s"] for r in results[k])
        lost = sorted({r["lost_steps"] for r in results[k]})
        print(f"| {k} | {statistics.median(rec):.3f} s ({rec[0]:.3f}-{rec[-1]:.3f}) | {', '.join(map(str, lost))} | "
              f"{statistics.median(rec) / base:.1f}x |")
    if args.fault == "join":
        print("\nThe first two nodes' pause: from the later of their last steps in the world of 2 to the moment every "
              "rank of the world of 3 has completed a step (one step's own 0.1 s sleep and compute included):\n")
        print("| path | pause (median, min-max) |")
        print("|---|---|")
        for k in kinds:
            pause = sorted(r["pause_s"] for r in results[k])
            print(f"| {k} | {statistics.median(pause):.3f} s ({pause[0]:.3f}-{pause[-1]:.3f}) |")
    moved = [r for r in results["in-process"] if "state_bytes" in r]
    if moved:
        nbytes = moved[0]["state_bytes"]
        rates = sorted(r["state_bytes"] / r["state_ms"] / 1e6 for r in moved)  # GB/s
        bus = shim_busbw(args, nbytes)
        med = statistics.median(rates)
        print(f"\nThe spare took {nbytes / 1e6:.1f} MB of state at {med:.2f} GB/s (median; {rates[0]:.2f}-{rates[-1]:.2f}); "
              f"the shim's all-reduce of that size, right after: bus bandwidth {bus:.2f} GB/s; ratio {med / bus:.2f}")


if __name__ == "__main__":
    main()
