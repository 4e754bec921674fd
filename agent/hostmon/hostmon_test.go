package hostmon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
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
	if got := m.Node().MemPressureSome10; got != -1 {
		t.Errorf("got pressure %v before sampling, want -1", got)
	}
	m.Sample()
	n := m.Node()
	if n.MemTotal == 0 || n.MemAvailable == 0 || n.MemAvailable > n.MemTotal {
		t.Errorf("got available %d of total %d, want 0 < available <= total", n.MemAvailable, n.MemTotal)
	}
	if p := n.MemPressureSome10; p != -1 && (p < 0 || p > 100) {
		t.Errorf("got pressure %v, want -1 or in [0, 100]", p)
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
			name: "worker one proc",
			got:  WorkerSample{PID: 7, RSSBytes: 1000, NumProcs: 1, State: "zombie", At: at}.String(),
			want: "rank 0 pid 7: rss 1000 B (1 proc), cpu 0%, state zombie, 0 threads, sampled 0.8s ago",
		},
		{
			name: "node",
			got: NodeSample{MemTotal: 234 << 30 / 10, MemAvailable: 31 << 30 / 10, MemPressureSome10: 0,
				Load1: 0.5}.String(),
			want: "node: mem 3.1/23.4 GiB available, swap 0 B used, memory pressure some avg10 0.00%, load1 0.50",
		},
		{
			name: "node without pressure",
			got:  NodeSample{MemTotal: 1 << 30, SwapUsed: 3 << 29, MemPressureSome10: -1}.String(),
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
