package hostmon

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// What Slowdown calls contention, in percent. A rank's step is as slow as its
// slowest thread, so a small share of waiting already shows in the step time.
const (
	// runDelaySlow: the worker's threads waited for a CPU a tenth of the
	// wall time or more, summed over threads: this rank's own evidence,
	// whatever the rest of the node does. Below it, a few threads woken
	// together on a busy node wait that much without slowing a step.
	runDelaySlow = 10
	// stealSlow: the hypervisor ran something else for 5% of the node's CPU
	// time or more. The guest counts that time as its threads running, so
	// their run delay does not show it, and every rank on the node loses it.
	stealSlow = 5
	// cpuPressureSlow and runDelayUnderPressure: the node's runnable tasks
	// waited for a CPU 20% of the time or more, and this worker's threads
	// waited too. Pressure alone is not this rank's problem: every rank on
	// the node sees the same number, the slow one and the others.
	cpuPressureSlow       = 20
	runDelayUnderPressure = 5
)

// Slowdown says why the host would slow the worker of w down: "" when the
// host shows no contention that would, else one short clause with the
// numbers, e.g. "its threads waited for a CPU 23% of the time; the node's CPU
// pressure is 41%". others are the node's other workers: when there are
// some, only contention that stands out from theirs counts (its run delay
// runDelaySlow points above their median): a busy node slows every rank on
// it alike, and that does not make one of them the straggler.
func Slowdown(w WorkerSample, others []WorkerSample, n NodeSample) string {
	starved := w.RunDelayPercent >= runDelaySlow
	pressed := n.CPUPressureSome10 >= cpuPressureSlow && w.RunDelayPercent >= runDelayUnderPressure
	stolen := n.StealPercent >= stealSlow
	if len(others) > 0 {
		delays := make([]float64, len(others))
		for i, o := range others {
			delays[i] = o.RunDelayPercent
		}
		slices.Sort(delays)
		median := delays[len(delays)/2]
		if len(delays)%2 == 0 {
			median = (delays[len(delays)/2-1] + median) / 2
		}
		if w.RunDelayPercent-median < runDelaySlow {
			return ""
		}
		starved = true
	}
	if !starved && !pressed && !stolen {
		return ""
	}
	var clauses []string
	if w.RunDelayPercent >= runDelayUnderPressure {
		clause := fmt.Sprintf("its threads waited for a CPU %.0f%% of the time", w.RunDelayPercent)
		if len(others) > 0 {
			clause += fmt.Sprintf(" (the node's other ranks: %s)", delayList(others))
		}
		clauses = append(clauses, clause)
	}
	if n.CPUPressureSome10 >= cpuPressureSlow {
		clauses = append(clauses, fmt.Sprintf("the node's CPU pressure is %.0f%%", n.CPUPressureSome10))
	}
	if stolen {
		clauses = append(clauses, fmt.Sprintf("the hypervisor stole %.0f%% of the node's CPU time", n.StealPercent))
	}
	return strings.Join(clauses, "; ")
}

// delayList is "3%, 5%" for at most four workers, then "…".
func delayList(ws []WorkerSample) string {
	var parts []string
	for i, w := range ws {
		if i == 4 {
			parts = append(parts, "…")
			break
		}
		parts = append(parts, fmt.Sprintf("%.0f%%", w.RunDelayPercent))
	}
	return strings.Join(parts, ", ")
}

// Slowdown is Slowdown of rank's last sample against the node's other
// workers' and the last node sample; "" when rank has no sample.
func (m *Monitor) Slowdown(rank int) string {
	m.mu.Lock()
	w, ok := m.samples[rank]
	n := m.node
	var others []WorkerSample
	for r, o := range m.samples {
		if r != rank && o.RunDelayPercent >= 0 {
			others = append(others, o)
		}
	}
	m.mu.Unlock()
	if !ok {
		return ""
	}
	slices.SortFunc(others, func(a, b WorkerSample) int { return a.Rank - b.Rank })
	return Slowdown(w, others, n)
}

// sampleCPU reads the node's CPU pressure, and its steal time since the
// previous pass, into n.
func (m *Monitor) sampleCPU(n *NodeSample) {
	if b, err := os.ReadFile("/proc/pressure/cpu"); err == nil {
		n.CPUPressureSome10 = parsePressure(b)
	}
	// The cpu line comes first; reading only the start of the file skips the
	// per-CPU and interrupt lines, long on a big node.
	buf := make([]byte, 512)
	k, err := readFile("/proc/stat", buf)
	var t cpuTimes
	if err == nil {
		t, err = parseCPUTimes(buf[:k])
	}
	if err != nil {
		m.logger.Debug("sample node CPU times", "err", err)
		return
	}
	n.StealPercent = stealPercent(m.times, t)
	m.times = t
}

