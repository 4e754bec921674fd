// Package hostmon samples the node and the process trees of the workers so
// that, when a worker dies, the agent can say what it looked like just before:
// its memory, CPU, state and number of processes, and how much memory the
// node had left.
//
// It also keeps the evidence that a slow rank is slow because of its host
// (Slowdown): how long the threads of the worker's tree waited runnable for a
// CPU (their run delay, from the scheduler's schedstat), the node's CPU
// pressure (PSI) and the CPU time the hypervisor stole from the node.
package hostmon

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shirou/gopsutil/v3/load"
	"github.com/shirou/gopsutil/v3/mem"
)

// clockTicks is USER_HZ, the unit of the CPU times in /proc/<pid>/stat; the
// kernel reports it as 100 to userspace on every Linux architecture in use.
const clockTicks = 100

// WorkerSample is one reading of a worker process tree: the worker and its
// descendants, e.g. DataLoader workers.
type WorkerSample struct {
	Rank, PID  int
	RSSBytes   uint64  // resident memory of the whole tree
	CPUPercent float64 // tree CPU since the previous sample, 100 = one core; 0 on the first sample
	// RunDelayPercent is how long the threads of the tree waited runnable for
	// a CPU since the previous sample, summed over the threads, as a share of
	// the wall time: 100 = one thread waited the whole interval. 0 on the
	// first sample, and where the kernel keeps no schedstat.
	RunDelayPercent float64
	NumProcs        int    // processes in the tree, the worker included
	State           string // of the worker itself: "running", "sleeping", "disk-sleep", ...
	Threads         int32  // of the worker itself
	At              time.Time
}

// NodeSample is one reading of the node's memory, CPU contention and load.
type NodeSample struct {
	MemTotal, MemAvailable, SwapUsed uint64
	MemPressureSome10                float64 // "some avg10" of /proc/pressure/memory, -1 when unavailable
	CPUPressureSome10                float64 // "some avg10" of /proc/pressure/cpu, -1 when unavailable
	StealPercent                     float64 // CPU time stolen by the hypervisor since the previous pass, % of all; 0 on the first pass
	Load1                            float64
	At                               time.Time
}

// Option configures a Monitor.
type Option func(*Monitor)

// WithInterval sets how often Run samples (default 2s); d <= 0 keeps the default.
func WithInterval(d time.Duration) Option {
	return func(m *Monitor) {
		if d > 0 {
			m.interval = d
		}
	}
}

// Monitor samples the watched workers and the node. All its methods are safe
// for concurrent use.
type Monitor struct {
	logger   *slog.Logger
	interval time.Duration
	pageSize uint64

	passMu sync.Mutex       // serializes sampling passes
	tree   map[int]treeProc // tree processes of the previous pass, for CPU and run delay deltas; guarded by passMu
	times  cpuTimes         // the node's CPU times at the previous pass, for steal; guarded by passMu

	mu      sync.Mutex
	workers map[int]int          // rank → pid
	samples map[int]WorkerSample // rank → last sample
	node    NodeSample
}

// procStat is the part of /proc/<pid>/stat the monitor uses.
type procStat struct {
	pid, ppid    int
	state        byte
	ticks, start uint64 // utime+stime, starttime (tells a reused pid apart)
	threads      int32
	rssPages     uint64
	// exiting: the kernel is tearing the process down (PF_EXITING). Its
	// state may still read "running", with its memory already gone.
	exiting bool
}

// pfExiting is the flag of a process in exit(), in /proc/<pid>/stat's
// flags field (linux/sched.h).
const pfExiting = 0x4

// treeProc is what a pass keeps of one process of a worker's tree, for the
// next pass's deltas.
type treeProc struct {
	stat   procStat
	delays map[int]uint64 // thread id → run delay (ns); nil when its threads could not be read
}

// pass is what one sampling pass reads once and shares between the workers.
type pass struct {
	procs    map[int]procStat // every process on the node
	children map[int][]int    // pid → child pids
	tree     map[int]treeProc // the workers' tree processes seen so far in this pass
	buf      []byte           // for listing threads and reading their schedstat files
}

// NewMonitor returns a Monitor watching no workers yet.
func NewMonitor(logger *slog.Logger, opts ...Option) *Monitor {
	m := &Monitor{
		logger:   logger,
		interval: 2 * time.Second,
		pageSize: uint64(os.Getpagesize()),
		workers:  map[int]int{},
		samples:  map[int]WorkerSample{},
		node:     NodeSample{MemPressureSome10: -1, CPUPressureSome10: -1},
	}
	for _, o := range opts {
		o(m)
	}
	return m
}

// SetWorkers replaces the watched workers (rank → pid). Samples of ranks that
// are no longer watched under the same pid are dropped.
func (m *Monitor) SetWorkers(pids map[int]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.workers = maps.Clone(pids)
	for rank, s := range m.samples {
		if pid, ok := pids[rank]; !ok || pid != s.PID {
			delete(m.samples, rank)
		}
	}
}

// Worker returns the last sample of rank. It is kept after the worker exits,
// until SetWorkers stops watching that rank and pid.
func (m *Monitor) Worker(rank int) (WorkerSample, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.samples[rank]
	return s, ok
}

