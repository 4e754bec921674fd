package watch

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/nvml"
	"github.com/ddp-agent/ddp-agent/nvml/nvmltest"
)

// TestPersistentStragglerNamesItsGPUState: a rank 10% late in every step is
// logged once as a persistent straggler, with what NVML says of its GPU
// (here throttled for power) and the cause that follows, and once more when
// it recovers. When every GPU is throttled alike, the throttling explains
// nothing: the cause is compute.
func TestPersistentStragglerNamesItsGPUState(t *testing.T) {
	for _, tc := range []struct {
		name      string
		throttled []int
		cause     string
	}{
		{"its GPU throttled", []int{1}, "cause gpu: forward and backward take 100ms longer and its GPU is slowed: throttled: sw power cap"},
		{"every GPU throttled", []int{0, 1}, "cause compute: forward and backward take 100ms longer while its input time does not grow"},
	} {
		t.Run(tc.name, func(t *testing.T) { testStragglerGPU(t, tc.throttled, tc.cause) })
	}
}

func testStragglerGPU(t *testing.T, throttled []int, cause string) {
	srv := nvmltest.DGXA100(false)
	nvmltest.QuietPolls(srv)
	tel := nvmltest.NewTelemetry(srv)
	for _, i := range throttled {
		tel.SetThrottle(i, nvmltest.ThrottleSwPowerCap)
	}
	uuid := func(i int) string {
		dev, _ := srv.DeviceGetHandleByIndex(i)
		u, _ := dev.GetUUID()
		return u
	}

	var logs strings.Builder
	s := New(Config{Log: slog.New(slog.NewTextHandler(&logs, nil)), HangTimeout: time.Minute, ReadGPU: func(u string) (GPUReading, error) {
		st, err := nvml.ReadGPUState(nvmltest.Lib(srv), u)
		return GPUReading{State: st.String(), Slowdown: st.Slowdown()}, err
	}})
	local := []telemetry.Worker{
		{Rank: 0, LocalRank: 0, Host: "node-a", PID: 100, GPU: uuid(0), GPUIndex: 0},
		{Rank: 1, LocalRank: 1, Host: "node-a", PID: 101, GPU: uuid(1), GPUIndex: 1},
	}
	s.start(0, plan{size: 2}, local, 0, "")
	base := time.Unix(1_700_000_000, 0)
	feed := func(from, to uint64, late time.Duration) {
		for step := from; step < to; step++ {
			t0 := base.Add(time.Duration(step) * time.Second)
			for rank, late := range []time.Duration{0, late} {
				// Both start forward together; rank 1's forward and
				// backward take late longer; the all-reduce ends for both
				// 10 ms after rank 1 arrives.
				arrive := t0.Add(late)
				s.analyze(s.current(), []telemetry.Record{
					{Gen: 0, Step: step, Bucket: 0, Rank: rank, Status: telemetry.StatusMark, Arrive: t0.Add(-500 * time.Millisecond)},
					{Gen: 0, Step: step, Bucket: 0, Rank: rank, Bytes: 1 << 20, DType: 7,
						Arrive: arrive, Start: arrive, End: t0.Add(100*time.Millisecond + 10*time.Millisecond)}})
			}
		}
	}
	feed(0, 20, 100*time.Millisecond)
	s.noteStragglers()
	s.noteStragglers() // once
	out := logs.String()
	if n := strings.Count(out, "persistent straggler"); n != 1 {
		t.Fatalf("%d persistent straggler lines, want 1:\n%s", n, out)
	}
	for _, want := range []string{"rank 1 (node-a, GPU 1, pid 101) held the others back in 14 of the last 14 steps",
		"by 100ms (median), 10.0% of the job's time (median step 1.00 s)", "its GPU " + uuid(1), "throttled: sw power cap", cause,
		"input +0s, compute +100ms, all-reduce +0s"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	feed(20, 100, 0) // recovered
	s.noteStragglers()
	if out := logs.String(); !strings.Contains(out, "rank 1 (node-a, GPU 1, pid 101) is no longer a persistent straggler") {
		t.Errorf("no recovery line:\n%s", out)
	}
}

func TestSeconds(t *testing.T) {
	for d, want := range map[time.Duration]string{
		502 * time.Millisecond:             "502ms",
		999600 * time.Microsecond:          "1.00 s",
		2310 * time.Millisecond:            "2.31 s",
		400 * time.Microsecond:             "0s",
		999400 * time.Microsecond:          "999ms",
		time.Minute + 500*time.Millisecond: "60.50 s",
	} {
		if got := seconds(d); got != want {
			t.Errorf("seconds(%v) = %q, want %q", d, got, want)
		}
	}
}

// TestHangNeedsQuiet: a pending collective whose arrival looks older than
// the timeout (the wall clock jumped ahead) is no hang while collectives
// keep completing; once nothing has completed for the timeout, it is.
func TestHangNeedsQuiet(t *testing.T) {
	hangs := make(chan *HangError, 1)
	s := New(Config{Log: slog.New(slog.DiscardHandler), HangTimeout: 2 * time.Second, OnHang: func(h *HangError) { hangs <- h }})
	s.start(0, plan{size: 2}, []telemetry.Worker{{Rank: 0}, {Rank: 1, LocalRank: 1}}, 0, "")
	at := s.current()
	now := time.Now()
	done := func(step uint64) {
		for r := range 2 {
			s.analyze(at, []telemetry.Record{{Step: step, Rank: r, Arrive: now, Start: now, End: now.Add(time.Millisecond)}})
		}
	}
	done(0)
	// Rank 0 is in step 1 "an hour ago": the wall clock stepped.
	s.analyze(at, []telemetry.Record{{Step: 1, Rank: 0, Status: telemetry.StatusInFlight, Arrive: now.Add(-time.Hour)}})
	s.checkHang(t.Context(), now)
	select {
	case h := <-hangs:
		t.Fatalf("hang while collectives complete: %v", h)
	default:
	}
	at.mu.Lock()
	at.progress = time.Now().Add(-3 * time.Second) // nothing completed since
	at.mu.Unlock()
	s.checkHang(t.Context(), now)
	select {
	case h := <-hangs:
		if len(h.Hang.Missing) != 1 || h.Hang.Missing[0] != 1 {
			t.Errorf("hang %+v, want rank 1 missing", h.Hang)
		}
	default:
		t.Fatal("no hang after the timeout without progress")
	}
}

// TestLogHang: a hang's record is one line; its stacks ride in it as an
// attribute, or follow it as they are on a terminal, and its whole report
// goes to a file in ReportDir, which the record names.
func TestLogHang(t *testing.T) {
	h := telemetry.Hang{Key: telemetry.Key{Gen: 2, Step: 7, Bucket: 1}}
	report := "step 7 bucket 1 (generation 2) has not finished 4.00 s after the first rank arrived; waiting: rank 0; never arrived: rank 1. Aborting the communicators.\nPython stack of rank 1:\n  File \"train.py\", line 9 in main"
	for _, terminal := range []bool{false, true} {
		var logs, console strings.Builder
		cfg := Config{Log: slog.New(slog.NewTextHandler(&logs, nil)), ReportDir: t.TempDir()}
		if terminal {
			cfg.Console = &console
		}
		s := New(cfg)
		s.logHang(h, report)
		s.Close()
		line := logs.String()
		if strings.Count(line, "\n") != 1 || !strings.Contains(line, `msg="hang: step 7 bucket 1`) {
			t.Errorf("terminal=%v: not one record: %q", terminal, line)
		}
		file := filepath.Join(cfg.ReportDir, "hang-gen2-step7-bucket1.txt")
		if b, err := os.ReadFile(file); err != nil || string(b) != report+"\n" || !strings.Contains(line, "stacks_file="+file) {
			t.Errorf("terminal=%v: report file %q, %v; record %q", terminal, b, err, line)
		}
		inRecord := strings.Contains(line, `stacks="Python stack of rank 1:\n  File \"train.py\"`)
		onConsole := console.String() == "Python stack of rank 1:\n  File \"train.py\", line 9 in main\n"
		if inRecord == terminal || onConsole != terminal {
			t.Errorf("terminal=%v: stacks in the record %v, on the console %v (%q)", terminal, inRecord, onConsole, console.String())
		}
	}
}
