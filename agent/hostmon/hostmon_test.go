package hostmon

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// start runs a command for the test and kills it at cleanup.
func start(t testing.TB, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // so cleanup kills descendants too
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	return cmd
}

func newMonitor(opts ...Option) *Monitor {
	return NewMonitor(slog.New(slog.DiscardHandler), opts...)
}

// sampleUntil samples until cond holds for rank's sample or a deadline passes.
func sampleUntil(t *testing.T, m *Monitor, rank int, cond func(WorkerSample) bool) WorkerSample {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m.Sample()
		s, ok := m.Worker(rank)
		if ok && cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met; last sample %v (ok %v)", s, ok)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestWorkerSample(t *testing.T) {
	tests := []struct {
		name      string
		cmd       []string
		wantProcs int
	}{
		{name: "single process", cmd: []string{"sleep", "30"}, wantProcs: 1},
		{name: "process tree", cmd: []string{"/bin/sh", "-c", "sleep 30 & sleep 30 & wait"}, wantProcs: 3},
		{name: "grandchildren", cmd: []string{"/bin/sh", "-c", "/bin/sh -c 'sleep 30 & wait' & sleep 30 & wait"}, wantProcs: 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := start(t, tc.cmd[0], tc.cmd[1:]...)
			m := newMonitor()
			m.SetWorkers(map[int]int{3: cmd.Process.Pid})
			s := sampleUntil(t, m, 3, func(s WorkerSample) bool {
				return s.NumProcs == tc.wantProcs && s.State == "sleeping" // sh runs while it forks
			})
			if s.Rank != 3 || s.PID != cmd.Process.Pid {
				t.Errorf("got rank %d pid %d, want rank 3 pid %d", s.Rank, s.PID, cmd.Process.Pid)
			}
			if s.RSSBytes == 0 {
				t.Errorf("got rss %d, want > 0", s.RSSBytes)
			}
			if s.State != "sleeping" {
				t.Errorf("got state %q, want %q", s.State, "sleeping")
			}
			if s.Threads != 1 {
				t.Errorf("got %d threads, want 1", s.Threads)
			}
			if time.Since(s.At) > 5*time.Second {
				t.Errorf("got sample time %v, want recent", s.At)
			}
		})
	}
}

func TestCPUPercent(t *testing.T) {
	busy := start(t, "/bin/sh", "-c", "while :; do :; done")
	idle := start(t, "sleep", "30")
	m := newMonitor()
	m.SetWorkers(map[int]int{0: busy.Process.Pid, 1: idle.Process.Pid})
	m.Sample()
	first, _ := m.Worker(0)
	if first.CPUPercent != 0 {
		t.Errorf("got first sample cpu %.0f%%, want 0", first.CPUPercent)
	}
	// The scheduler's own count of the busy loop's CPU time in between tells
	// what to expect: about 100% on an idle machine, less on a loaded one.
	ran0 := schedNanos(t, busy.Process.Pid)
	time.Sleep(time.Second)
	ran1 := schedNanos(t, busy.Process.Pid)
	m.Sample()
	s, _ := m.Worker(0)
	want := (ran1 - ran0) / 1e9 / s.At.Sub(first.At).Seconds() * 100
	if s.CPUPercent < want-10 || s.CPUPercent > want+10 {
		t.Errorf("got busy cpu %.0f%%, want %.0f%% ± 10", s.CPUPercent, want)
	}
	if s, _ := m.Worker(1); s.CPUPercent > 5 {
		t.Errorf("got idle cpu %.0f%%, want < 5%%", s.CPUPercent)
	}
	t.Logf("busy cpu %.0f%%, scheduler says %.0f%%", s.CPUPercent, want)
}

// schedNanos returns how long pid has run on a CPU, from /proc/<pid>/schedstat.
func schedNanos(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		t.Skipf("no scheduler statistics: %v", err)
	}
	ns, err := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	if err != nil {
		t.Fatalf("parse schedstat %q: %v", b, err)
	}
	return ns
}

