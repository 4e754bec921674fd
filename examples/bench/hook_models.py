"""Step time of real model architectures with the ddp_agent hook against DDP's default all-reduce (gloo, 2 CPU ranks).

The CPU side of the hook's speed goal (issue 31): the models a DDP user
trains (ResNet-50, a GPT-2-small-class decoder, a ~1 B-parameter decoder),
scaled down to run on two CPU ranks, each with DDP's bucket cap scaled by the
same factor as its gradients so it keeps about its full size's number of
buckets (examples/bench/models.py). Each rank builds two DDP copies of a
model from one seed:

  hook     ddp_agent.register(ddp, transport="host"): the shim's host transport
  default  no hook registered: DDP's built-in C++ all-reduce on the gloo group,
           what a user runs without ddp-agent

and trains both on the same batches in interleaved rounds of --steps-per-round
steps (ABBA order, so drift in the machine's load hits both alike), every
round timed from a barrier to a barrier. Reported per model: the median step
time of each, the ratio hook / default per round (median and spread), the
host time the hook takes on the autograd thread (every call DDP makes to it
timed from entry to the returned Future: per bucket and summed per step),
and whether the two copies end with bit-identical parameters.

    /usr/bin/python3 examples/bench/hook_models.py --rounds 20 --steps-per-round 4

Prints a Markdown table, then one JSON line (also written to --json). Needs
PyTorch and `make build` (bin/libddpshim.so, or $DDP_AGENT_SHIM).
"""

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ranks import base_env as run_ranks_env  # noqa: E402  (examples/bench/ranks.py)
from ranks import run as run_ranks  # noqa: E402
from ranks import write_result  # noqa: E402
MODELS = ("resnet50", "gpt2-small", "gpt-1b")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    p.add_argument("--rounds", type=int, default=20, help="timed rounds per model (each: both copies, ABBA)")
    p.add_argument("--steps-per-round", type=int, default=4)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps of each copy first (buckets rebuilt)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds for the whole run")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # the ranks: their output directory
    return p.parse_args()


# -- the ranks ----------------------------------------------------------------------------


def _timed_hook(samples, fn):
    """Wraps the function the hook registers: one sample (ns) per call; DDP checks the name bucket."""

    @functools.wraps(fn)
    def hook(state, bucket):
        t0 = time.perf_counter_ns()
        try:
            return fn(state, bucket)
        finally:
            samples.append(time.perf_counter_ns() - t0)

    return hook


def _bench_model(args, spec, rank, torch, dist, ddp_agent, models):
    from torch.nn.parallel import DistributedDataParallel as DDP

    copies, samples, hook = {}, [], None
    for kind in ("hook", "default"):
        torch.manual_seed(1234)
        model, source = spec.build()
        ddp = DDP(model, bucket_cap_mb=spec.bucket_cap_mb)
        if kind == "hook":
            orig = ddp.register_comm_hook
            ddp.register_comm_hook = lambda state, fn: orig(state, _timed_hook(samples, fn))
            try:
                hook = ddp_agent.register(ddp, transport="host", timeout=120)
            finally:
                del ddp.register_comm_hook
        copies[kind] = {"ddp": ddp, "opt": torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9),
                        "round_ms": [], "source": source}
    g = torch.Generator().manual_seed(100 + rank)
    cpu = torch.device("cpu")
    batches = [spec.batch(g, cpu) for _ in range(args.steps_per_round)]
    for _ in range(args.warmup):
        for kind in ("hook", "default"):
            models.step(copies[kind]["ddp"], copies[kind]["opt"], spec, *batches[0], None)
    calls_before = len(samples)
    per_step_hook_ns = []
    for r in range(args.rounds):
        for kind in (("hook", "default") if r % 2 == 0 else ("default", "hook")):
            c = copies[kind]
            dist.barrier()
            t0 = time.perf_counter()
            for x, y in batches:
                before = len(samples)
                models.step(c["ddp"], c["opt"], spec, x, y, None)
                if kind == "hook":
                    per_step_hook_ns.append(sum(samples[before:]))
            dist.barrier()
            c["round_ms"].append((time.perf_counter() - t0) * 1e3 / len(batches))
    buckets = (len(samples) - calls_before) / max(1, len(per_step_hook_ns))
    out = {
        "describe": spec.describe, "parameters": models.parameters(copies["hook"]["ddp"].module),
        "bucket_cap_mb": spec.bucket_cap_mb, "source": copies["hook"]["source"],
        "round_ms": {k: c["round_ms"] for k, c in copies.items()},
        "hook_call_ns": samples[calls_before:], "hook_step_ns": per_step_hook_ns, "buckets_per_step": buckets,
        "digest": {k: models.digest(c["ddp"].module) for k, c in copies.items()},
    }
    hook.close()
    return out


