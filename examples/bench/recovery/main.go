// Command recovery measures how long an elastic DDP job takes to recover
// after a node is lost, ddp-agent against torchrun's c10d rendezvous, side by
// side in one run on one machine: every "node" is a separate launcher process
// on loopback.
//
// For each launcher and run it starts -nodes launchers (--nnodes 2:<nodes>,
// --max-restarts 3, c10d rendezvous at 127.0.0.1:<free port>) of a real gloo
// job (worker.py: all_reduce every 50 ms), waits until the full world has
// formed, SIGKILLs one launcher that does not host the rendezvous store, or
// with -kill host the one that does (and its workers: a dead node takes
// them with it), and measures the time
// from the kill until every surviving worker slot runs user code again in
// a world of the survivors. It prints Markdown tables: recovery (median, min,
// max), start-up, the ratio ddp-agent/torchrun, and where the time goes.
//
//	go run ./examples/bench/recovery -agent bin/ddp-agent -python /usr/bin/python3 \
//	    -torchrun-compat scripts/torchrun_compat.py -nodes 3 -nproc 1 -runs 3
//	go run ./examples/bench/recovery ... -kill host -timeout 60s
//
// With three nodes ddp-agent's store has three members, so killing its
// first host is one lost node like any other; torchrun's c10d store lives
// in the host's agent, and the job dies with it (a "> timeout" row).
//
// Where the time goes comes from three sources: worker.py's own lines
// (collective failed, replacement started, world re-formed), the launchers'
// logs, stamped line by line as they arrive (torchrun runs with LOGLEVEL=INFO
// for that; ddp-agent's messages are matched best effort), and for torchrun
// rdzv_probe.py, a read-only client of the c10d store that records when the
// dead node was dropped, when the last call began and when the round closed.
//
// Each run's launcher logs, workers.jsonl and rdzv.jsonl are in a temporary
// directory, removed after a good run and kept (and named) otherwise, or
// always with -keep. Everything started runs in process groups of its own
// and carries RECOVERY_BENCH_TAG in its environment: teardown, Ctrl-C (twice:
// at once) and exit signal and sweep them; if this program is SIGKILLed, the
// launchers get SIGKILL through their parent-death signal and the workers
// and the probe notice their parent is gone.
//
// It exits non-zero when a run could not be measured at all (most often: the
// initial world never formed); a recovery that times out is reported as
// "> timeout" in the table instead.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := parseFlags()
	reap := newReaper()

	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "\nrecovery: %v: stopping, tearing every launcher down (again to kill at once)\n", s)
		cancel()
		<-sigs
		fmt.Fprintln(os.Stderr, "recovery: second signal: SIGKILL to everything we started")
		reap.killEverything()
		os.Exit(130)
	}()

	code := run(ctx, c, reap)
	reap.killEverything() // a no-op unless something escaped a teardown
	if ctx.Err() != nil && code == 0 {
		code = 130
	}
	os.Exit(code)
}

// run measures every launcher kind -runs times, interleaved, prints the
// report and returns the exit code: 2 for bad flags, 130 when interrupted,
// 1 when a run could not be measured.
func run(ctx context.Context, c config, reap *reaper) int {
	if err := check(&c); err != nil {
		fmt.Fprintln(os.Stderr, "recovery:", err)
		return 2
	}
	kinds := launcherKinds(c)
	results := map[string][]result{}
	broken := map[string]error{}
	// Interleave the launchers run by run, so drift in machine load hits both alike.
	for i := 0; i < c.runs && ctx.Err() == nil; i++ {
		for _, k := range kinds {
			if broken[k.name] != nil || ctx.Err() != nil {
				continue
			}
			r, err := measure(ctx, c, reap, k, i)
			if err != nil {
				if ctx.Err() != nil {
					fmt.Fprintf(os.Stderr, "%-9s run %d: interrupted (%v)\n", k.name, i, err)
					break
				}
				fmt.Fprintf(os.Stderr, "%-9s run %d: FAILED: %v\n", k.name, i, err)
				broken[k.name] = err
				continue
			}
			fmt.Fprintf(os.Stderr, "%-9s run %d: %s\n", k.name, i, r.describe())
			results[k.name] = append(results[k.name], r)
		}
	}
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "recovery: interrupted")
		return 130
	}
	report(os.Stdout, c, kinds, results, broken)
	if len(broken) > 0 {
		return 1
	}
	return 0
}