// busyPinned starts a command on CPU 0 alone, or skips the test where it
// cannot be pinned there.
func busyPinned(t *testing.T, env []string, name string, args ...string) *exec.Cmd {
	t.Helper()
	if _, err := exec.LookPath("taskset"); err != nil || runtime.NumCPU() < 1 {
		t.Skipf("cannot pin to CPU 0: taskset %v, %d CPUs", err, runtime.NumCPU())
	}
	if out, err := exec.Command("taskset", "-c", "0", "true").CombinedOutput(); err != nil {
		t.Skipf("cannot pin to CPU 0: %v: %s", err, out)
	}
	cmd := exec.Command("taskset", append([]string{"-c", "0", name}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	return cmd
}

// sampleSlowly samples every half second, up to 10 times, until cond holds
// for rank's sample, and returns the samples it took. Half a second spans
// hundreds of scheduler slices, so the run delay is an average, not a
// slice's luck.
func sampleSlowly(m *Monitor, rank int, cond func(WorkerSample) bool) []WorkerSample {
	var got []WorkerSample
	for range 10 {
		time.Sleep(500 * time.Millisecond)
		m.Sample()
		s, _ := m.Worker(rank)
		if got = append(got, s); cond(s) {
			break
		}
	}
	return got
}

// TestRunDelay: of two busy loops pinned to one CPU, each waits for it about
// half the time (more on a loaded machine, where others take CPU 0 too); a
// sleeping process never waits.
func TestRunDelay(t *testing.T) {
	loop := []string{"/bin/sh", "-c", "while :; do :; done"}
	busy := busyPinned(t, nil, loop[0], loop[1:]...)
	busyPinned(t, nil, loop[0], loop[1:]...)
	idle := start(t, "sleep", "30")
	m := newMonitor()
	m.SetWorkers(map[int]int{0: busy.Process.Pid, 1: idle.Process.Pid})
	m.Sample()
	if s, _ := m.Worker(0); s.RunDelayPercent != 0 {
		t.Errorf("got run delay %.0f%% on the first sample, want 0", s.RunDelayPercent)
	}
	got := sampleSlowly(m, 0, func(s WorkerSample) bool { return s.RunDelayPercent > 20 })
	for _, s := range got {
		t.Logf("busy: cpu %.0f%%, run delay %.0f%%", s.CPUPercent, s.RunDelayPercent)
	}
	if s := got[len(got)-1]; s.RunDelayPercent <= 20 {
		t.Errorf("got run delay %.0f%% after %d samples, want > 20%%", s.RunDelayPercent, len(got))
	}
	if s, _ := m.Worker(1); s.RunDelayPercent > 5 {
		t.Errorf("got sleeping run delay %.1f%%, want < 5%%", s.RunDelayPercent)
	}
	if got := m.Slowdown(0); !strings.Contains(got, "its threads waited for a CPU") {
		t.Errorf("got slowdown %q, want the run delay", got)
	}
	if got := m.Slowdown(7); got != "" {
		t.Errorf("got slowdown %q of a rank without a sample, want none", got)
	}
}

// TestRunDelayThreads: the run delay counts every thread, not only the main
// one that /proc/<pid>/schedstat reports. Two busy threads pinned to one CPU
// are each always running or waiting, so the tree's CPU and run delay add up
// to about 200%, which no single thread can reach.
func TestRunDelayThreads(t *testing.T) {
	busy := busyPinned(t, []string{"HOSTMON_BUSY_THREADS=2", "GOMAXPROCS=2"}, os.Args[0], "-test.run=^TestBusyThreadsHelper$")
	m := newMonitor()
	m.SetWorkers(map[int]int{0: busy.Process.Pid})
	m.Sample()
	main0, t0 := schedDelay(t, busy.Process.Pid), time.Now()
	got := sampleSlowly(m, 0, func(s WorkerSample) bool { return s.CPUPercent+s.RunDelayPercent > 130 })
	main1 := schedDelay(t, busy.Process.Pid)
	for _, s := range got {
		t.Logf("2 threads: cpu %.0f%%, run delay %.0f%%", s.CPUPercent, s.RunDelayPercent)
	}
	t.Logf("the main thread's /proc/<pid>/schedstat alone: run delay %.0f%%", (main1-main0)/float64(time.Since(t0).Nanoseconds())*100)
	if s := got[len(got)-1]; s.CPUPercent+s.RunDelayPercent <= 130 {
		t.Errorf("got cpu %.0f%% + run delay %.0f%% after %d samples, want > 130%%", s.CPUPercent, s.RunDelayPercent, len(got))
	}
}

// TestBusyThreadsHelper is the process TestRunDelayThreads starts: it spins
// HOSTMON_BUSY_THREADS goroutines until killed.
func TestBusyThreadsHelper(t *testing.T) {
	n, err := strconv.Atoi(os.Getenv("HOSTMON_BUSY_THREADS"))
	if err != nil {
		t.Skip("only run by TestRunDelayThreads")
	}
	for range n {
		go func() {
			for {
			}
		}()
	}
	select {}
}

// schedDelay returns how long pid's main thread has waited for a CPU, from
// /proc/<pid>/schedstat.
func schedDelay(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		t.Skipf("no scheduler statistics: %v", err)
	}
	d, err := parseSchedstat(b)
	if err != nil {
		t.Fatal(err)
	}
	return float64(d)
}

func TestSlowdown(t *testing.T) {
	calm := NodeSample{CPUPressureSome10: 3, StealPercent: 0.5}
	tests := []struct {
		name   string
		w      WorkerSample
		others []WorkerSample
		n      NodeSample
		want   string
	}{
		{name: "calm", w: WorkerSample{RunDelayPercent: 1}, n: calm, want: ""},
		{name: "first sample, pressure unknown", n: NodeSample{CPUPressureSome10: -1}, want: ""},
		{name: "waits just under", w: WorkerSample{RunDelayPercent: 9.9}, n: calm, want: ""},
		{name: "waits", w: WorkerSample{RunDelayPercent: 23}, n: calm, want: "its threads waited for a CPU 23% of the time"},
		{
			name: "waits on a pressed node", w: WorkerSample{RunDelayPercent: 23}, n: NodeSample{CPUPressureSome10: 41},
			want: "its threads waited for a CPU 23% of the time; the node's CPU pressure is 41%",
		},
		{name: "pressure alone is every rank's", w: WorkerSample{RunDelayPercent: 2}, n: NodeSample{CPUPressureSome10: 80}, want: ""},
		{
			name: "pressure and some waiting", w: WorkerSample{RunDelayPercent: 6}, n: NodeSample{CPUPressureSome10: 20},
			want: "its threads waited for a CPU 6% of the time; the node's CPU pressure is 20%",
		},
		{name: "some waiting, pressure unknown", w: WorkerSample{RunDelayPercent: 6}, n: NodeSample{CPUPressureSome10: -1}, want: ""},
		{name: "steal", n: NodeSample{StealPercent: 7.4}, want: "the hypervisor stole 7% of the node's CPU time"},
		{name: "steal just under", n: NodeSample{StealPercent: 4.9}, want: ""},
		{
			name: "everything", w: WorkerSample{RunDelayPercent: 35}, n: NodeSample{CPUPressureSome10: 50, StealPercent: 12},
			want: "its threads waited for a CPU 35% of the time; the node's CPU pressure is 50%; " +
				"the hypervisor stole 12% of the node's CPU time",
		},
		{
			name: "every rank of the node waits alike", w: WorkerSample{RunDelayPercent: 45},
			others: []WorkerSample{{RunDelayPercent: 40}, {RunDelayPercent: 52}}, n: NodeSample{CPUPressureSome10: 60}, want: "",
		},
		{
			name: "it stands out", w: WorkerSample{RunDelayPercent: 45}, others: []WorkerSample{{RunDelayPercent: 20}},
			n: calm, want: "its threads waited for a CPU 45% of the time (the node's other ranks: 20%)",
		},
		{name: "steal with other ranks is every rank's", others: []WorkerSample{{}}, n: NodeSample{StealPercent: 9}, want: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Slowdown(tc.w, tc.others, tc.n); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestDelaySince(t *testing.T) {
	const limit = 1000
	tests := []struct {
		name        string
		now, before map[int]uint64
		want        uint64
	}{
		{name: "threads that waited", now: map[int]uint64{1: 500, 2: 900}, before: map[int]uint64{1: 400, 2: 900}, want: 100},
		{name: "process born since", now: map[int]uint64{1: 300, 2: 200}, want: 500},
		{name: "thread born since", now: map[int]uint64{1: 500, 3: 70}, before: map[int]uint64{1: 400}, want: 170},
		{name: "thread gone", now: map[int]uint64{1: 500}, before: map[int]uint64{1: 400, 2: 50}, want: 100},
		{name: "reused thread id", now: map[int]uint64{1: 30}, before: map[int]uint64{1: 5000}, want: 30},
		{name: "no thread waits longer than the wall time", now: map[int]uint64{1: 9e9, 2: 1500}, before: map[int]uint64{2: 100}, want: 2 * limit},
		{name: "no threads", before: map[int]uint64{1: 5}, want: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := delaySince(tc.now, tc.before, limit); got != tc.want {
				t.Errorf("got %d, want %d", got, tc.want)
			}
		})
	}
}

func TestReadDelays(t *testing.T) {
	got, err := readDelays(os.Getpid(), make([]byte, 4096))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got[os.Getpid()]; !ok || len(got) < 2 { // a Go program has a few threads
		t.Errorf("got the delays of threads %v, want the main thread %d and others", slices.Sorted(maps.Keys(got)), os.Getpid())
	}
	if _, err := readDelays(1<<30, nil); err == nil {
		t.Errorf("got no error for a missing process")
	}
}

func TestSampleSurvivesExit(t *testing.T) {
	tests := []struct {
		name string
		reap bool
	}{
		{name: "reaped", reap: true},
		{name: "zombie", reap: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := start(t, "sleep", "30")
			m := newMonitor()
			m.SetWorkers(map[int]int{0: cmd.Process.Pid})
			m.Sample()
			before, ok := m.Worker(0)
			if !ok {
				t.Fatalf("got no sample, want one")
			}
			if err := cmd.Process.Kill(); err != nil {
				t.Fatalf("kill: %v", err)
			}
			if tc.reap {
				_ = cmd.Wait()
			} else {
				waitZombie(t, cmd.Process.Pid)
			}
			m.Sample()
			after, ok := m.Worker(0)
			if !ok {
				t.Fatalf("got no sample after exit, want the last one")
			}
			if after != before {
				t.Errorf("got %+v, want %+v", after, before)
			}
		})
	}
}

// waitZombie waits until pid has exited and is not reaped yet.
func waitZombie(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatalf("read stat: %v", err)
		}
		if p, err := parseStat(pid, b); err == nil && p.state == 'Z' {
			return
		}
	}
	t.Fatalf("pid %d did not become a zombie", pid)
}

