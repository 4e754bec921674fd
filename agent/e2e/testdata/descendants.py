# Starts the descendants a training script's worker has, each of a kind
# that PR_SET_PDEATHSIG and a process-group kill miss when the agent is
# SIGKILLed: a subprocess, a shell and its child, a daemon in a session of
# its own (setsid, double fork), a multiprocessing pool. Writes their pids
# to $E2E_OUT/descendants_<RANK>, says "spawned", and sleeps.
import multiprocessing
import os
import subprocess
import time


def main():
    out = os.environ["E2E_OUT"]
    pids = []
    pids.append(subprocess.Popen(["sleep", "300"]).pid)
    sh = subprocess.Popen(["sh", "-c", "sleep 300 & echo $!; wait"], stdout=subprocess.PIPE)
    pids += [sh.pid, int(sh.stdout.readline())]
    daemon = subprocess.Popen(["setsid", "sh", "-c", "sleep 300 </dev/null >/dev/null 2>&1 & echo $!"], stdout=subprocess.PIPE)
    pids.append(int(daemon.stdout.readline()))
    daemon.wait()
    pool = multiprocessing.get_context("fork").Pool(2)
    pids += [p.pid for p in pool._pool]
    tmp = os.path.join(out, "descendants.tmp")
    with open(tmp, "w") as f:
        f.write(" ".join(str(p) for p in pids))
    os.replace(tmp, os.path.join(out, "descendants_" + os.environ["RANK"]))
    print("spawned", flush=True)
    time.sleep(300)


if __name__ == "__main__":
    main()
