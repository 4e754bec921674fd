package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/leaktest"
	"github.com/ddp-agent/ddp-agent/internal/syncbuf"
)

// TestMain doubles as the worker program: with SUPERVISOR_HELPER set, the
// test binary behaves as the worker named by it and never runs tests.
func TestMain(m *testing.M) {
	if mode := os.Getenv("SUPERVISOR_HELPER"); mode != "" {
		helper(mode)
		return
	}
	before := runtime.NumGoroutine()
	code := m.Run()
	if code == 0 {
		// Every group in the tests has been stopped: nothing may still run.
		if err := leaktest.CheckCount(before, 2*time.Second); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

func helper(mode string) {
	rank, _ := strconv.Atoi(os.Getenv("RANK"))
	name, arg, _ := strings.Cut(mode, ":")
	switch name {
	case "exit": // exit:CODE, or exit:CODE@RANK (only that rank fails, the others sleep)
		code, failRank, only := strings.Cut(arg, "@")
		c, _ := strconv.Atoi(code)
		if only && failRank != strconv.Itoa(rank) {
			time.Sleep(time.Minute)
		}
		fmt.Printf("hello from rank %d\n", rank)
		for i := 0; i < 30; i++ {
			fmt.Fprintf(os.Stderr, "err line %d\n", i)
		}
		os.Exit(c)
	case "sleep":
		time.Sleep(time.Minute)
	case "sleepif": // sleepif:RANK: that rank sleeps, the others exit 0 at once
		if arg == strconv.Itoa(rank) {
			time.Sleep(time.Minute)
		}
	case "ignoreterm":
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ready")
		time.Sleep(time.Minute)
	case "child":
		c := exec.Command("sleep", "60")
		if err := c.Start(); err != nil {
			panic(err)
		}
		fmt.Printf("child %d\n", c.Process.Pid)
		time.Sleep(time.Minute)
	case "childexit": // leaves a child behind in its process group and exits 0
		c := exec.Command("sleep", "60")
		if err := c.Start(); err != nil {
			panic(err)
		}
		fmt.Printf("child %d\n", c.Process.Pid)
		os.Exit(0)
	case "spam":
		line := bytes.Repeat([]byte("x"), 1000)
		line = append(line, '\n')
		for {
			os.Stdout.Write(line)
		}
	case "lines": // lines:N: N lines of 1000 bytes, then exit 0
		n, _ := strconv.Atoi(arg)
		line := append(bytes.Repeat([]byte("x"), 999), '\n')
		for i := 0; i < n; i++ {
			os.Stdout.Write(line)
		}
	case "torchprefix": // a traceback as torch 2.x's excepthook writes it, rank-prefixed
		fmt.Fprintf(os.Stderr, "[rank%d]: Traceback (most recent call last):\nplain line\n", rank)
	case "longline":
		os.Stdout.Write(bytes.Repeat([]byte("y"), 200<<10))
		os.Stdout.Write([]byte("\ntail-no-newline"))
	case "errorfile":
		os.WriteFile(os.Getenv("TORCHELASTIC_ERROR_FILE"), []byte(`{"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": "Traceback:\n  line 1", "timestamp": "1700000000"}}}`), 0o644)
		os.Exit(1)
	case "raising": // raising:PATH: rank 1 writes its error file once PATH exists, and sleeps on
		for rank == 1 {
			if _, err := os.Stat(arg); err == nil {
				os.WriteFile(os.Getenv("TORCHELASTIC_ERROR_FILE"), []byte(`{"message": "RuntimeError: raised"}`), 0o644)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(time.Minute)
	case "peernote": // rank 1 notes that rank 0 closed and exits 1 first; rank 0 raises (its error file) and exits 2 later
		if rank == 1 {
			os.WriteFile(os.Getenv("DDP_AGENT_COMM_NOTE_FILE"), []byte(`{"communicator": "c", "rank": 1, "world_size": 2, "peer": 0, "kind": "closed", "time_unix_nano": 1700000000000000000, "message": "rank 0 closed its communicator"}`), 0o644)
			os.Exit(1)
		}
		os.WriteFile(os.Getenv("TORCHELASTIC_ERROR_FILE"), []byte(`{"message": "RuntimeError: raised"}`), 0o644)
		os.WriteFile(os.Getenv("DDP_AGENT_COMM_NOTE_FILE"), []byte(`{"closed_unix_nano": 1699999999000000000, "rank": 0, "world_size": 2}`), 0o644)
		time.Sleep(300 * time.Millisecond)
		os.Exit(2)
	case "printenv": // printenv:NAME
		fmt.Printf("%s=%s args=%q\n", arg, os.Getenv(arg), os.Args[1:])
	case "selfkill":
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	case "selfkillif": // selfkillif:RANK: that rank kills itself, the others exit 0 at once
		if arg == strconv.Itoa(rank) {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	case "spare": // a warm spare: reads its assignment on fd 3 and says what it got
		spareHelper()
	case "store": // store, store:die, store:stay: as the job's store or as a worker (store_test.go)
		storeHelper(rank, arg)
	}
}

func testSpec(t *testing.T, mode string, nproc int, streams Streams) (*Spec, *syncbuf.Buffer, *syncbuf.Buffer) {
	t.Helper()
	out, errb := &syncbuf.Buffer{}, &syncbuf.Buffer{}
	return &Spec{
		Argv:         []string{os.Args[0]},
		BaseEnv:      append(os.Environ(), "SUPERVISOR_HELPER="+mode),
		NProc:        nproc,
		WorldSize:    nproc,
		NNodes:       1,
		MasterAddr:   "127.0.0.1",
		MasterPort:   29500,
		RunID:        "test",
		Role:         "default",
		AttemptDir:   filepath.Join(t.TempDir(), "attempt_0"),
		Streams:      func(int) Streams { return streams },
		Stdout:       NewConsole(out),
		Stderr:       NewConsole(errb),
		RestartCount: 0,
	}, out, errb
}

var consoleOnly = Streams{ConsoleOut: true, ConsoleErr: true}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func start(t *testing.T, spec *Spec) *Group {
	t.Helper()
	g := New(spec, quiet())
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Stop(syscall.SIGTERM, time.Second) })
	return g
}

func alive(pid int) bool {
	st, err := readStat(pid)
	return err == nil && st.state != 'Z'
}

func TestGroupSucceeds(t *testing.T) {
	spec, out, _ := testSpec(t, "exit:0", 3, consoleOnly)
	g := start(t, spec)
	if err := g.Wait(context.Background()); err != nil {
		t.Fatalf("Wait: got %v, want nil", err)
	}
	if g.State() != StateSucceeded {
		t.Errorf("state: got %v, want succeeded", g.State())
	}
	for r := 0; r < 3; r++ {
		if want := fmt.Sprintf("[rank%d]:hello from rank %d\n", r, r); !strings.Contains(out.String(), want) {
			t.Errorf("stdout: got %q, want a line %q", out.String(), want)
		}
	}
}

func TestGroupFailure(t *testing.T) {
	tests := []struct {
		name       string
		mode       string
		wantCode   int
		wantSignal syscall.Signal
		check      func(*WorkerExitError) string
	}{
		{name: "exit code", mode: "exit:3@1", wantCode: 3, check: func(e *WorkerExitError) string {
			if len(e.StderrTail) != tailLines || e.StderrTail[tailLines-1] != "err line 29" {
				return fmt.Sprintf("stderr tail of %d lines ending in err line 29", tailLines)
			}
			return ""
		}},
		{name: "signal", mode: "selfkill", wantCode: -1, wantSignal: syscall.SIGKILL},
		{name: "error file", mode: "errorfile", wantCode: 1, check: func(e *WorkerExitError) string {
			if e.ErrorFile == nil || e.ErrorFile.Message != "RuntimeError: boom" || !strings.Contains(e.ErrorFile.Traceback, "line 1") || e.ErrorFile.Time.Unix() != 1700000000 {
				return "the error file's message, traceback and time"
			}
			return ""
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec, _, _ := testSpec(t, tc.mode, 2, consoleOnly)
			g := start(t, spec)
			err := g.Wait(context.Background())
			var e *WorkerExitError
			if !errors.As(err, &e) {
				t.Fatalf("Wait: got %v, want a *WorkerExitError", err)
			}
			if e.Code != tc.wantCode || e.Signal != tc.wantSignal {
				t.Errorf("got code %d signal %v, want %d %v", e.Code, e.Signal, tc.wantCode, tc.wantSignal)
			}
			if tc.check != nil {
				if want := tc.check(e); want != "" {
					t.Errorf("got %+v, want %s", e, want)
				}
			}
			if abandoned := g.Stop(syscall.SIGTERM, 2*time.Second); len(abandoned) != 0 {
				t.Errorf("abandoned %v", abandoned)
			}
			for _, pid := range g.PIDs() {
				if alive(pid) {
					t.Errorf("pid %d still alive after Stop", pid)
				}
			}
			if g.State() != StateFailed {
				t.Errorf("state: got %v, want failed", g.State())
			}
		})
	}
}

func TestStopEscalatesToSIGKILL(t *testing.T) {
	spec, out, _ := testSpec(t, "ignoreterm", 2, consoleOnly)
	g := start(t, spec)
	waitFor(t, func() bool { return strings.Count(out.String(), "ready") == 2 })
	t0 := time.Now()
	g.Stop(syscall.SIGTERM, 300*time.Millisecond)
	if d := time.Since(t0); d < 300*time.Millisecond || d > 2*time.Second {
		t.Errorf("Stop took %v, want the 300ms grace plus a little", d)
	}
	for r, pid := range g.PIDs() {
		if alive(pid) {
			t.Errorf("rank %d pid %d survived", r, pid)
		}
	}
}

func TestStopPromptWhenWorkersObeySIGTERM(t *testing.T) {
	spec, _, _ := testSpec(t, "sleep", 2, consoleOnly)
	g := start(t, spec)
	t0 := time.Now()
	g.Stop(syscall.SIGTERM, 10*time.Second)
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("Stop took %v, want well under the 10s grace", d)
	}
}

// TestStopAbandonsUnkillable simulates a worker in uninterruptible sleep
// (signals have no effect): Stop must return, naming it.
func TestStopAbandonsUnkillable(t *testing.T) {
	spec, _, _ := testSpec(t, "sleep", 1, consoleOnly)
	g := start(t, spec)
	g.signal = func(int, syscall.Signal) error { return nil }
	g.reapWait = 200 * time.Millisecond
	t0 := time.Now()
	abandoned := g.Stop(syscall.SIGTERM, 100*time.Millisecond)
	// grace 100ms + reapWait 200ms + up to 1s for the live worker's pipes.
	if d := time.Since(t0); d > 3*time.Second {
		t.Errorf("Stop took %v with an unkillable worker, want about 1.3s", d)
	}
	if pid := g.PIDs()[0]; len(abandoned) != 1 || abandoned[0] != pid {
		t.Errorf("abandoned: got %v, want [%d]", abandoned, pid)
	}
	g.signal = func(pgid int, sig syscall.Signal) error { return syscall.Kill(-pgid, sig) }
}

func TestStopKillsWorkerChildren(t *testing.T) {
	spec, out, _ := testSpec(t, "child", 1, consoleOnly)
	g := start(t, spec)
	var child int
	waitFor(t, func() bool {
		_, err := fmt.Sscanf(strings.TrimPrefix(out.String(), "[rank0]:"), "child %d", &child)
		return err == nil
	})
	g.Stop(syscall.SIGTERM, time.Second)
	waitFor(t, func() bool { return !alive(child) })
}

func TestRankOf(t *testing.T) {
	spec, out, _ := testSpec(t, "child", 2, consoleOnly)
	g := start(t, spec)
	var child int
	waitFor(t, func() bool {
		for _, l := range strings.Split(out.String(), "\n") {
			if _, err := fmt.Sscanf(l, "[rank1]:child %d", &child); err == nil {
				return true
			}
		}
		return false
	})
	tests := []struct {
		name    string
		pid     int
		want    int
		wantErr bool
	}{
		{"worker", g.PIDs()[0], 0, false},
		{"worker's child", child, 1, false},
		{"stranger", os.Getpid(), 0, true},
		{"no such pid", 1 << 30, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := g.RankOf(tc.pid)
			if (err != nil) != tc.wantErr || (err == nil && got != tc.want) {
				t.Errorf("RankOf(%d): got %d, %v; want %d, error %v", tc.pid, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestLogFilesAndRedirects(t *testing.T) {
	spec, out, errb := testSpec(t, "exit:0", 2, Streams{ConsoleOut: false, ConsoleErr: true, FileOut: true, FileErr: true})
	g := start(t, spec)
	if err := g.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "hello") {
		t.Errorf("redirected stdout reached the console: %q", out.String())
	}
	if !strings.Contains(errb.String(), "[rank1]:err line 29") {
		t.Errorf("stderr console: got %q, want rank 1's lines", errb.String())
	}
	for r := 0; r < 2; r++ {
		b, err := os.ReadFile(filepath.Join(spec.AttemptDir, strconv.Itoa(r), "stdout.log"))
		if err != nil || string(b) != fmt.Sprintf("hello from rank %d\n", r) {
			t.Errorf("rank %d stdout.log: got %q, %v", r, b, err)
		}
		b, err = os.ReadFile(filepath.Join(spec.AttemptDir, strconv.Itoa(r), "stderr.log"))
		if err != nil || strings.Count(string(b), "\n") != 30 {
			t.Errorf("rank %d stderr.log: got %d lines, %v; want 30", r, strings.Count(string(b), "\n"), err)
		}
	}
	// A second attempt in the same directory must not overwrite the first.
	if err := New(spec, quiet()).Start(context.Background()); err == nil {
		t.Error("Start reused an attempt directory that already holds logs")
	}
}

func TestLongLinesAreSplit(t *testing.T) {
	spec, out, _ := testSpec(t, "longline", 1, consoleOnly)
	g := start(t, spec)
	if err := g.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	for _, l := range lines {
		if !strings.HasPrefix(l, "[rank0]:") || len(l) > maxLine+len("[rank0]:")+readChunk {
			t.Fatalf("line of %d bytes starting %.20q", len(l), l)
		}
	}
	if last := lines[len(lines)-1]; last != "[rank0]:tail-no-newline" {
		t.Errorf("last line: got %q, want the unterminated tail", last)
	}
}

// TestTorchPrefixNotDoubled: torch 2.x's excepthook already puts
// "[rank0]: " before each traceback line; the console showed
// "[rank0]:[rank0]: Traceback". Lines without it are prefixed as ever.
func TestTorchPrefixNotDoubled(t *testing.T) {
	spec, _, errb := testSpec(t, "torchprefix", 2, consoleOnly)
	g := start(t, spec)
	if err := g.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	for r := range 2 {
		for _, want := range []string{fmt.Sprintf("\n[rank%d]: Traceback", r), fmt.Sprintf("[rank%d]:plain line\n", r)} {
			if !strings.Contains("\n"+errb.String(), want) {
				t.Errorf("no %q in:\n%s", want, errb.String())
			}
		}
	}
	if strings.Contains(errb.String(), "]:[rank") {
		t.Errorf("a doubled prefix:\n%s", errb.String())
	}
}

// TestSpamDoesNotBlock: a worker writing as fast as it can does not delay
// noticing another worker's failure or stopping the group.
func TestSpamDoesNotBlock(t *testing.T) {
	spec, _, _ := testSpec(t, "spam", 2, Streams{ConsoleOut: true, ConsoleErr: true, FileOut: true})
	spec.Stdout = NewConsole(io.Discard)
	g := start(t, spec)
	time.Sleep(300 * time.Millisecond)
	syscall.Kill(g.PIDs()[1], syscall.SIGKILL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var e *WorkerExitError
	if err := g.Wait(ctx); !errors.As(err, &e) || e.Rank != 1 {
		t.Fatalf("Wait: got %v, want rank 1 killed", err)
	}
	t0 := time.Now()
	g.Stop(syscall.SIGTERM, time.Second)
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("Stop took %v while a worker spammed", d)
	}
}

func TestWaitCancelled(t *testing.T) {
	spec, _, _ := testSpec(t, "sleep", 1, consoleOnly)
	g := start(t, spec)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := g.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait: got %v, want the context's error", err)
	}
	g.Stop(syscall.SIGTERM, time.Second)
	if g.State() != StateStopped {
		t.Errorf("state: got %v, want stopped", g.State())
	}
}

func TestStartFailure(t *testing.T) {
	spec, _, _ := testSpec(t, "sleep", 2, consoleOnly)
	spec.Argv = []string{filepath.Join(t.TempDir(), "no-such-program")}
	if err := New(spec, quiet()).Start(context.Background()); err == nil || !strings.Contains(err.Error(), "local rank 0") {
		t.Errorf("Start: got %v, want an error naming local rank 0", err)
	}
}

// TestPlace: each worker runs behind its prefix (here env(1), which sets a
// variable and execs the rest, as the NUMA trampoline does) with its own
// variables; a missing program still fails Start with a prefix.
func TestPlace(t *testing.T) {
	spec, out, _ := testSpec(t, "printenv:WHERE", 2, consoleOnly)
	spec.Place = func(lr int) Placement {
		return Placement{Prefix: []string{"env", fmt.Sprintf("PREFIXED=%d", lr)}, Env: map[string]string{"WHERE": fmt.Sprintf("gpu%d", lr)}}
	}
	spec.Argv = []string{os.Args[0], "x"}
	g := start(t, spec)
	if err := g.Wait(context.Background()); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	for lr := range 2 {
		if want := fmt.Sprintf("[rank%d]:WHERE=gpu%d args=[\"x\"]\n", lr, lr); !strings.Contains(out.String(), want) {
			t.Errorf("stdout: got %q, want a line %q", out.String(), want)
		}
	}

	spec.Argv = []string{filepath.Join(t.TempDir(), "no-such-program")}
	if err := New(spec, quiet()).Start(context.Background()); err == nil || !strings.Contains(err.Error(), "no-such-program") {
		t.Errorf("Start with a prefix and a missing program: got %v, want an error naming it", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWaitCountsEarlyExits: workers that exit before Wait is called are
// neither missed nor counted twice.
func TestWaitCountsEarlyExits(t *testing.T) {
	spec, _, _ := testSpec(t, "sleepif:2", 3, consoleOnly)
	g := start(t, spec)
	waitFor(t, func() bool { return !alive(g.PIDs()[0]) && !alive(g.PIDs()[1]) })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := g.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with rank 2 still running: got %v, want the context's deadline", err)
	}
	spec2, _, _ := testSpec(t, "exit:5@2", 3, consoleOnly)
	g2 := start(t, spec2)
	waitFor(t, func() bool { return g2.PIDs()[2] != 0 && !alive(g2.PIDs()[2]) })
	var e *WorkerExitError
	if err := g2.Wait(context.Background()); !errors.As(err, &e) || e.Rank != 2 {
		t.Fatalf("Wait: got %v, want rank 2's failure", err)
	}
}

func TestWaitWarnsAboutLingeringWorker(t *testing.T) {
	spec, _, _ := testSpec(t, "sleepif:1", 2, consoleOnly)
	logs := &syncbuf.Buffer{}
	g := New(spec, slog.New(slog.NewTextHandler(logs, nil)))
	g.lingerWarn = 100 * time.Millisecond
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Stop(syscall.SIGTERM, time.Second) })
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error)
	go func() { waited <- g.Wait(ctx) }()
	waitFor(t, func() bool {
		return strings.Contains(logs.String(), "worker still running after others succeeded") && strings.Contains(logs.String(), "rank=1")
	})
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Errorf("Wait: got %v, want cancelled while rank 1 runs", err)
	}
}

// TestReapKillsWorkerChildren: when a worker exits, children it left in its
// process group go with it, on success too.
func TestReapKillsWorkerChildren(t *testing.T) {
	spec, out, _ := testSpec(t, "childexit", 1, consoleOnly)
	g := start(t, spec)
	if err := g.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	var child int
	if _, err := fmt.Sscanf(strings.TrimPrefix(out.String(), "[rank0]:"), "child %d", &child); err != nil {
		t.Fatalf("no child pid in %q", out.String())
	}
	waitFor(t, func() bool { return !alive(child) })
}

// TestRaising: a group is raising once a running worker has written its
// error file, and no longer once that worker has exited.
func TestRaising(t *testing.T) {
	raise := filepath.Join(t.TempDir(), "raise")
	spec, _, _ := testSpec(t, "raising:"+raise, 2, consoleOnly)
	g := start(t, spec)
	if g.Raising() {
		t.Fatal("raising before any worker wrote its error file")
	}
	if err := os.WriteFile(raise, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); !g.Raising(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not raising 30 s after rank 1 was told to write its error file")
		}
	}
	g.Stop(syscall.SIGTERM, time.Second)
	if g.Raising() {
		t.Error("raising after every worker exited")
	}
}
