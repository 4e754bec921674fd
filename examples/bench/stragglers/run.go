package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/envname"
)

// result is what one run showed.
type result struct {
	s        scenario
	steps    []time.Time // rank 0's step ends, by step number - 1
	named    []naming    // persistent straggler lines, in order
	stalls   int         // stall lines
	duration time.Duration
}

// naming is one "persistent straggler" line: which rank, when, and the
// cause it gave.
type naming struct {
	rank  int
	at    time.Time
	cause string
}

var (
	stepLine  = regexp.MustCompile(`STEP (\d+) ([0-9.]+)`)
	timeField = regexp.MustCompile(`^time=(\S+) `)
	namedLine = regexp.MustCompile(`persistent straggler: rank (\d+) \([^)]*\) held the others back.*?; cause (\w+): `)
)

// runOne runs s under the agent and reads its output.
func runOne(ctx context.Context, agent, python, worker string, s scenario) (result, error) {
	if s.hog {
		hog := exec.CommandContext(ctx, "sh", "-c", "while :; do :; done")
		hog.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := hog.Start(); err != nil {
			return result{}, fmt.Errorf("CPU hog: %w", err)
		}
		defer func() { _ = syscall.Kill(-hog.Process.Pid, syscall.SIGKILL); _ = hog.Wait() }()
	}
	args := []string{"run", "--standalone", "--nproc-per-node", strconv.Itoa(s.world), "--numa-binding", "none", "--python", python, worker,
		"--steps", strconv.Itoa(s.steps), "--compute-ms", fmt.Sprint(s.computeMS)}
	if !s.balanced() {
		args = append(args, "--straggler-rank", strconv.Itoa(s.rank), "--extra-pct", fmt.Sprint(s.extraPct),
			"--kind", s.kind, "--every", strconv.Itoa(s.every))
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, agent, args...)
	if s.throttled {
		// The mock's GPUs go to the ranks in order: the straggler's is GPU rank.
		cmd.Env = append(os.Environ(), envname.MockThrottle+"="+strconv.Itoa(s.rank))
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return result{}, fmt.Errorf("%v: %w\n%s", cmd.Args, err, tail(out.String(), 3000))
	}
	r := parse(out.String(), s)
	r.duration = time.Since(start)
	if len(r.steps) != s.steps {
		return r, fmt.Errorf("rank 0 reported %d steps, want %d\n%s", len(r.steps), s.steps, tail(out.String(), 3000))
	}
	return r, nil
}

// parse reads the agent's log lines and rank 0's STEP lines.
func parse(out string, s scenario) result {
	r := result{s: s}
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := stepLine.FindStringSubmatch(line); m != nil {
			if f, err := strconv.ParseFloat(m[2], 64); err == nil {
				r.steps = append(r.steps, time.Unix(0, int64(f*1e9)))
			}
			continue
		}
		if strings.Contains(line, "msg=\"stall: ") {
			r.stalls++
		}
		if m := namedLine.FindStringSubmatch(line); m != nil {
			rank, _ := strconv.Atoi(m[1])
			var at time.Time
			if t := timeField.FindStringSubmatch(line); t != nil {
				at, _ = time.Parse(time.RFC3339Nano, t[1])
			}
			r.named = append(r.named, naming{rank: rank, at: at, cause: m[2]})
		}
	}
	return r
}

// falseAlarms counts the lines that accuse the wrong rank, or anyone in a
// balanced job (stall lines in a balanced job too).
func (r result) falseAlarms() int {
	n := 0
	for _, nm := range r.named {
		if nm.rank != r.s.rank {
			n++
		}
	}
	if r.s.balanced() {
		n += r.stalls
	}
	return n
}

// cause is the cause given when the injected straggler was first named;
// "" when it never was.
func (r result) cause() string {
	for _, nm := range r.named {
		if nm.rank == r.s.rank {
			return nm.cause
		}
	}
	return ""
}

// detected returns when the injected straggler was first named: the steps
// rank 0 had finished by then (counted from the first slow step) and the
// seconds since that step began; ok false when it never was.
func (r result) detected() (steps int, secs float64, ok bool) {
	if r.s.balanced() || len(r.steps) == 0 {
		return 0, 0, false
	}
	for _, nm := range r.named {
		if nm.rank != r.s.rank {
			continue
		}
		done := 0
		for _, t := range r.steps {
			if !t.After(nm.at) {
				done++
			}
		}
		first := r.s.every // the first slow step (steps count from 1)
		begin := r.steps[0]
		if first >= 2 {
			begin = r.steps[first-2]
		} else if len(r.steps) > 1 {
			begin = r.steps[0].Add(-r.steps[1].Sub(r.steps[0]))
		}
		return done - first + 1, nm.at.Sub(begin).Seconds(), true
	}
	return 0, 0, false
}

// stepTime is rank 0's median step time.
func (r result) stepTime() time.Duration {
	var ds []time.Duration
	for i := 1; i < len(r.steps); i++ {
		ds = append(ds, r.steps[i].Sub(r.steps[i-1]))
	}
	if len(ds) == 0 {
		return 0
	}
	return median(ds)
}

func (r result) summary() string {
	if steps, secs, ok := r.detected(); ok {
		return fmt.Sprintf("named rank %d after %d steps (%.1f s); %d false alarms", r.s.rank, steps, secs, r.falseAlarms())
	}
	if r.s.balanced() {
		return fmt.Sprintf("%d false alarms in %.0f s", r.falseAlarms(), r.duration.Seconds())
	}
	return fmt.Sprintf("not named; %d false alarms", r.falseAlarms())
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
