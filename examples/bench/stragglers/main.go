// Command stragglers measures how well ddp-agent's persistent straggler
// and stall detection (issue 16) tells a culprit from noise: real
// ddp-agent runs of a DDP job (worker.py, gloo on the CPU, the comm hook)
// with a controlled step time, balanced or with one injected straggler,
// with and without a CPU hog competing for the cores. It prints a Markdown
// table: per scenario what the agent named and when, then false alarms per
// hour of balanced training, the detection rate at +10 % and more, the
// steps and seconds to detection, and how often the cause named was the
// one injected (compute, input, or gpu on a throttled GPU of the NVML
// mock).
//
//	go run ./examples/bench/stragglers -agent bin/ddp-agent -python /usr/bin/python3
//
// Run it from the repository root.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// scenario is one run: the job's shape and what is injected.
type scenario struct {
	name      string
	world     int
	steps     int
	computeMS float64
	hog       bool
	// The straggler; rank < 0 for a balanced job.
	rank     int
	extraPct float64
	kind     string // compute, input
	every    int
	// throttled: the straggler's GPU shows "hw slowdown" on the NVML mock
	// (the agent built with -tags nvmlmock), so its cause is gpu.
	throttled bool
}

// wantCause is the cause the agent should name.
func (s scenario) wantCause() string {
	if s.throttled {
		return "gpu"
	}
	return s.kind
}

func (s scenario) balanced() bool { return s.rank < 0 }

func scenarios() []scenario {
	var out []scenario
	for _, w := range []int{2, 3, 4} {
		for _, long := range []bool{false, true} {
			for _, hog := range []bool{false, true} {
				s := scenario{world: w, steps: 150, computeMS: 50, hog: hog, rank: -1}
				if long {
					s.steps, s.computeMS = 50, 300
				}
				s.name = fmt.Sprintf("balanced, %d ranks, %.0f ms steps", w, s.computeMS+5)
				if hog {
					s.name += ", CPU hog"
				}
				out = append(out, s)
			}
		}
	}
	for _, w := range []int{2, 4} {
		for _, f := range []struct {
			pct   float64
			kind  string
			every int
		}{{5, "compute", 1}, {10, "compute", 1}, {30, "compute", 1}, {100, "compute", 1}, {100, "compute", 3}, {10, "input", 1}, {30, "input", 1}} {
			s := scenario{world: w, steps: 100, computeMS: 100, rank: w - 1, extraPct: f.pct, kind: f.kind, every: f.every}
			s.name = fmt.Sprintf("%s +%.0f%%, %d ranks", f.kind, f.pct, w)
			if f.every > 1 {
				s.name = fmt.Sprintf("%s +%.0f%% every %d steps, %d ranks", f.kind, f.pct, f.every, w)
			}
			out = append(out, s)
		}
		s := scenario{world: w, steps: 100, computeMS: 100, rank: w - 1, extraPct: 30, kind: "compute", every: 1, throttled: true}
		s.name = fmt.Sprintf("compute +30%% on a throttled GPU (NVML mock), %d ranks", w)
		out = append(out, s)
	}
	return out
}

func main() {
	agent := flag.String("agent", "bin/ddp-agent", "ddp-agent binary")
	mockAgent := flag.String("mock-agent", "", "ddp-agent built with -tags nvmlmock, for the throttled-GPU scenarios (skipped without)")
	python := flag.String("python", "/usr/bin/python3", "Python with PyTorch")
	only := flag.String("only", "", "run only the scenarios whose name contains this")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	worker, err := filepath.Abs("examples/bench/stragglers/worker.py")
	if err == nil {
		_, err = os.Stat(worker)
	}
	if err == nil {
		_, err = os.Stat(*agent)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "stragglers: run from the repository root after make build:", err)
		os.Exit(2)
	}
	var results []result
	for _, s := range scenarios() {
		if *only != "" && !strings.Contains(s.name, *only) {
			continue
		}
		bin := *agent
		if s.throttled {
			if *mockAgent == "" {
				fmt.Fprintf(os.Stderr, "stragglers: %s: skipped, no -mock-agent\n", s.name)
				continue
			}
			bin = *mockAgent
		}
		r, err := runOne(ctx, bin, *python, worker, s)
		if err != nil {
			fmt.Fprintf(os.Stderr, "stragglers: %s: %v\n", s.name, err)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "%s: %s\n", s.name, r.summary())
		results = append(results, r)
	}
	report(os.Stdout, results, time.Now())
}