// cpuTimes is the node's CPU time from the cpu line of /proc/stat, in USER_HZ
// ticks.
type cpuTimes struct{ steal, total uint64 }

// parseCPUTimes parses the cpu line at the start of /proc/stat: "cpu user nice
// system idle iowait irq softirq steal guest guest_nice", see proc(5). Guest
// time is counted in user and nice already, so the total leaves it out.
func parseCPUTimes(b []byte) (cpuTimes, error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return cpuTimes{}, fmt.Errorf("parse /proc/stat cpu line %q: want cpu and 8 times", line)
	}
	var t cpuTimes
	for i, s := range f[1:9] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return cpuTimes{}, fmt.Errorf("parse /proc/stat cpu time %d: %w", i+1, err)
		}
		t.total += v
		if i == 7 {
			t.steal = v
		}
	}
	return t, nil
}

// stealPercent is the steal time between two readings as a percentage of all
// the CPU time in between; 0 without an earlier reading or when the counters
// went back (a CPU went offline and took its times along).
func stealPercent(before, now cpuTimes) float64 {
	if before.total == 0 || now.total <= before.total || now.steal < before.steal {
		return 0
	}
	return float64(now.steal-before.steal) / float64(now.total-before.total) * 100
}

// readDelays returns the run delay (ns) of every thread of pid from
// /proc/<pid>/task/<tid>/schedstat: /proc/<pid>/schedstat is the main thread's
// alone, and a worker's busy threads are seldom its main one. A thread that
// exits while being read is left out; the map is empty where the kernel keeps
// no schedstat. buf holds the directory listing and then each file.
func readDelays(pid int, buf []byte) (map[int]uint64, error) {
	// The files are opened relative to the open task directory, which
	// spares the kernel looking up /proc/<pid>/task again for each thread:
	// that lookup is most of the cost.
	dir, err := syscall.Open("/proc/"+strconv.Itoa(pid)+"/task", syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("list threads: %w", err)
	}
	defer syscall.Close(dir)
	var names []string
	for {
		n, err := syscall.ReadDirent(dir, buf)
		if err != nil {
			return nil, fmt.Errorf("list threads of %d: %w", pid, err)
		}
		if n <= 0 {
			break
		}
		_, _, names = syscall.ParseDirent(buf[:n], -1, names)
	}
	delays := make(map[int]uint64, len(names))
	for _, name := range names {
		tid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		n, err := readFileAt(dir, name+"/schedstat", buf)
		if err != nil {
			continue // exited since the listing, or no schedstat
		}
		d, err := parseSchedstat(buf[:n])
		if err != nil {
			return nil, fmt.Errorf("thread %d of %d: %w", tid, pid, err)
		}
		delays[tid] = d
	}
	return delays, nil
}

// readFileAt is readFile of path relative to the open directory dir.
func readFileAt(dir int, path string, buf []byte) (int, error) {
	fd, err := syscall.Openat(dir, path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer syscall.Close(fd)
	return syscall.Read(fd, buf)
}

// parseSchedstat returns the run delay of a schedstat line: "time on CPU (ns)
// time runnable waiting for a CPU (ns) timeslices", see the kernel's
// Documentation/scheduler/sched-stats.rst.
func parseSchedstat(b []byte) (uint64, error) {
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, fmt.Errorf("parse schedstat %q: too few fields", b)
	}
	d, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse schedstat run delay: %w", err)
	}
	return d, nil
}

// delaySince returns the run delay (ns) the threads of a process added since
// the previous pass, from this pass's and that pass's readings (before is nil
// for a process born since). A thread missing from before was born since, and
// one whose delay went down is a reused thread id: all their delay counts. No
// thread waits longer than the wall time in between (limit, ns), which bounds
// what a thread mistaken for new can add.
func delaySince(now, before map[int]uint64, limit uint64) uint64 {
	var sum uint64
	for tid, d := range now {
		if b, ok := before[tid]; ok && d >= b {
			d -= b
		}
		sum += min(d, limit)
	}
	return sum
}
