# Writes where this worker runs to $E2E_OUT/place_<RANK>.json: its
# environment, the CPUs it may run on and its memory policy as the kernel
# shows them. With --hold it then waits (up to 30 s) for $E2E_OUT/release.
import json, os, sys, time

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
    return ""

def mempolicy():
    # numa_maps shows the task's policy on mappings without one of their own.
    with open("/proc/self/numa_maps") as f:
        for line in f:
            if "heap" in line or "anon=" in line:
                return line.split()[1]
    return ""

out = os.environ["E2E_OUT"]
with open(os.path.join(out, "place_%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({"env": dict(os.environ), "cpus": status("Cpus_allowed_list"), "mempolicy": mempolicy()}, f)
if "--hold" in sys.argv:
    deadline = time.time() + 30
    while not os.path.exists(os.path.join(out, "release")) and time.time() < deadline:
        time.sleep(0.05)
