"""DDP step time of a hooked job under plain torchrun with `ddp-agent sidecar` beside it against without one.

Runs examples/train.py (with the ddp_agent comm hook, train.py's default)
under torchrun (scripts/torchrun_compat.py: Debian's torchrun 1.13 under
Python 3.11), 2 workers on one node with a c10d rendezvous of the run's own
(a free port, a fresh --rdzv_id: torch 1.13's --standalone always takes
port 29400), the same steps in each mode, and reads the `step_time` line
that rank 0 prints (forward, backward with the gradient all-reduce,
optimizer step; warm-up steps left out). The modes:

  without  no sidecar: $DDP_AGENT_SOCKET names a path in an empty directory
           that does not exist, and $TMPDIR and $XDG_RUNTIME_DIR are a fresh
           empty directory, so the hook's default socket path cannot exist
           either. The hook works as it does with no sidecar on the node:
           it sends its per-bucket events nowhere.
  with     `ddp-agent sidecar --socket S --log-dir D` started for the run on
           a fresh socket (the benchmark waits for the socket), with its
           defaults otherwise (--trace-sample 0.1, --hang-timeout 60s):
           each worker's hook finds it through $DDP_AGENT_SOCKET and sends
           it its events; the sidecar analyzes them (stalls, stragglers, the
           hang watch) and writes the job's Perfetto trace into
           D/<job id>/. It is stopped with SIGTERM after torchrun exits, which
           closes the job and flushes the trace. $TMPDIR and
           $XDG_RUNTIME_DIR are a fresh empty directory as in `without`.

Both modes' workers run the same hook and the same shim; what `with` adds
is the events on the socket, the sidecar's work beside the workers on the
same cores, and the hook's stack dump handler (registered when a sidecar is
found). The run is checked to have reached the sidecar, or the benchmark
fails: the sidecar's stderr must say `watching a new job` (world size 2),
and after SIGTERM its log dir must hold exactly one trace-gen0.json with
events in it.

On a small shared machine the step time's run-to-run noise is far above
1 %, so the benchmark also reports a figure the noise does not move: the
sidecar's own CPU time (/proc/PID/stat, from its start to the job's end)
against the CPU time of torchrun and its workers (getrusage of the
reaped children), the share of the node's CPU the sidecar takes from the
job at most.

The modes run in ABBA order (repetition 1: without, with; repetition 2:
with, without; ...): this VM's speed drifts within minutes, and
alternating the order puts both modes under the same drift, with neither
always first. Prints a Markdown table: each mode's median step time (the
median over runs of each run's median) with the spread of the run medians
(min-max), and the ratio with / without of each repetition's pair (median
and range); then one JSON line.

    /usr/bin/python3 examples/bench/sidecar_overhead.py --agent bin/ddp-agent --python /usr/bin/python3

Needs only the standard library itself; the workers need PyTorch, and
bin/libddpshim.so (`make build`).
"""

import argparse
import atexit
import glob
import json
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEP_LINE = re.compile(r"step_time comm_hook=(\S+) steps=(\d+) warmup=(\d+) mean_ms=([\d.]+) median_ms=([\d.]+)"
                       r"(?: min_ms=([\d.]+) p90_ms=([\d.]+) max_ms=([\d.]+))?")
WATCHING = re.compile(r'msg="watching a new job".*?world_size=(\d+)')
STALL = re.compile(r'msg="(?:stall: |persistent straggler)')
WARN = re.compile(r"level=(?:WARN|ERROR)")
MODES = ("without", "with")
NAMES = {
    "without": "without (no sidecar on the node)",
    "with": "with `ddp-agent sidecar --log-dir` (Perfetto)",
}
# Variables a launcher sets for its workers: left out, so that a benchmark
# run under one (or under ddp-agent run) starts its own jobs clean.
LAUNCHER_VARS = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
                 "MASTER_PORT"}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--agent", default=os.path.join(REPO, "bin", "ddp-agent"))
    p.add_argument("--shim", default=os.path.join(REPO, "bin", "libddpshim.so"), help="$DDP_AGENT_SHIM for the workers")
    p.add_argument("--python", default="/usr/bin/python3", help="the workers' interpreter (with PyTorch)")
    p.add_argument("--torchrun-compat", default=os.path.join(REPO, "scripts", "torchrun_compat.py"),
                   help="the torchrun to run (run with --python)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--reps", type=int, default=5, help="repetitions; each runs both modes once, ABBA order")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--sidecar-flag", action="append", default=[],
                   help="one more flag for the sidecar, e.g. --sidecar-flag=--trace-sample=1 (repeatable)")
    p.add_argument("--goal", type=float, default=1.0, help="overhead goal, percent (default 1)")
    p.add_argument("--timeout", type=float, default=180, help="seconds per run")
    p.add_argument("--retries", type=int, default=1,
                   help="runs of a run whose torchrun failed again (a loaded machine can time out a rendezvous); "
                        "counted in the output (default 1). A 'with' run that did not reach the sidecar is never "
                        "retried: the benchmark fails")
    p.add_argument("--json", help="also write the JSON line here")
    p.add_argument("train_args", nargs="*", help="more train.py arguments (after --)")
    return p.parse_args()


