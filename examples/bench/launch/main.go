// Command launch measures ddp-agent against torchrun, side by side in one
// run on one machine: time from launch to every worker running user code,
// time from a worker's SIGKILL to every replacement running user code
// (restart latency), and the launcher's own RSS and CPU while it supervises
// idle workers. It prints a Markdown table with the ratios.
//
//	go run ./examples/bench/launch -agent bin/ddp-agent -python /usr/bin/python3 \
//	    -torchrun-compat scripts/torchrun_compat.py
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type launcher struct {
	name string
	argv func(script string, nproc int) []string
}

type result struct {
	startup, restart time.Duration
	rssKiB           int
	cpuPercent       float64
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
	launchers := []launcher{
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

// measure runs one launcher: launch, wait for user code, sample the idle
// launcher, SIGKILL one worker, wait for the replacements, then stop it.
func measure(ctx context.Context, l launcher, script string, nproc int, window time.Duration) (result, error) {
	var r result
	out, err := os.MkdirTemp("", "ddp-agent-bench-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(out)
	argv := l.argv(script, nproc)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "BENCH_OUT="+out)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	logf, err := os.Create(filepath.Join(out, "launcher.log"))
	if err != nil {
		return r, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return r, err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(40 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}()

	starts, err := waitStarts(ctx, out, nproc, 0, 60*time.Second)
	if err != nil {
		return r, fmt.Errorf("first start: %w (log: %s)", err, logTail(out))
	}
	r.startup = latest(starts).Sub(t0)

	time.Sleep(2 * time.Second) // let start-up work settle before sampling the idle launcher
	c0, err := cpuTicks(cmd.Process.Pid)
	if err != nil {
		return r, err
	}
	time.Sleep(window)
	c1, err := cpuTicks(cmd.Process.Pid)
	if err != nil {
		return r, err
	}
	r.cpuPercent = float64(c1-c0) / 100 / window.Seconds() * 100
	if r.rssKiB, err = rssKiB(cmd.Process.Pid); err != nil {
		return r, err
	}

	victim := starts[nproc-1].pid
	t1 := time.Now()
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		return r, fmt.Errorf("kill worker %d: %w", victim, err)
	}
	restarts, err := waitStarts(ctx, out, nproc, 1, 60*time.Second)
	if err != nil {
		return r, fmt.Errorf("restart: %w (log: %s)", err, logTail(out))
	}
	r.restart = latest(restarts).Sub(t1)
	return r, nil
}

type start struct {
	at  time.Time
	pid int
}

// waitStarts waits for every rank's start file of one restart count.
func waitStarts(ctx context.Context, dir string, nproc, restart int, timeout time.Duration) ([]start, error) {
	deadline := time.Now().Add(timeout)
	for {
		var starts []start
		for rank := 0; rank < nproc; rank++ {
			b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("start_%d_%d", rank, restart)))
			if err != nil {
				break
			}
			var sec float64
			var pid int
			if _, err := fmt.Sscanf(string(b), "%f %d", &sec, &pid); err != nil {
				return nil, fmt.Errorf("start file of rank %d: %w", rank, err)
			}
			starts = append(starts, start{time.Unix(0, int64(sec*1e9)), pid})
		}
		if len(starts) == nproc {
			return starts, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d workers started within %v", len(starts), nproc, timeout)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

func latest(s []start) time.Time {
	t := s[0].at
	for _, x := range s[1:] {
		if x.at.After(t) {
			t = x.at
		}
	}
	return t
}

func cpuTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	u, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	return u + st, nil
}

func rssKiB(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	return 0, errors.New("no VmRSS")
}

func logTail(dir string) string {
	b, _ := os.ReadFile(filepath.Join(dir, "launcher.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

func median[T int | float64 | time.Duration](xs []T) T {
	s := append([]T(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func report(launchers []launcher, res map[string][]result, runs, nproc int) {
	get := func(name string) (su, rs time.Duration, rss int, cpu float64) {
		var a, b []time.Duration
		var c []int
		var d []float64
		for _, r := range res[name] {
			a, b, c, d = append(a, r.startup), append(b, r.restart), append(c, r.rssKiB), append(d, r.cpuPercent)
		}
		return median(a), median(b), median(c), median(d)
	}
	fmt.Printf("\nMedians of %d runs, %d idle workers, launchers interleaved; ratio = ddp-agent / that launcher.\n\n", runs, nproc)
	fmt.Println("| launcher | start-up | restart latency | launcher RSS | launcher CPU (idle) |")
	fmt.Println("|---|---|---|---|---|")
	aSU, aRS, aRSS, _ := get(launchers[0].name)
	for _, l := range launchers {
		su, rs, rss, cpu := get(l.name)
		if l.name == launchers[0].name {
			fmt.Printf("| %s | %v | %v | %.1f MiB | %.2f %% |\n", l.name, su.Round(time.Millisecond), rs.Round(time.Millisecond), float64(rss)/1024, cpu)
			continue
		}
		fmt.Printf("| %s | %v (ratio %.3f) | %v (ratio %.3f) | %.1f MiB (ratio %.2f) | %.2f %% |\n", l.name,
			su.Round(time.Millisecond), float64(aSU)/float64(su), rs.Round(time.Millisecond), float64(aRS)/float64(rs),
			float64(rss)/1024, float64(aRSS)/float64(rss), cpu)
	}
}