func TestSetWorkersReplaces(t *testing.T) {
	a, b := start(t, "sleep", "30"), start(t, "sleep", "30")
	m := newMonitor()
	m.SetWorkers(map[int]int{0: a.Process.Pid, 1: b.Process.Pid})
	m.Sample()
	m.SetWorkers(map[int]int{0: b.Process.Pid})
	for _, rank := range []int{0, 1} {
		if s, ok := m.Worker(rank); ok {
			t.Errorf("rank %d: got %v, want no sample after SetWorkers", rank, s)
		}
	}
	m.Sample()
	if s, ok := m.Worker(0); !ok || s.PID != b.Process.Pid {
		t.Errorf("got pid %d (ok %v), want %d", s.PID, ok, b.Process.Pid)
	}
	if s, ok := m.Worker(1); ok {
		t.Errorf("got %v, want no sample of unwatched rank 1", s)
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	cmd := start(t, "sleep", "30")
	m := newMonitor(WithInterval(10 * time.Millisecond))
	m.SetWorkers(map[int]int{0: cmd.Process.Pid})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()

	// Wait for two samples: the first at start, the next on a tick.
	first := sampleAt(t, m, time.Time{})
	sampleAt(t, m, first)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("got %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// sampleAt waits for Run to store a sample of rank 0 taken after after.
func sampleAt(t *testing.T, m *Monitor, after time.Time) time.Time {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if s, ok := m.Worker(0); ok && s.At.After(after) {
			return s.At
		}
	}
	t.Fatal("Run did not sample")
	return time.Time{}
}

func TestNodeSample(t *testing.T) {
	m := newMonitor()
	if got := m.Node(); got.MemPressureSome10 != -1 || got.CPUPressureSome10 != -1 {
		t.Errorf("got memory pressure %v, cpu pressure %v before sampling, want -1", got.MemPressureSome10, got.CPUPressureSome10)
	}
	m.Sample()
	if got := m.Node().StealPercent; got != 0 {
		t.Errorf("got steal %v%% on the first pass, want 0", got)
	}
	time.Sleep(100 * time.Millisecond)
	m.Sample()
	n := m.Node()
	if n.MemTotal == 0 || n.MemAvailable == 0 || n.MemAvailable > n.MemTotal {
		t.Errorf("got available %d of total %d, want 0 < available <= total", n.MemAvailable, n.MemTotal)
	}
	if p := n.MemPressureSome10; p != -1 && (p < 0 || p > 100) {
		t.Errorf("got pressure %v, want -1 or in [0, 100]", p)
	}
	if p := n.CPUPressureSome10; p != -1 && (p < 0 || p > 100) {
		t.Errorf("got cpu pressure %v, want -1 or in [0, 100]", p)
	}
	if n.StealPercent < 0 || n.StealPercent > 100 {
		t.Errorf("got steal %v%%, want in [0, 100]", n.StealPercent)
	}
	if n.Load1 < 0 || time.Since(n.At) > 5*time.Second {
		t.Errorf("got load1 %v at %v, want >= 0, recent", n.Load1, n.At)
	}
	t.Log(n)
}

func TestStrings(t *testing.T) {
	at := time.Now().Add(-800 * time.Millisecond)
	tests := []struct {
		name string
		got  string
		want string
	}{
		{
			name: "worker",
			got: WorkerSample{Rank: 1, PID: 4242, RSSBytes: 8123 << 20 / 10, CPUPercent: 97.4, NumProcs: 3,
				State: "sleeping", Threads: 12, At: at}.String(),
			want: "rank 1 pid 4242: rss 812.3 MiB (3 procs), cpu 97%, state sleeping, 12 threads, sampled 0.8s ago",
		},
		{
			name: "worker waiting for a CPU",
			got: WorkerSample{Rank: 2, PID: 9, RSSBytes: 1 << 20, CPUPercent: 48, RunDelayPercent: 52.4, NumProcs: 1,
				State: "running", Threads: 1, At: at}.String(),
			want: "rank 2 pid 9: rss 1.0 MiB (1 proc), cpu 48%, run delay 52%, state running, 1 threads, sampled 0.8s ago",
		},
		{
			name: "worker one proc",
			got:  WorkerSample{PID: 7, RSSBytes: 1000, NumProcs: 1, State: "zombie", At: at}.String(),
			want: "rank 0 pid 7: rss 1000 B (1 proc), cpu 0%, state zombie, 0 threads, sampled 0.8s ago",
		},
		{
			name: "node",
			got: NodeSample{MemTotal: 234 << 30 / 10, MemAvailable: 31 << 30 / 10, MemPressureSome10: 0,
				CPUPressureSome10: 41, StealPercent: 6.2, Load1: 0.5}.String(),
			want: "node: mem 3.1/23.4 GiB available, swap 0 B used, memory pressure some avg10 0.00%, " +
				"cpu pressure some avg10 41.00%, steal 6%, load1 0.50",
		},
		{
			name: "node without pressure",
			got:  NodeSample{MemTotal: 1 << 30, SwapUsed: 3 << 29, MemPressureSome10: -1, CPUPressureSome10: -1}.String(),
			want: "node: mem 0.0/1.0 GiB available, swap 1.5 GiB used, memory pressure n/a, load1 0.00",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Errorf("got %q, want %q", tc.got, tc.want)
			}
		})
	}
}

