"""DDP step time under ddp-agent with all its telemetry on against telemetry as low as it goes.

Runs examples/train.py (with the ddp_agent comm hook, train.py's default)
under ddp-agent in each mode, the same steps, several repetitions, the order
of the modes rotating every repetition, and reads the `step_time` line that
rank 0 prints (forward, backward with the gradient all-reduce, optimizer
step; warm-up steps left out). The modes:

  off      --trace-sample 0 --hang-timeout 0; no --log-dir, no
           --metrics-addr, no OTLP endpoint. The agent has no switch for the
           stall analysis itself: it still receives every collective the
           hook reports and analyzes it (stall lines still appear), and
           still records the metrics in memory, with no reader.
  on       --log-dir (a Perfetto trace-gen0.json written as it goes, and the
           per-rank stdout/stderr files), --trace-sample 1 (every step
           traced), --metrics-addr 127.0.0.1:0 (Prometheus on a port the
           kernel picks; the agent logs its URL), --hang-timeout 60s.
  on-otlp  the same, but traces and metrics go over OTLP/HTTP to a sink in
           this process (--otel-endpoint http://127.0.0.1:PORT): with OTLP
           the agent writes no Perfetto file. The sink reads each POST to
           /v1/traces or /v1/metrics, answers 200 with an empty body (an
           empty ExportTraceServiceResponse), and counts the requests,
           bytes, spans and metrics received (decoded after the run, so that
           the decoding does not load the machine while it is measured).
           An http:// endpoint means OTLP/HTTP (protobuf).

To show that "on" really traced, it reports the Perfetto file's size and
slices, the sink's spans and bytes, and one scrape of the Prometheus
endpoint (ddp_collectives_total), taken when rank 0 prints `done:`, after
the timed steps. Prints a Markdown table, each mode's median step time (the
median over runs of each run's median) with the spread over runs, and the
ratio on / off per repetition (median and range), then one JSON line.

    /usr/bin/python3 examples/bench/telemetry_overhead.py --agent bin/ddp-agent --python /usr/bin/python3

Needs only the standard library itself; the workers need PyTorch.
"""

import argparse
import glob
import gzip
import http.server
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEP_LINE = re.compile(r"step_time comm_hook=(\S+) steps=(\d+) warmup=(\d+) mean_ms=([\d.]+) median_ms=([\d.]+)"
                       r"(?: min_ms=([\d.]+) p90_ms=([\d.]+) max_ms=([\d.]+))?")
