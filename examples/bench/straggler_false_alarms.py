"""Counts persistent-straggler false alarms: runs a balanced job (balanced.py,
nothing slow on purpose) N times under ddp-agent and counts the runs with a
"persistent straggler" line. Each agent given is run on the same jobs,
interleaved, so that the machine's load falls on both alike.

    python3 examples/bench/straggler_false_alarms.py --runs 50 bin/ddp-agent [/path/to/old/ddp-agent]

Prints, per agent, the runs with an alarm and the ranks named.
"""

import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(agent, python, steps, step_ms):
    r = subprocess.run([agent, "run", "--standalone", "--nproc-per-node", "2", "--python", python,
                        os.path.join(HERE, "balanced.py"), "--steps", str(steps), "--step-ms", str(step_ms)],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"{agent}: exit {r.returncode}\n{r.stderr[-3000:]}")
    return re.findall(r'msg="persistent straggler: rank (\d+)', r.stderr)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("agents", nargs="+")
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--step-ms", type=float, default=25.0)
    p.add_argument("--python", default=sys.executable)
    args = p.parse_args()
    alarms = {a: [] for a in args.agents}
    for i in range(args.runs):
        for a in args.agents:
            named = run(a, args.python, args.steps, args.step_ms)
            if named:
                alarms[a].append((i, sorted(set(named))))
        print(f"run {i + 1}/{args.runs}: " + "; ".join(f"{a}: {len(v)} with an alarm" for a, v in alarms.items()), flush=True)
    for a, v in alarms.items():
        print(f"{a}: {len(v)} of {args.runs} balanced runs named a persistent straggler {v}")


if __name__ == "__main__":
    main()
