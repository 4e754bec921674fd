package pluginhost

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins/detector"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

// testHost is a host with no plugins, whose log and events the test reads.
func testHost(t *testing.T, onFinding func(Finding)) (*Host, *bytes.Buffer, *runner) {
	var buf bytes.Buffer
	cfg := Config{OnFinding: onFinding, QueueSize: 4}
	cfg.defaults()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h := &Host{cfg: cfg, log: slog.New(slog.NewTextHandler(&buf, nil)), ctx: ctx, cancel: cancel}
	h.verdicts = newVerdicts(h)
	r := newRunner(h, Spec{Name: "sink"})
	h.runners = []*runner{r}
	return h, &buf, r
}

// A subject's verdict is logged and notified when it changes, and once
// when it clears; every restart or drain verdict reaches OnFinding.
func TestVerdicts(t *testing.T) {
	var acted []Finding
	h, buf, r := testHost(t, func(f Finding) { acted = append(acted, f) })
	t0 := time.Now()
	add := func(sev detector.Severity, act detector.Action, msg string, at time.Duration) {
		h.verdicts.add("exec", detector.Finding{Severity: sev, Action: act, Message: msg, Time: t0.Add(at)})
	}
	add(detector.SeverityOK, detector.ActionNone, "fine", 0)
	add(detector.SeverityError, detector.ActionRestartWorkers, "port down", time.Second)
	add(detector.SeverityError, detector.ActionRestartWorkers, "port down", 2*time.Second)
	add(detector.SeverityOK, detector.ActionNone, "fine", 3*time.Second)
	if len(acted) != 2 {
		t.Errorf("OnFinding got %d findings, want both restart verdicts", len(acted))
	}
	if n := strings.Count(buf.String(), "health finding"); n != 2 {
		t.Errorf("%d log lines, want the finding and its clearing:\n%s", n, buf)
	}
	if got := len(r.q); got != 2 {
		t.Errorf("%d events queued, want 2 (the finding, the clearing)", got)
	}
}

// A full queue drops events without blocking and counts them.
func TestNotifyNeverBlocks(t *testing.T) {
	h, buf, r := testHost(t, nil)
	r.kind.Store(kindNotifier)
	done := make(chan struct{})
	go func() {
		for i := 0; i < 100; i++ {
			h.Notify(notifier.Event{Kind: notifier.Restarted, Rank: -1})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Notify blocked on a full queue")
	}
	if r.dropped.Load() != 96 || !strings.Contains(buf.String(), "events are dropped") {
		t.Errorf("dropped %d, want 96 and a warning:\n%s", r.dropped.Load(), buf)
	}
}