METRICS_URL = re.compile(r'msg="serving prometheus metrics".*url=(\S+)')
EVENTS = re.compile(r'msg="collective events".*received=(\d+) dropped=(\d+)')
STALL = re.compile(r'msg="stall: ')
NAMES = {
    "off": "off (trace-sample 0, hang-timeout 0, no log dir / metrics / OTLP)",
    "on": "on (log dir + Perfetto, trace-sample 1, Prometheus, hang-timeout 60s)",
    "on-otlp": "on, OTLP/HTTP instead of Perfetto",
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--agent", default=os.path.join(REPO, "bin", "ddp-agent"))
    p.add_argument("--python", default="/usr/bin/python3", help="the workers' interpreter (with PyTorch)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--reps", type=int, default=5, help="runs per mode")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--no-otlp", action="store_true", help="leave out the on-otlp mode")
    p.add_argument("--goal", type=float, default=1.0, help="overhead goal, percent (default 1)")
    p.add_argument("--timeout", type=float, default=120, help="seconds per run")
    p.add_argument("--retries", type=int, default=1,
                   help="runs of a failed run again (a heavily loaded machine can starve the agent of its own "
                        "rendezvous lease); the retries are counted in the output (default 1)")
    p.add_argument("--json", help="also write the JSON line here")
    p.add_argument("train_args", nargs="*", help="more train.py arguments (after --)")
    return p.parse_args()


# ---- a minimal OTLP/HTTP sink -------------------------------------------------

class Sink:
    """Collects the bodies POSTed to /v1/traces and /v1/metrics."""

    def __init__(self):
        self.lock = threading.Lock()
        self.bodies = {"traces": [], "metrics": []}
        self.other = 0  # requests to other paths, or not POST
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the OTLP exporters expect

            def do_POST(self):
                body = self._body()
                sig = {"/v1/traces": "traces", "/v1/metrics": "metrics"}.get(self.path.split("?")[0])
                with sink.lock:
                    if sig:
                        sink.bodies[sig].append((body, self.headers.get("Content-Encoding", "")))
                    else:
                        sink.other += 1
                self.send_response(200 if sig else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _body(self):
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        n = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if n == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return out
                        out += self.rfile.read(n)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self):
        """Returns what arrived since the last take, decoded."""
        with self.lock:
            bodies, self.bodies = self.bodies, {"traces": [], "metrics": []}
            other, self.other = self.other, 0
        out = {"other_requests": other}
        for sig, items in bodies.items():
            raw = [gzip.decompress(b) if enc.lower() == "gzip" else b for b, enc in items]
            names = {}
            for b in raw:
                for name in (span_names(b) if sig == "traces" else metric_names(b)):
                    names[name] = names.get(name, 0) + 1
            out[sig] = {"requests": len(items), "bytes": sum(len(b) for b, _ in items), "names": names,
                        "count": sum(names.values())}
        return out

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def pb_fields(buf):
    """Yields (field number, value) of a protobuf message: bytes for length-delimited fields, else None."""
    i, n = 0, len(buf)

    def varint():
        nonlocal i
        v, shift = 0, 0
        while True:
            b = buf[i]
            i += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return v

    while i < n:
        key = varint()
        num, wt = key >> 3, key & 7
        if wt == 0:
            varint()
            yield num, None
        elif wt == 1:
            i += 8
            yield num, None
        elif wt == 2:
            ln = varint()
            yield num, buf[i:i + ln]
            i += ln
        elif wt == 5:
            i += 4
            yield num, None
        else:
            raise ValueError("protobuf wire type %d" % wt)


def nested(buf, *path):
    """Yields the length-delimited fields at path (field numbers), depth first."""
    if not path:
        yield buf
        return
    for num, v in pb_fields(buf):
        if num == path[0] and v is not None:
            yield from nested(v, *path[1:])


def kind(name):
    """Groups span names: "step 12" -> "step N", "allreduce bucket 1" -> "allreduce bucket B"."""
    return re.sub(r"\d+", "N", name)


def span_names(body):
    # ExportTraceServiceRequest.resource_spans(1) -> ResourceSpans.scope_spans(2) -> ScopeSpans.spans(2) -> Span.name(5)
    for span in nested(body, 1, 2, 2):
        for num, v in pb_fields(span):
            if num == 5:
                yield kind(v.decode(errors="replace"))


def metric_names(body):
    # ExportMetricsServiceRequest.resource_metrics(1) -> ResourceMetrics.scope_metrics(2) -> ScopeMetrics.metrics(2) -> Metric.name(1)
    for metric in nested(body, 1, 2, 2):
        for num, v in pb_fields(metric):
            if num == 1:
                yield v.decode(errors="replace")


# ---- runs -------------------------------------------------------------------------

def scrape(url):
    """Returns (bytes, ddp_collectives_total summed over series) of one Prometheus scrape, or an error string."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            text = r.read().decode(errors="replace")
    except Exception as e:  # the agent may already be shutting down
        return {"error": str(e)}
    total = 0.0
    for line in text.splitlines():
        if line.startswith("ddp_collectives_total"):
            total += float(line.rsplit(None, 1)[1])
    return {"bytes": len(text), "ddp_collectives_total": total}


def perfetto(run_dir):
    files = sorted(glob.glob(os.path.join(run_dir, "**", "trace-gen*.json"), recursive=True))
    if not files:
        return {"files": 0, "bytes": 0}
    out = {"files": len(files), "bytes": sum(os.path.getsize(f) for f in files)}
    try:
        slices, steps = 0, 0
        for f in files:
            with open(f) as fh:
                data = json.load(fh)
            events = data.get("traceEvents", []) if isinstance(data, dict) else data
            slices += sum(1 for e in events if e.get("ph") == "X")
            steps += sum(1 for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("step "))
        out.update(slices=slices, step_slices=steps)
    except (ValueError, OSError) as e:
        out["parse_error"] = str(e)
    return out


class RunFailed(Exception):
    pass


def run_retrying(args, mode, tmp, rep, sink, failures):
    for attempt in range(args.retries + 1):
        try:
            return run_once(args, mode, tmp, "%d-%d" % (rep, attempt), sink)
        except RunFailed as e:
            msg = str(e)
            if attempt == args.retries:
                sys.exit(msg)
            why = re.findall(r'level=ERROR msg="job failed".*', msg)
            failures.append({"mode": mode, "rep": rep + 1, "error": why[-1] if why else msg.splitlines()[0]})
            print("# rep %d %-7s failed, running it again: %s" % (rep + 1, mode, failures[-1]["error"]),
                  file=sys.stderr, flush=True)


def mode_flags(mode, log_dir, sink):
    if mode == "off":
        return ["--trace-sample", "0", "--hang-timeout", "0"]
    flags = ["--log-dir", log_dir, "--trace-sample", "1", "--metrics-addr", "127.0.0.1:0", "--hang-timeout", "60s"]
    if mode == "on-otlp":
        flags += ["--otel-endpoint", "http://127.0.0.1:%d" % sink.port]
    return flags


def run_once(args, mode, tmp, rep, sink):
    log_dir = os.path.join(tmp, "logs-%s-%s" % (mode, rep))
    cmd = ([args.agent, "run", "--standalone", "--nproc-per-node", str(args.nproc), "--python", args.python]
           + mode_flags(mode, log_dir, sink)
           + [os.path.join(REPO, "examples", "train.py"), "--steps", str(args.steps),
              "--warmup-steps", str(args.warmup_steps), "--ckpt-every", "0", "--log-every", str(10 ** 9),
              "--ckpt-dir", os.path.join(tmp, "ckpt"), "--batch-size", str(args.batch_size)] + args.train_args)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if sink:
        sink.take()  # nothing left over from an earlier run
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env)
    timer = threading.Timer(args.timeout, p.kill)
    timer.start()
    lines, url, prom = [], None, None
    try:
        for line in p.stdout:
            lines.append(line)
            m = METRICS_URL.search(line)
            if m:
                url = m.group(1)
            if url and prom is None and "done: steps=" in line:
                prom = scrape(url)  # after the timed steps, while the agent still serves
        rc = p.wait()
    finally:
        timer.cancel()
    wall = time.monotonic() - t0
    out = "".join(lines)
    m = STEP_LINE.search(out)
    if rc != 0 or not m:
        raise RunFailed("telemetry_overhead: %s failed (exit %d%s)\n%s"
                        % (" ".join(cmd), rc, ", timed out" if wall >= args.timeout else "", out[-4000:]))
    r = {"mean": float(m.group(4)), "median": float(m.group(5)), "steps": int(m.group(2)), "wall": wall,
         "p90": float(m.group(7)) if m.group(7) else None,
         "stall_lines": len(STALL.findall(out))}
    ev = EVENTS.search(out)
    if ev:
        r["events_received"], r["events_dropped"] = int(ev.group(1)), int(ev.group(2))
    if mode != "off":
        r["metrics_url"] = url
        r["prometheus"] = prom
    if mode == "on":
        r["perfetto"] = perfetto(log_dir)
    if mode == "on-otlp":
        time.sleep(0.2)  # the agent flushed before it exited; let the sink's handlers finish
        r["otlp"] = sink.take()
        r["perfetto"] = perfetto(log_dir)
    return r


def main():
    args = parse_args()
    if not os.path.exists(args.agent):
        sys.exit("telemetry_overhead: %s not found; run `make build`" % args.agent)
    modes = ("off", "on") if args.no_otlp else ("off", "on", "on-otlp")
    sink = None if args.no_otlp else Sink()
    results = {m: [] for m in modes}
    failures = []
    load0, t_start = os.getloadavg()[0], time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="telemetry-overhead-") as tmp:
            for rep in range(args.reps):
                k = rep % len(modes)
                for mode in modes[k:] + modes[:k]:  # rotate the order: each mode goes first in turn
                    r = run_retrying(args, mode, tmp, rep, sink, failures)
                    results[mode].append(r)
                    extra = ""
                    if "perfetto" in r and r["perfetto"]["files"]:
                        extra += "  perfetto %d B" % r["perfetto"]["bytes"]
                    if "otlp" in r:
                        extra += "  otlp %d spans %d B" % (r["otlp"]["traces"]["count"], r["otlp"]["traces"]["bytes"])
                    print("# rep %d %-7s median %8.2f ms  mean %8.2f ms  (%d steps, run %.1fs, %s events, "
                          "%d stall lines)%s" % (rep + 1, mode, r["median"], r["mean"], r["steps"], r["wall"],
                                                 r.get("events_received", "?"), r["stall_lines"], extra),
                          file=sys.stderr, flush=True)
    finally:
        if sink:
            sink.close()
    wall = time.monotonic() - t_start
    load1 = os.getloadavg()[0]

    def med(mode, key="median"):
        return statistics.median(r[key] for r in results[mode])

    def ratios(mode):
        return [a["median"] / b["median"] for a, b in zip(results[mode], results["off"])]

    summary = {}
    for mode in modes:
        meds = [r["median"] for r in results[mode]]
        s = {"median_ms": med(mode), "mean_ms": med(mode, "mean"), "run_medians_ms": meds,
             "run_median_min_ms": min(meds), "run_median_max_ms": max(meds),
             "cv_run_medians": (statistics.stdev(meds) if len(meds) > 1 else 0.0) / statistics.fmean(meds)}
        if mode != "off":
            rs = ratios(mode)
            s.update(ratio_of_medians=med(mode) / med("off"), ratio_per_rep=rs, ratio_per_rep_median=statistics.median(rs),
                     ratio_per_rep_min=min(rs), ratio_per_rep_max=max(rs))
        summary[mode] = s

    print()
    print("| mode | median step (ms) | run medians (ms) | mean step (ms) | on / off (median of runs) | on / off per rep: median (range) |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode in modes:
        s = summary[mode]
        ratio = "1" if mode == "off" else "%.3f" % s["ratio_of_medians"]
        per = "–" if mode == "off" else "%.3f (%.3f–%.3f)" % (s["ratio_per_rep_median"], s["ratio_per_rep_min"],
                                                             s["ratio_per_rep_max"])
        print("| %s | %.2f | %.1f–%.1f | %.2f | %s | %s |" % (NAMES[mode], s["median_ms"], s["run_median_min_ms"],
                                                              s["run_median_max_ms"], s["mean_ms"], ratio, per))
    print()

    # What the "on" modes exported: proof that they traced.
    proof = {}
    if "on" in results:
        pf = [r["perfetto"] for r in results["on"]]
        proof["perfetto"] = {"bytes_per_run": [p["bytes"] for p in pf], "slices_per_run": [p.get("slices") for p in pf],
                             "step_slices_per_run": [p.get("step_slices") for p in pf]}
    for mode in ("on", "on-otlp"):
        if mode in results:
            proof.setdefault("prometheus", {})[mode] = [r["prometheus"] for r in results[mode]]
    if "on-otlp" in results:
        ot = [r["otlp"] for r in results["on-otlp"]]
        names = {}
        for o in ot:
            for n, c in o["traces"]["names"].items():
                names[n] = names.get(n, 0) + c
        proof["otlp"] = {
            "spans_per_run": [o["traces"]["count"] for o in ot], "trace_bytes_per_run": [o["traces"]["bytes"] for o in ot],
            "trace_requests_per_run": [o["traces"]["requests"] for o in ot],
            "metric_bytes_per_run": [o["metrics"]["bytes"] for o in ot], "metrics_per_run": [o["metrics"]["count"] for o in ot],
            "span_kinds_total": names, "perfetto_files": sum(r["perfetto"]["files"] for r in results["on-otlp"])}
    events = {m: [r.get("events_received") for r in results[m]] for m in modes}
    stalls = {m: [r["stall_lines"] for r in results[m]] for m in modes}

    timed = args.steps - args.warmup_steps
    print("examples/train.py (~5.3M float32 parameters, ddp_agent comm hook, batch %d per rank), %d ranks under "
          "ddp-agent, %d steps a run, first %d left out (%d timed); %d runs per mode, order rotating; "
          "extra train.py args: %s." % (args.batch_size, args.nproc, args.steps, args.warmup_steps, timed, args.reps,
                                        " ".join(args.train_args) or "none"))
    print("off still runs the stall analysis: the agent has no switch for it (collective events the agent received "
          "per run: off %s, on %s; stall lines logged: off %s, on %s)."
          % (events["off"], events.get("on", "-"), stalls["off"], stalls.get("on", "-")))
    if "perfetto" in proof:
        p = proof["perfetto"]
        print("on: Perfetto file per run %s bytes, %s slices (%s of them `step N`); Prometheus scrape after the timed "
              "steps: %s." % (p["bytes_per_run"], p["slices_per_run"], p["step_slices_per_run"],
                              ", ".join(fmt_prom(x) for x in proof["prometheus"]["on"])))
    if "otlp" in proof:
        o = proof["otlp"]
        print("on-otlp: the sink got %s spans in %s requests (%s bytes) per run, span kinds over all runs %s; "
              "%s metrics (%s bytes) per run; Perfetto files written: %d; Prometheus: %s."
              % (o["spans_per_run"], o["trace_requests_per_run"], o["trace_bytes_per_run"],
                 json.dumps(o["span_kinds_total"], sort_keys=True), o["metrics_per_run"], o["metric_bytes_per_run"],
                 o["perfetto_files"], ", ".join(fmt_prom(x) for x in proof["prometheus"]["on-otlp"])))
    if failures:
        print("Runs that failed and were run again: %d (%s)."
              % (len(failures), "; ".join("rep %d %s: %s" % (f["rep"], f["mode"], f["error"]) for f in failures)))
    print("Load average %.2f at the start, %.2f at the end, %d CPUs; %.0f s in all (other work on the machine skews "
          "the figures)." % (load0, load1, os.cpu_count(), wall))
    noise = statistics.median(summary[m]["cv_run_medians"] for m in modes) * 100
    verdict = []
    for mode in modes[1:]:
        s = summary[mode]
        lo, hi = (s["ratio_per_rep_min"] - 1) * 100, (s["ratio_per_rep_max"] - 1) * 100
        noisy = ", but the run-to-run noise (CV %.1f%%) is above the goal: not conclusive" % noise
        if args.reps < 2:
            v = "one rep: no spread, not resolved"
        elif hi < args.goal:
            v = "under the goal in every rep" + (noisy if noise >= args.goal else "")
        elif lo > args.goal:
            v = "over the goal in every rep" + (noisy if noise >= args.goal else "")
        else:
            v = "not resolved: the reps straddle the goal"
        verdict.append("%s %+.1f%% (median of reps; reps %+.1f%% to %+.1f%%; medians of runs %+.1f%%): %s"
                       % (mode, (s["ratio_per_rep_median"] - 1) * 100, lo, hi, (s["ratio_of_medians"] - 1) * 100, v))
        s["verdict"] = v
    print("overhead on / off, goal < %g%%: %s. Run-to-run spread of a mode's run medians (CV, median over modes): "
          "%.1f%%." % (args.goal, "; ".join(verdict), noise), flush=True)

    result = {"bench": "telemetry_overhead", "nproc": args.nproc, "steps": args.steps, "warmup_steps": args.warmup_steps,
              "batch_size": args.batch_size, "reps": args.reps, "train_args": args.train_args, "modes": summary,
              "proof": proof, "events_received": events, "stall_lines": stalls, "load_average": [load0, load1],
              "cpus": os.cpu_count(), "wall_s": wall, "failed_runs_retried": failures, "goal_pct": args.goal, "noise_cv_pct": noise}
    line = json.dumps(result, sort_keys=True)
    print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")


def fmt_prom(x):
    if not x:
        return "not scraped"
    if "error" in x:
        return "error: " + x["error"]
    return "%d collectives (%d B)" % (x["ddp_collectives_total"], x["bytes"])


if __name__ == "__main__":
    main()