# ---- processes: each in a process group of its own, none left behind ---------------

LIVE = []  # Popen objects whose process group may still hold processes
LIVE_LOCK = threading.Lock()


def start(cmd, env, **kw):
    with LIVE_LOCK:
        p = subprocess.Popen(cmd, env=env, cwd=REPO, start_new_session=True, **kw)
        LIVE.append(p)
    return p


def group_alive(pgid):
    """Whether any process is still in process group pgid (read from /proc)."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def kill_group(p, sig=signal.SIGKILL):
    """Signals p's process group: while p is unreaped its pid is the group's, and once reaped only while
    members are left (a pid that leads a live group is not reused)."""
    if p.returncode is None or group_alive(p.pid):
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap(p):
    """Kills whatever is left of p's group and waits for p."""
    kill_group(p)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    with LIVE_LOCK:
        if p in LIVE:
            LIVE.remove(p)


def cleanup():
    with LIVE_LOCK:
        procs = list(LIVE)
    for p in procs:
        reap(p)


def on_signal(signum, _frame):
    cleanup()
    sys.exit(128 + signum)


# ---- runs -----------------------------------------------------------------------------

class RunFailed(Exception):
    pass


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(args, run_dir):
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith(("OTEL_", "TORCHELASTIC_", "PET_", "DDP_AGENT_")) or k in LAUNCHER_VARS)}
    tmp = os.path.join(run_dir, "tmp")  # empty: the default socket path cannot exist under it
    os.makedirs(tmp, mode=0o700)
    env.update(TMPDIR=tmp, XDG_RUNTIME_DIR=tmp, DDP_AGENT_SHIM=args.shim)
    return env


def start_sidecar(args, env, sock, log_dir, err_path):
    cmd = [args.agent, "sidecar", "--socket", sock, "--log-dir", log_dir] + args.sidecar_flag
    err = open(err_path, "w")
    try:
        p = start(cmd, env, stdout=subprocess.DEVNULL, stderr=err)
    finally:
        err.close()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if os.path.exists(sock):
            return p
        if p.poll() is not None:
            break
        time.sleep(0.02)
    reap(p)
    sys.exit("sidecar_overhead: the sidecar did not serve %s (exit %s)\n%s"
             % (sock, p.returncode, read(err_path)[-4000:]))


def stop_sidecar(p, err_path):
    kill_group(p, signal.SIGTERM)
    try:
        rc = p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        reap(p)
        sys.exit("sidecar_overhead: the sidecar did not stop within 20 s of SIGTERM: killed\n%s"
                 % read(err_path)[-4000:])
    reap(p)
    return rc


def cpu_seconds(pid):
    """User + system CPU seconds of a live process, from /proc/PID/stat (None when gone)."""
    stat = read("/proc/%d/stat" % pid)
    if not stat:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # fields[0] is field 3 (state): utime is 14, stime 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def perfetto(log_dir):
    """The trace files under log_dir: their number, bytes, events, slices and `step N` slices."""
    files = sorted(glob.glob(os.path.join(log_dir, "*", "trace-gen*.json")))
    out = {"files": [os.path.relpath(f, log_dir) for f in files], "bytes": sum(os.path.getsize(f) for f in files),
           "events": 0, "slices": 0, "step_slices": 0}
    for f in files:
        try:
            with open(f) as fh:
                data = json.load(fh)
        except (ValueError, OSError) as e:
            out["parse_error"] = "%s: %s" % (os.path.basename(f), e)
            continue
        events = data.get("traceEvents", []) if isinstance(data, dict) else data
        out["events"] += len(events)
        out["slices"] += sum(1 for e in events if e.get("ph") == "X")
        out["step_slices"] += sum(1 for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("step "))
    return out