def worker(args):
    import torch
    import torch.distributed as dist

    import models  # examples/bench/models.py

    import ddp_agent

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method="env://")
    specs = models.scaled_down()
    result = {"rank": rank, "torch": torch.__version__, "models": {}}
    for name in args.models.split(","):
        result["models"][name] = _bench_model(args, specs[name], rank, torch, dist, ddp_agent, models)
    write_result(args.worker, rank, result)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # no teardown of gloo's threads


# -- the launcher ---------------------------------------------------------------------------


def summarize(name, ranks):
    """One model's figures from both ranks: round times are rank 0's (the ranks run in lockstep)."""
    m0 = ranks[0]["models"][name]
    hook, default = m0["round_ms"]["hook"], m0["round_ms"]["default"]
    ratios = sorted(h / d for h, d in zip(hook, default))
    calls = sorted(x / 1e3 for r in ranks for x in r["models"][name]["hook_call_ns"])
    steps = sorted(x / 1e3 for r in ranks for x in r["models"][name]["hook_step_ns"])
    digests = {k: {r["models"][name]["digest"][k] for r in ranks} for k in ("hook", "default")}
    return {
        "describe": m0["describe"], "parameters": m0["parameters"], "source": m0["source"],
        "bucket_cap_mb": m0["bucket_cap_mb"], "buckets_per_step": m0["buckets_per_step"],
        "hook_step_ms": statistics.median(hook), "default_step_ms": statistics.median(default),
        "ratio_median": statistics.median(ratios), "ratio_min": ratios[0], "ratio_max": ratios[-1],
        "rounds": len(ratios),
        "hook_us_per_bucket": statistics.median(calls), "hook_us_per_bucket_p90": calls[int(0.9 * (len(calls) - 1))],
        "hook_us_per_step": statistics.median(steps),
        "identical": len(digests["hook"]) == 1 and digests["hook"] == digests["default"],
    }


def main():
    args = parse_args()
    if args.worker:
        return worker(args)
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown:
        sys.exit("hook_models: unknown models %s; known: %s" % (unknown, ", ".join(MODELS)))
    load0, t0 = os.getloadavg()[0], time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hook-models-") as tmp:
        ranks = run_ranks("hook_models", __file__, tmp, run_ranks_env(), args.timeout)
    wall = time.monotonic() - t0
    rows = {name: summarize(name, ranks) for name in args.models.split(",")}
    print("# 2 ranks (gloo on 127.0.0.1, one thread each); torch %s; %s, %d CPUs; %d rounds of %d steps per copy "
          "after %d warm-up, ABBA; load average %.2f at the start, %.2f at the end; %.0f s" % (
              ranks[0]["torch"], platform.machine(), os.cpu_count(), args.rounds, args.steps_per_round,
              args.warmup, load0, os.getloadavg()[0], wall))
    print()
    print("| model (scaled down) | params | buckets/step | hook step (ms) | default step (ms) "
          "| hook / default, median (rounds' range) | hook host time per bucket, median (p90) µs "
          "| per step (µs) | parameters bit-identical |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, r in rows.items():
        print("| %s: %s | %.1f M | %g | %.1f | %.1f | %.3f (%.3f-%.3f) | %.1f (%.1f) | %.0f | %s |" % (
            name, r["describe"], r["parameters"] / 1e6, r["buckets_per_step"], r["hook_step_ms"],
            r["default_step_ms"], r["ratio_median"], r["ratio_min"], r["ratio_max"], r["hook_us_per_bucket"],
            r["hook_us_per_bucket_p90"], r["hook_us_per_step"], "yes" if r["identical"] else "NO"))
    result = {"bench": "hook_models", "torch": ranks[0]["torch"], "cpus": os.cpu_count(),
              "args": {k: v for k, v in vars(args).items() if k not in ("worker", "json")},
              "models": rows, "load_average": [load0, os.getloadavg()[0]], "wall_s": wall}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print()
    print(json.dumps(result, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
