// Command launch measures ddp-agent against torchrun, side by side in one
// run on one machine: time from launch to every worker running user code,
// time from a worker's SIGKILL to every replacement running user code
// (restart latency), and the launcher's own RSS and CPU while it supervises
// idle workers. It prints a Markdown table with the ratios.
//
//	go run ./examples/bench/launch -agent bin/ddp-agent -python /usr/bin/python3 \
//	    -torchrun-compat scripts/torchrun_compat.py
//
// Run it from the repository root: the default paths (-agent,
// -torchrun-compat, the worker script) are relative to it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// launcher is one way to start the workers: its name in the table, and the
// command line that runs script with nproc workers.
type launcher struct {
	name string
	argv func(script string, nproc int) []string
}

func main() {
	agent := flag.String("agent", "bin/ddp-agent", "ddp-agent binary")
	python := flag.String("python", "/usr/bin/python3", "Python with PyTorch")
	compat := flag.String("torchrun-compat", "scripts/torchrun_compat.py", "torchrun wrapper that works on Python 3.11")
	runs := flag.Int("runs", 5, "runs per launcher (medians are reported)")
	nproc := flag.Int("nproc", 2, "workers per launcher")
	window := flag.Duration("window", 5*time.Second, "how long to sample the idle launcher's CPU")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *agent, *python, *compat, *runs, *nproc, *window); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// run measures every launcher -runs times, interleaved, and prints the
// table; it stops at the first run that cannot be measured.
func run(ctx context.Context, agent, python, compat string, runs, nproc int, window time.Duration) error {
	script, err := filepath.Abs("examples/bench/worker.py")
	if err != nil {
		return err
	}
	for _, p := range []string{agent, compat, script} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("need %s: %w", p, err)
		}
	}
	launchers := defaultLaunchers(agent, python, compat)
	results := map[string][]result{}
	// Interleave the launchers run by run, so drift in machine load hits all alike.
	for i := 0; i < runs; i++ {
		for _, l := range launchers {
			r, err := measure(ctx, l, script, nproc, window)
			if err != nil {
				return fmt.Errorf("%s run %d: %w", l.name, i, err)
			}
			fmt.Fprintf(os.Stderr, "%-32s run %d: startup %v, restart %v, rss %d KiB, cpu %.2f%%\n",
				l.name, i, r.startup.Round(time.Millisecond), r.restart.Round(time.Millisecond), r.rssKiB, r.cpuPercent)
			results[l.name] = append(results[l.name], r)
		}
	}
	report(launchers, results, runs, nproc)
	return nil
}

// defaultLaunchers are ddp-agent, then torchrun as it comes and with
// --monitor_interval 0.1. The first is the one the ratios are taken against.
func defaultLaunchers(agent, python, compat string) []launcher {
	return []launcher{
		{"ddp-agent", func(s string, n int) []string {
			return []string{agent, "run", "--standalone", "--nproc-per-node", strconv.Itoa(n), "--max-restarts", "3", "--python", python, s}
		}},
		{"torchrun", func(s string, n int) []string {
			return []string{python, compat, "--standalone", "--nproc_per_node", strconv.Itoa(n), "--max_restarts", "3", s}
		}},
		{"torchrun --monitor_interval 0.1", func(s string, n int) []string {
			return []string{python, compat, "--standalone", "--nproc_per_node", strconv.Itoa(n), "--max_restarts", "3", "--monitor_interval", "0.1", s}
		}},
	}
}
