# Writes its pid to $E2E_OUT/pid_<RANK>, says "ready", then sleeps. With
# --ignore-term it ignores SIGTERM; with --spam it prints lines without pause.
# On SIGINT (KeyboardInterrupt) it prints "interrupted" and exits 0.
import os, signal, sys, time
if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
rank = os.environ["RANK"]
with open(os.path.join(os.environ["E2E_OUT"], "pid_" + rank + ".tmp"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(os.environ["E2E_OUT"], "pid_" + rank + ".tmp"), os.path.join(os.environ["E2E_OUT"], "pid_" + rank))
print("ready", flush=True)
if "--spam" in sys.argv:
    line = "spam " + "z" * 200 + "\n"
    while True:
        sys.stdout.write(line)
try:
    while True:
        time.sleep(1)
except KeyboardInterrupt:  # the agent forwards Ctrl-C as SIGINT, like a terminal under torchrun
    print("interrupted", flush=True)