def run_retrying(args, mode, tmp, rep, failures):
    for attempt in range(args.retries + 1):
        try:
            return run_once(args, mode, tmp, "%d-%d" % (rep + 1, attempt))
        except RunFailed as e:
            msg = str(e)
            if attempt == args.retries:
                sys.exit(msg)
            failures.append({"mode": mode, "rep": rep + 1, "error": msg.splitlines()[0]})
            print("# rep %d %-7s failed, running it again: %s" % (rep + 1, mode, failures[-1]["error"]),
                  file=sys.stderr, flush=True)


def run_once(args, mode, tmp, tag):
    run_dir = os.path.join(tmp, "%s-%s" % (mode, tag))
    os.makedirs(run_dir)
    env = base_env(args, run_dir)
    log_dir = os.path.join(run_dir, "logs")
    sc_err = os.path.join(run_dir, "sidecar.stderr")
    if mode == "with":
        sock = os.path.join(run_dir, "sc", "sidecar.sock")  # the sidecar makes sc/ (0700)
    else:
        sock = os.path.join(run_dir, "nosidecar", "sidecar.sock")  # no such directory
    env["DDP_AGENT_SOCKET"] = sock
    job = "sidecar-bench-%d-%s-%s" % (os.getpid(), mode, tag)
    cmd = ([args.python, args.torchrun_compat, "--nnodes", "1", "--nproc_per_node", str(args.nproc),
            "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:%d" % free_port(), "--rdzv_id", job,
            os.path.join(REPO, "examples", "train.py"), "--steps", str(args.steps),
            "--warmup-steps", str(args.warmup_steps), "--ckpt-every", "0", "--log-every", str(10 ** 9),
            "--ckpt-dir", os.path.join(run_dir, "ckpt"), "--batch-size", str(args.batch_size)] + args.train_args)

    sc = start_sidecar(args, env, sock, log_dir, sc_err) if mode == "with" else None
    t0, cpu0 = time.monotonic(), children_cpu()
    p = start(cmd, env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timer = threading.Timer(args.timeout, kill_group, (p,))
    timer.start()
    try:
        out = p.stdout.read()
        rc = p.wait()
    finally:
        timer.cancel()
        reap(p)  # workers torchrun left behind, if any
    wall = time.monotonic() - t0
    job_cpu = children_cpu() - cpu0  # torchrun and its workers (reaped); the sidecar is not yet
    sc_cpu = cpu_seconds(sc.pid) if sc else None  # from its start to the job's end, before the flush
    sc_rc = stop_sidecar(sc, sc_err) if sc else None

    m = STEP_LINE.search(out)
    if rc != 0 or not m:
        raise RunFailed("sidecar_overhead: %s run %s: torchrun failed (exit %d%s)\n%s\n%s"
                        % (mode, tag, rc, ", timed out" if wall >= args.timeout else "", " ".join(cmd), out[-4000:]))
    r = {"median": float(m.group(5)), "mean": float(m.group(4)), "steps": int(m.group(2)), "wall": wall,
         "p90": float(m.group(7)) if m.group(7) else None, "job_cpu_s": job_cpu,
         "hook_warnings": [l for l in out.splitlines() if "ddp_agent" in l and re.search(r"(?i)warn|error", l)]}
    if mode == "with":
        log = read(sc_err)
        w = WATCHING.findall(log)
        trace = perfetto(log_dir)
        problems = []
        if len(w) != 1 or int(w[0]) != args.nproc:
            problems.append("want one `watching a new job` with world_size=%d in its log, got %s" % (args.nproc, w))
        if sc_rc != 0:
            problems.append("it exited with %s after SIGTERM" % sc_rc)
        if len(trace["files"]) != 1 or not trace["files"][0].endswith("trace-gen0.json") or trace["events"] == 0:
            problems.append("want one trace-gen0.json with events under %s, got %s" % (log_dir, trace))
        if problems:
            sys.exit("sidecar_overhead: the 'with' run %s did not reach the sidecar as it should: %s\nsidecar stderr:\n"
                     "%s\ntorchrun output:\n%s" % (tag, "; ".join(problems), log[-4000:], out[-2000:]))
        r["sidecar"] = {"perfetto": trace, "cpu_s": sc_cpu, "stall_lines": len(STALL.findall(log)),
                        "warnings": [l for l in log.splitlines() if WARN.search(l)]}
    return r


def main():
    args = parse_args()
    for path, what in ((args.agent, "ddp-agent"), (args.shim, "libddpshim.so")):
        if not os.path.exists(path):
            sys.exit("sidecar_overhead: %s (%s) not found; run `make build`" % (path, what))
    atexit.register(cleanup)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    results = {m: [] for m in MODES}
    failures = []
    loadavg0, t_start = read("/proc/loadavg").strip(), time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sidecar-overhead-") as tmp:
        for rep in range(args.reps):
            order = MODES if rep % 2 == 0 else MODES[::-1]  # ABBA: without, with | with, without | ...
            for mode in order:
                r = run_retrying(args, mode, tmp, rep, failures)
                results[mode].append(r)
                extra = ""
                if "sidecar" in r:
                    t = r["sidecar"]["perfetto"]
                    extra = "  perfetto %d B, %d events (%d `step N`), %d stall lines, %d sidecar warnings" % (
                        t["bytes"], t["events"], t["step_slices"], r["sidecar"]["stall_lines"],
                        len(r["sidecar"]["warnings"]))
                print("# rep %d %-7s median %8.2f ms  mean %8.2f ms  (%d steps, run %.1fs)%s"
                      % (rep + 1, mode, r["median"], r["mean"], r["steps"], r["wall"], extra), file=sys.stderr, flush=True)
    wall = time.monotonic() - t_start
    loadavg1 = read("/proc/loadavg").strip()
    load0, load1 = float(loadavg0.split()[0]), float(loadavg1.split()[0])

    def med(mode, key="median"):
        return statistics.median(r[key] for r in results[mode])

    rs = [a["median"] / b["median"] for a, b in zip(results["with"], results["without"])]
    summary = {}
    for mode in MODES:
        meds = [r["median"] for r in results[mode]]
        summary[mode] = {"median_ms": med(mode), "mean_ms": med(mode, "mean"), "run_medians_ms": meds,
                         "run_median_min_ms": min(meds), "run_median_max_ms": max(meds),
                         "cv_run_medians": (statistics.stdev(meds) if len(meds) > 1 else 0.0) / statistics.fmean(meds)}
    summary["with"].update(ratio_of_medians=med("with") / med("without"), ratio_per_rep=rs,
                           ratio_per_rep_median=statistics.median(rs), ratio_per_rep_min=min(rs),
                           ratio_per_rep_max=max(rs))

    print()
    print("| mode | median step (ms) | run medians, min–max (ms) | mean step (ms) | with / without (medians of runs) "
          "| with / without per rep: median (range) |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode in MODES:
        s = summary[mode]
        ratio = "1" if mode == "without" else "%.3f" % s["ratio_of_medians"]
        per = "–" if mode == "without" else "%.3f (%.3f–%.3f)" % (s["ratio_per_rep_median"], s["ratio_per_rep_min"],
                                                                 s["ratio_per_rep_max"])
        print("| %s | %.2f | %.1f–%.1f | %.2f | %s | %s |" % (NAMES[mode], s["median_ms"], s["run_median_min_ms"],
                                                              s["run_median_max_ms"], s["mean_ms"], ratio, per))
    print()

    traces = [r["sidecar"]["perfetto"] for r in results["with"]]
    sc_warnings = [w for r in results["with"] for w in r["sidecar"]["warnings"]]
    hook_warnings = {m: [w for r in results[m] for w in r["hook_warnings"]] for m in MODES}
    proof = {"trace_bytes_per_run": [t["bytes"] for t in traces], "trace_events_per_run": [t["events"] for t in traces],
             "step_slices_per_run": [t["step_slices"] for t in traces],
             "stall_lines_per_run": [r["sidecar"]["stall_lines"] for r in results["with"]],
             "sidecar_cpu_s_per_run": [r["sidecar"]["cpu_s"] for r in results["with"]],
             "job_cpu_s_per_run": {m: [r["job_cpu_s"] for r in results[m]] for m in MODES}}
    shares = [r["sidecar"]["cpu_s"] / r["job_cpu_s"] for r in results["with"] if r["sidecar"]["cpu_s"] is not None]
    proof["sidecar_cpu_share_median"] = statistics.median(shares) if shares else None
    timed = args.steps - args.warmup_steps
    print("examples/train.py (~5.3M float32 parameters, ddp_agent comm hook, batch %d per rank), %d ranks under "
          "torchrun (%s, c10d rendezvous on a free port), %d steps a run, first %d left out (%d timed); %d "
          "repetitions, each one run per mode, ABBA order; sidecar flags: --log-dir%s; extra train.py args: %s."
          % (args.batch_size, args.nproc, os.path.relpath(args.torchrun_compat, REPO), args.steps, args.warmup_steps,
             timed, args.reps, "".join(" " + f for f in args.sidecar_flag), " ".join(args.train_args) or "none"))
    print("with: every run's sidecar logged `watching a new job` (world size %d) and wrote one trace-gen0.json: "
          "%s bytes, %s events (%s of them `step N` slices) per run; stall/straggler lines per run %s; sidecar "
          "warnings in all: %d%s."
          % (args.nproc, proof["trace_bytes_per_run"], proof["trace_events_per_run"], proof["step_slices_per_run"],
             proof["stall_lines_per_run"], len(sc_warnings),
             (" (first: %s)" % sc_warnings[0]) if sc_warnings else ""))
    if shares:
        print("The sidecar's own CPU time per 'with' run (from its start to the job's end): %s s, against %s s of "
              "torchrun and its workers: %.2f%% of the job's CPU (median; range %.2f%%-%.2f%%). Job CPU per "
              "'without' run: %s s."
              % ([round(x, 2) for x in proof["sidecar_cpu_s_per_run"]],
                 [round(x, 1) for x in proof["job_cpu_s_per_run"]["with"]], statistics.median(shares) * 100,
                 min(shares) * 100, max(shares) * 100, [round(x, 1) for x in proof["job_cpu_s_per_run"]["without"]]))
    for mode in MODES:
        if hook_warnings[mode]:
            print("%s: the workers' ddp_agent warnings: %d (first: %s)." % (mode, len(hook_warnings[mode]),
                                                                          hook_warnings[mode][0]))
    if failures:
        print("Runs that failed and were run again: %d (%s)."
              % (len(failures), "; ".join("rep %d %s: %s" % (f["rep"], f["mode"], f["error"]) for f in failures)))
    print("/proc/loadavg at the start: %s; at the end: %s; %d CPUs; %.0f s in all (other work on the machine skews "
          "the figures)." % (loadavg0, loadavg1, os.cpu_count(), wall))
    noise = statistics.median(summary[m]["cv_run_medians"] for m in MODES) * 100
    s = summary["with"]
    lo, hi = (s["ratio_per_rep_min"] - 1) * 100, (s["ratio_per_rep_max"] - 1) * 100
    noisy = ", but the run-to-run noise (CV %.1f%%) is above the goal: not conclusive" % noise
    if args.reps < 2:
        v = "one rep: no spread, not resolved"
    elif hi < args.goal:
        v = "under the goal in every rep" + (noisy if noise >= args.goal else "")
    elif lo > args.goal:
        v = "over the goal in every rep" + (noisy if noise >= args.goal else "")
    else:
        v = "not resolved: the reps straddle the goal" + (noisy if noise >= args.goal else "")
    s["verdict"] = v
    print("overhead with / without, goal < %g%%: %+.1f%% (median of reps; reps %+.1f%% to %+.1f%%; medians of runs "
          "%+.1f%%): %s. Run-to-run spread of a mode's run medians (CV, median over modes): %.1f%%."
          % (args.goal, (s["ratio_per_rep_median"] - 1) * 100, lo, hi, (s["ratio_of_medians"] - 1) * 100, v, noise),
          flush=True)

    result = {"bench": "sidecar_overhead", "nproc": args.nproc, "steps": args.steps, "warmup_steps": args.warmup_steps,
              "batch_size": args.batch_size, "reps": args.reps, "order": "ABBA", "sidecar_flags": args.sidecar_flag,
              "train_args": args.train_args, "modes": summary, "proof": proof, "sidecar_warnings": sc_warnings,
              "hook_warnings": hook_warnings, "load_average": [load0, load1], "loadavg": [loadavg0, loadavg1],
              "cpus": os.cpu_count(), "wall_s": wall, "failed_runs_retried": failures, "goal_pct": args.goal,
              "noise_cv_pct": noise}
    line = json.dumps(result, sort_keys=True)
    print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
