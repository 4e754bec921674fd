# Says "ready", then waits for a signal and says which one came (SIGUSR1
# or SIGTERM), and exits 0.
import signal, sys, time

def got(sig, _frame):
    print("got " + signal.Signals(sig).name, flush=True)
    sys.exit(0)

signal.signal(signal.SIGUSR1, got)
signal.signal(signal.SIGTERM, got)
print("ready", flush=True)
time.sleep(60)
