# Rank 1 fails on the first attempt (exit code 7, after some stderr), every
# other rank and attempt succeeds.
import os, sys, time
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print("rank %d attempt %d running" % (rank, attempt), flush=True)
if rank == 1 and attempt == 0:
    for i in range(5):
        print("flaky: warming up %d" % i, file=sys.stderr, flush=True)
    print("flaky: giving up on attempt 0", file=sys.stderr, flush=True)
    sys.exit(7)
time.sleep(0.2)
print("rank %d attempt %d done" % (rank, attempt), flush=True)
