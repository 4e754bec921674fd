package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// result is one run of one launcher.
type result struct {
	startup, restart time.Duration
	rssKiB           int
	cpuPercent       float64
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
	logf, err := os.Create(filepath.Join(out, "launcher.log"))
	if err != nil {
		return r, err
	}
	defer logf.Close()
	argv := l.argv(script, nproc)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "BENCH_OUT="+out)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stdout, cmd.Stderr = logf, logf
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return r, err
	}
	defer stopLauncher(cmd)

	starts, err := waitStarts(ctx, out, nproc, 0, 60*time.Second)
	if err != nil {
		return r, fmt.Errorf("first start: %w (log: %s)", err, logTail(out))
	}
	r.startup = latest(starts).Sub(t0)

	time.Sleep(2 * time.Second) // let start-up work settle before sampling the idle launcher
	if r.cpuPercent, r.rssKiB, err = sampleIdle(cmd.Process.Pid, window); err != nil {
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

// stopLauncher sends the launcher SIGTERM and waits for it; after 40 s its
// whole process group gets SIGKILL.
func stopLauncher(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(40 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// sampleIdle returns the CPU the launcher used over window, in percent of
// one core, and its RSS at the end.
func sampleIdle(pid int, window time.Duration) (cpuPercent float64, rss int, err error) {
	c0, err := cpuTicks(pid)
	if err != nil {
		return 0, 0, err
	}
	time.Sleep(window)
	c1, err := cpuTicks(pid)
	if err != nil {
		return 0, 0, err
	}
	cpuPercent = float64(c1-c0) / 100 / window.Seconds() * 100
	rss, err = rssKiB(pid)
	return cpuPercent, rss, err
}

// start is one worker start, read from the file worker.py writes.
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

// latest is the last of the starts: when every worker ran user code.
func latest(s []start) time.Time {
	t := s[0].at
	for _, x := range s[1:] {
		if x.at.After(t) {
			t = x.at
		}
	}
	return t
}

// logTail is the end of the launcher's log, for an error message.
func logTail(dir string) string {
	b, _ := os.ReadFile(filepath.Join(dir, "launcher.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}
