# examples/bench/plugins' worker: the first attempt sleeps argv[1] seconds,
# writes the time (ns) to $BENCH_OUT/exit_ns and exits 1; the second
# writes the time it started to $BENCH_OUT/start_ns, sleeps argv[2]
# seconds (default 0) and exits 0.
import os, sys, time
out = os.environ["BENCH_OUT"]
if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
    time.sleep(float(sys.argv[1]))
    with open(os.path.join(out, "exit_ns"), "w") as f:
        f.write(str(time.time_ns()))
    os._exit(1)
with open(os.path.join(out, "start_ns"), "w") as f:
    f.write(str(time.time_ns()))
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)
