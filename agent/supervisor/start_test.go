package supervisor

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/syncbuf"
)

// TestStartCancelled: a context that ends while a large group is spawned
// stops the spawning before the next worker; Start returns its cause and
// leaves the workers started so far for Stop.
func TestStartCancelled(t *testing.T) {
	spec, _, _ := testSpec(t, "sleep", 1000, consoleOnly)
	spec.Argv = []string{"sleep", "60"}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	stopped := errors.New("received terminated")
	spec.Place = func(lr int) Placement {
		if lr == 5 { // as if the signal came while the sixth worker was spawned
			cancel(stopped)
		}
		return Placement{}
	}
	var logs syncbuf.Buffer
	g := New(spec, slog.New(slog.NewTextHandler(&logs, nil)))
	err := g.Start(ctx)
	if !errors.Is(err, stopped) || !strings.Contains(err.Error(), "started 6 of 1000 workers") {
		t.Fatalf("Start: %v, want the cause after 6 of 1000 workers", err)
	}
	if !strings.Contains(logs.String(), "spawning stopped") {
		t.Errorf("no log line:\n%s", logs.String())
	}
	pids := g.PIDs()
	if len(pids) != 6 {
		t.Fatalf("%d workers started, want 6", len(pids))
	}
	began := time.Now()
	if abandoned := g.Stop(syscall.SIGTERM, 5*time.Second); len(abandoned) > 0 {
		t.Errorf("abandoned %v", abandoned)
	}
	if d := time.Since(began); d > time.Second {
		t.Errorf("stopping 6 sleeps took %v", d)
	}
	for r, pid := range pids {
		if alive(pid) {
			t.Errorf("rank %d (pid %d) still runs", r, pid)
		}
	}
}

// TestStartDoneContext: nothing is spawned under a context already done.
func TestStartDoneContext(t *testing.T) {
	spec, _, _ := testSpec(t, "sleep", 3, consoleOnly)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	g := New(spec, quiet())
	if err := g.Start(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Start: %v, want context.Canceled", err)
	}
	if n := len(g.PIDs()); n != 0 {
		t.Errorf("%d workers started", n)
	}
	g.Stop(syscall.SIGTERM, time.Second)
}