// Node returns the last node sample.
func (m *Monitor) Node() NodeSample {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.node
}

// Run samples at once and then every interval until ctx is done, then returns
// nil. It blocks for that long.
func (m *Monitor) Run(ctx context.Context) error {
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		m.Sample()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Sample makes one sampling pass now. It blocks while it reads the stat file
// of every process on the node (about 10-20 µs each) and the schedstat file of
// every thread of the workers' trees, and waits for a pass already running.
func (m *Monitor) Sample() {
	m.passMu.Lock()
	defer m.passMu.Unlock()
	now := time.Now()
	node := m.sampleNode(now)

	m.mu.Lock()
	m.node = node
	workers, prev := maps.Clone(m.workers), maps.Clone(m.samples)
	m.mu.Unlock()
	if len(workers) == 0 {
		m.tree = nil
		return
	}

	procs, err := m.readProcs()
	if err != nil {
		m.logger.Warn("sample worker processes", "err", err)
		return
	}
	p := &pass{procs: procs, children: map[int][]int{}, tree: map[int]treeProc{}, buf: make([]byte, 4096)}
	for _, st := range procs {
		p.children[st.ppid] = append(p.children[st.ppid], st.pid)
	}
	fresh := map[int]WorkerSample{}
	for rank, pid := range workers {
		w, ok := procs[pid]
		if !ok || w.state == 'Z' || w.exiting { // an exiting one reads "running" with rss 0 B
			m.logger.Debug("worker process gone, keeping its last sample", "rank", rank, "pid", pid)
			continue
		}
		last, seen := prev[rank]
		seen = seen && last.PID == pid
		s := WorkerSample{Rank: rank, PID: pid, State: stateName(w.state), Threads: w.threads, At: now}
		elapsed := now.Sub(last.At)
		ticks, delay := m.walkTree(&s, p, seen, elapsed)
		if seen && elapsed > 0 {
			s.CPUPercent = float64(ticks) / clockTicks / elapsed.Seconds() * 100
			s.RunDelayPercent = float64(delay) / float64(elapsed.Nanoseconds()) * 100
		}
		fresh[rank] = s
	}
	m.tree = p.tree

	m.mu.Lock()
	defer m.mu.Unlock()
	for rank, s := range fresh {
		if pid, ok := m.workers[rank]; ok && pid == s.PID {
			m.samples[rank] = s
		}
	}
}

// walkTree adds the process tree of s.PID to s and to p.tree, and returns its
// CPU ticks and its threads' run delay (ns) since the previous pass, elapsed
// ago. seen says whether that pass sampled this worker: a process it did not
// see in the tree was born since, so all its time counts.
func (m *Monitor) walkTree(s *WorkerSample, p *pass, seen bool, elapsed time.Duration) (ticks, delay uint64) {
	for stack := []int{s.PID}; len(stack) > 0; {
		st, ok := p.procs[stack[len(stack)-1]]
		stack = stack[:len(stack)-1]
		if _, done := p.tree[st.pid]; !ok || done {
			continue
		}
		s.NumProcs++
		s.RSSBytes += st.rssPages * m.pageSize
		b, known := m.tree[st.pid]
		known = known && b.stat.start == st.start // not a reused pid
		if known && st.ticks >= b.stat.ticks {
			ticks += st.ticks - b.stat.ticks
		} else if seen { // born since the previous pass
			ticks += st.ticks
		}
		delays, err := readDelays(st.pid, p.buf)
		if err != nil { // most likely exited since the listing
			m.logger.Debug("read thread run delays", "pid", st.pid, "err", err)
		}
		switch {
		case known && b.delays != nil:
			delay += delaySince(delays, b.delays, uint64(max(elapsed, 0)))
		case !known && seen: // born since the previous pass; a known process without a baseline adds nothing
			delay += delaySince(delays, nil, uint64(max(elapsed, 0)))
		}
		p.tree[st.pid] = treeProc{stat: st, delays: delays}
		stack = append(stack, p.children[st.pid]...)
	}
	return ticks, delay
}

// sampleNode reads the node's memory, memory pressure, CPU contention and load.
func (m *Monitor) sampleNode(now time.Time) NodeSample {
	n := NodeSample{MemPressureSome10: -1, CPUPressureSome10: -1, At: now}
	if vm, err := mem.VirtualMemory(); err != nil {
		m.logger.Debug("sample node memory", "err", err)
	} else {
		n.MemTotal, n.MemAvailable = vm.Total, vm.Available
		if vm.SwapTotal > vm.SwapFree {
			n.SwapUsed = vm.SwapTotal - vm.SwapFree
		}
	}
	if avg, err := load.Avg(); err != nil {
		m.logger.Debug("sample node load", "err", err)
	} else {
		n.Load1 = avg.Load1
	}
	if b, err := os.ReadFile("/proc/pressure/memory"); err == nil {
		n.MemPressureSome10 = parsePressure(b)
	}
	m.sampleCPU(&n)
	return n
}

// readProcs reads /proc/<pid>/stat of every process on the node.
func (m *Monitor) readProcs() (map[int]procStat, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	procs := make(map[int]procStat, len(entries))
	buf := make([]byte, 4096) // a stat line is under 1 KiB
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue // not a process
		}
		n, err := readFile("/proc/"+e.Name()+"/stat", buf)
		var p procStat
		if err == nil {
			p, err = parseStat(pid, buf[:n])
		}
		if err != nil { // most likely exited since the listing
			m.logger.Debug("read process stat", "pid", pid, "err", err)
			continue
		}
		procs[pid] = p
	}
	return procs, nil
}

