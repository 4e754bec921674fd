# Writes its pid to $E2E_OUT/pid_<RANK>, says "ready", sleeps argv[1]
# seconds (default 3) and exits 0; a restarted worker sleeps again.
import os, sys, time
rank = os.environ["RANK"]
tmp = os.path.join(os.environ["E2E_OUT"], "pid_" + rank + ".tmp")
with open(tmp, "w") as f:
    f.write(str(os.getpid()))
os.replace(tmp, os.path.join(os.environ["E2E_OUT"], "pid_" + rank))
print("ready restart_count=" + os.environ.get("TORCHELASTIC_RESTART_COUNT", "?"), flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 3)