func TestParseStat(t *testing.T) {
	tail := " 1 1 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0 12345 9000000 321 18446744073709551615"
	tests := []struct {
		name    string
		line    string
		want    procStat
		wantErr bool
	}{
		{
			name: "plain",
			line: "42 (python3) S 17" + tail,
			want: procStat{pid: 42, ppid: 17, state: 'S', ticks: 300, threads: 7, start: 12345, rssPages: 321},
		},
		{
			name: "command with spaces and parentheses",
			line: "42 (a (b) c) R 17" + tail,
			want: procStat{pid: 42, ppid: 17, state: 'R', ticks: 300, threads: 7, start: 12345, rssPages: 321},
		},
		{
			name: "exiting",
			line: "42 (python3) R 17 1 1 0 -1 4194564 100 0 0 0 250 50 0 0 20 0 7 0 12345 9000000 0 18446744073709551615",
			want: procStat{pid: 42, ppid: 17, state: 'R', ticks: 300, threads: 7, start: 12345, exiting: true},
		},
		{name: "truncated", line: "42 (x) S 17 1 1", wantErr: true},
		{name: "garbage", line: "nothing here", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStat(42, []byte(tc.line))
			if (err != nil) != tc.wantErr {
				t.Fatalf("got error %v, want error %v", err, tc.wantErr)
			}
			if !tc.wantErr && got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParsePressure(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want float64
	}{
		{name: "psi", in: "some avg10=1.25 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.50 avg60=0.00 avg300=0.00 total=0\n", want: 1.25},
		{name: "empty", in: "", want: -1},
		{name: "garbage", in: "some avg10=x avg60=0", want: -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := parsePressure([]byte(tc.in)); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// BenchmarkSample measures one pass over 8 workers of 3 processes each.
func BenchmarkSample(b *testing.B) {
	pids := map[int]int{}
	for rank := range 8 {
		pids[rank] = start(b, "/bin/sh", "-c", "sleep 60 & sleep 60 & wait").Process.Pid
	}
	m := newMonitor()
	m.SetWorkers(pids)
	for b.Loop() {
		m.Sample()
	}
}

func TestParseSchedstat(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    uint64
		wantErr bool
	}{
		{name: "schedstat", in: "195095032 23413191 847\n", want: 23413191},
		{name: "never waited", in: "397806 0 1\n", want: 0},
		{name: "one field", in: "397806\n", wantErr: true},
		{name: "garbage", in: "1 x 2", wantErr: true},
		{name: "empty", in: "", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseSchedstat([]byte(tc.in))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("got %d, %v; want %d, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestParseCPUTimes(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    cpuTimes
		wantErr bool
	}{
		{
			name: "proc stat", in: "cpu  1865805 1369 356723 1379165 11528 0 8877 11220 40 2\ncpu0 932902 684 178361 689582 5764 0 4438 5610 0 0\nintr 1 2 3\n",
			want: cpuTimes{steal: 11220, total: 1865805 + 1369 + 356723 + 1379165 + 11528 + 8877 + 11220},
		},
		{name: "no guest times", in: "cpu  10 0 5 80 0 0 0 5\n", want: cpuTimes{steal: 5, total: 100}},
		{name: "before steal (Linux < 2.6.11)", in: "cpu  10 0 5 80 0 0 0\n", wantErr: true},
		{name: "not the cpu line", in: "cpu0 10 0 5 80 0 0 0 5\n", wantErr: true},
		{name: "garbage", in: "cpu  10 0 5 80 x 0 0 5\n", wantErr: true},
		{name: "empty", in: "", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseCPUTimes([]byte(tc.in))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("got %+v, %v; want %+v, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestStealPercent(t *testing.T) {
	tests := []struct {
		name        string
		before, now cpuTimes
		want        float64
	}{
		{name: "first pass", now: cpuTimes{steal: 50, total: 1000}, want: 0},
		{name: "steal", before: cpuTimes{steal: 50, total: 1000}, now: cpuTimes{steal: 60, total: 1200}, want: 5},
		{name: "no time passed", before: cpuTimes{steal: 50, total: 1000}, now: cpuTimes{steal: 50, total: 1000}, want: 0},
		{name: "a CPU went offline", before: cpuTimes{steal: 50, total: 1000}, now: cpuTimes{steal: 40, total: 900}, want: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := stealPercent(tc.before, tc.now); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// BenchmarkReadDelays measures what a pass adds per process of a worker's
// tree for its run delay: listing its threads and reading their schedstat,
// here of the test binary's own threads.
func BenchmarkReadDelays(b *testing.B) {
	buf := make([]byte, 4096)
	threads := 0
	for b.Loop() {
		d, err := readDelays(os.Getpid(), buf)
		if err != nil {
			b.Fatal(err)
		}
		threads = len(d)
	}
	b.ReportMetric(float64(threads), "threads")
}

func TestStateName(t *testing.T) {
	tests := []struct {
		in   byte
		want string
	}{
		{in: 'R', want: "running"},
		{in: 'S', want: "sleeping"},
		{in: 'D', want: "disk-sleep"},
		{in: 'Z', want: "zombie"},
		{in: '?', want: "?"},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			if got := stateName(tc.in); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
