# Benchmark worker: the first thing it does is record that user code runs,
# then it idles until killed. It imports nothing heavy, so the figures are
# the launcher's own cost, not PyTorch's import time.
import os, time
t = time.time()
out = os.environ["BENCH_OUT"]
name = "start_%s_%s" % (os.environ["RANK"], os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
with open(os.path.join(out, name + ".tmp"), "w") as f:
    f.write("%.6f %d" % (t, os.getpid()))
os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))
while True:
    time.sleep(1)
