"""DDP step time with ddp-agent's comm hook against DDP's built-in all-reduce (gloo).

Runs examples/train.py under ddp-agent with --comm-hook ddp-agent and with
--comm-hook none, the same steps, alternating (and swapping which goes first
each repetition), and reads the `step_time` line that rank 0 prints (forward,
backward with the gradient all-reduce, optimizer step; warm-up steps left
out). Prints a Markdown table: each mode's mean over repetitions of the
per-run mean and median step time, and the ratios hook / built-in (below 1:
the hook is faster; the median resists other work on the machine better).

    /usr/bin/python3 examples/bench/ddp_step.py --agent bin/ddp-agent --python /usr/bin/python3

Needs only the standard library itself; the workers need PyTorch.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINE = re.compile(r"step_time comm_hook=(\S+) steps=(\d+) warmup=(\d+) mean_ms=([\d.]+) median_ms=([\d.]+)")
MODES = ("ddp-agent", "none")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--agent", default=os.path.join(REPO, "bin", "ddp-agent"))
    p.add_argument("--python", default="/usr/bin/python3", help="the workers' interpreter (with PyTorch)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--reps", type=int, default=3, help="runs per mode")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--timeout", type=float, default=300, help="seconds per run")
    p.add_argument("train_args", nargs="*", help="more train.py arguments (after --), e.g. -- --batch-size 64")
    return p.parse_args()


def run_once(args, mode, ckpt_dir):
    cmd = [args.agent, "run", "--standalone", "--nproc-per-node", str(args.nproc), "--python", args.python,
           os.path.join(REPO, "examples", "train.py"), "--steps", str(args.steps),
           "--warmup-steps", str(args.warmup_steps), "--ckpt-every", "0", "--log-every", str(10 ** 9),
           "--ckpt-dir", ckpt_dir, "--comm-hook", mode] + args.train_args
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=args.timeout,
                           cwd=REPO)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        sys.exit("ddp_step: %s timed out after %.0fs\n%s" % (" ".join(cmd), args.timeout, out[-4000:]))
    wall = time.monotonic() - t0
    m = LINE.search(p.stdout)
    if p.returncode != 0 or not m or m.group(1) != mode:
        sys.exit("ddp_step: %s failed (exit %d)\n%s" % (" ".join(cmd), p.returncode, p.stdout[-4000:]))
    return {"mean": float(m.group(4)), "median": float(m.group(5)), "steps": int(m.group(2)), "wall": wall}


def main():
    args = parse_args()
    if not os.path.exists(args.agent):
        sys.exit("ddp_step: %s not found; run `make build`" % args.agent)
    results = {m: [] for m in MODES}
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ddp-step-") as tmp:
        for rep in range(args.reps):
            order = MODES if rep % 2 == 0 else MODES[::-1]
            for mode in order:
                r = run_once(args, mode, os.path.join(tmp, mode))
                results[mode].append(r)
                print("# rep %d %-9s mean %8.2f ms  median %8.2f ms  (%d steps, run %.1fs)"
                      % (rep + 1, mode, r["mean"], r["median"], r["steps"], r["wall"]), file=sys.stderr, flush=True)

    def agg(mode, key):
        return statistics.fmean(r[key] for r in results[mode])

    def spread(mode):
        means = [r["mean"] for r in results[mode]]
        return "%.1f–%.1f" % (min(means), max(means))

    print()
    print("| comm | mean step (ms) | median step (ms) | run means (ms) | mean vs built-in | median vs built-in |")
    print("|---|---:|---:|---:|---:|---:|")
    names = {"ddp-agent": "ddp-agent hook (libddpshim.so, host)", "none": "DDP built-in (gloo)"}
    for mode in MODES:
        print("| %s | %.2f | %.2f | %s | %.3f | %.3f |" % (
            names[mode], agg(mode, "mean"), agg(mode, "median"), spread(mode),
            agg(mode, "mean") / agg("none", "mean"), agg(mode, "median") / agg("none", "median")))
    print()
    print("examples/train.py (~5.3M float32 parameters, batch %s per rank), %d ranks under ddp-agent, %d steps a run, "
          "first %d left out; %d runs per mode, alternating; extra train.py args: %s."
          % (next((a for i, a in enumerate(args.train_args) if i and args.train_args[i - 1] == "--batch-size"), "32"),
             args.nproc, args.steps, args.warmup_steps, args.reps, " ".join(args.train_args) or "none"))
    print("Load average %.2f at the start, %.2f at the end (other work on the machine skews the figures)."
          % (load0, os.getloadavg()[0]))
    print("ratio hook / built-in: mean step time %.3f, median step time %.3f (below 1: the hook is faster)"
          % (agg("ddp-agent", "mean") / agg("none", "mean"), agg("ddp-agent", "median") / agg("none", "median")),
          flush=True)


if __name__ == "__main__":
    main()