// readFile reads a small file into buf with three syscalls, about half the
// cost of os.ReadFile, as a pass reads one file per process on the node.
func readFile(path string, buf []byte) (int, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer syscall.Close(fd)
	return syscall.Read(fd, buf)
}

// parseStat parses the /proc/<pid>/stat line of pid; see proc(5) for the fields.
func parseStat(pid int, b []byte) (procStat, error) {
	end := bytes.LastIndexByte(b, ')')     // the command may hold spaces and parentheses
	f := strings.Fields(string(b[end+1:])) // f[0] is field 3, state
	if end < 0 || len(f) < 22 {
		return procStat{}, fmt.Errorf("parse stat %q: too few fields", b)
	}
	var nums [7]uint64
	for i, k := range [7]int{1, 11, 12, 17, 19, 21, 6} { // ppid utime stime num_threads starttime rss flags
		v, err := strconv.ParseInt(f[k], 10, 64)
		if err != nil {
			return procStat{}, fmt.Errorf("parse stat field %d: %w", k+3, err)
		}
		nums[i] = uint64(max(v, 0))
	}
	return procStat{
		pid: pid, ppid: int(nums[0]), state: f[0][0],
		ticks: nums[1] + nums[2], threads: int32(nums[3]), start: nums[4], rssPages: nums[5],
		exiting: nums[6]&pfExiting != 0,
	}, nil
}

// parsePressure returns "some avg10" of a PSI file, or -1.
func parsePressure(b []byte) float64 {
	_, v, ok := strings.Cut(string(b), "some avg10=")
	v, _, _ = strings.Cut(v, " ")
	if x, err := strconv.ParseFloat(v, 64); ok && err == nil {
		return x
	}
	return -1
}

// stateName names a stat state letter the way /proc/<pid>/status does.
func stateName(c byte) string {
	for _, s := range [...]string{"Rrunning", "Ssleeping", "Ddisk-sleep", "Zzombie", "Tstopped", "ttracing-stop", "Xdead", "Iidle"} {
		if s[0] == c {
			return s[1:]
		}
	}
	return string(c)
}

// String formats s on one line, e.g. "rank 1 pid 4242: rss 812.3 MiB (3 procs),
// cpu 97%, run delay 23%, state sleeping, 12 threads, sampled 0.8s ago"; the
// run delay only when there is one.
func (s WorkerSample) String() string {
	procs := "procs"
	if s.NumProcs == 1 {
		procs = "proc"
	}
	delay := ""
	if s.RunDelayPercent > 0 {
		delay = fmt.Sprintf(", run delay %.0f%%", s.RunDelayPercent)
	}
	return fmt.Sprintf("rank %d pid %d: rss %s (%d %s), cpu %.0f%%%s, state %s, %d threads, sampled %.1fs ago",
		s.Rank, s.PID, formatBytes(s.RSSBytes), s.NumProcs, procs, s.CPUPercent, delay, s.State, s.Threads,
		time.Since(s.At).Seconds())
}

// String formats n on one line, e.g. "node: mem 3.1/23.4 GiB available, swap
// 0 B used, memory pressure some avg10 0.00%, cpu pressure some avg10 41.00%,
// steal 6%, load1 0.52"; the CPU pressure only when known, the steal only
// when there is some.
func (n NodeSample) String() string {
	pressure := "n/a"
	if n.MemPressureSome10 >= 0 {
		pressure = fmt.Sprintf("some avg10 %.2f%%", n.MemPressureSome10)
	}
	cpu := ""
	if n.CPUPressureSome10 >= 0 {
		cpu = fmt.Sprintf(", cpu pressure some avg10 %.2f%%", n.CPUPressureSome10)
	}
	if n.StealPercent > 0 {
		cpu += fmt.Sprintf(", steal %.0f%%", n.StealPercent)
	}
	const gib = 1 << 30
	return fmt.Sprintf("node: mem %.1f/%.1f GiB available, swap %s used, memory pressure %s%s, load1 %.2f",
		float64(n.MemAvailable)/gib, float64(n.MemTotal)/gib, formatBytes(n.SwapUsed), pressure, cpu, n.Load1)
}

// formatBytes formats b with a binary unit, e.g. "0 B", "812.3 MiB".
func formatBytes(b uint64) string {
	if b < 1024 {
		return fmt.Sprintf("%d B", b)
	}
	v, i := float64(b)/1024, 0
	for ; v >= 1024 && i < 3; i++ {
		v /= 1024
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGT"[i])
}
