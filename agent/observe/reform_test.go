package observe

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/ddp-agent/ddp-agent/plugins/notifier"
	"github.com/ddp-agent/ddp-agent/wire"
)

// TestReformed: every rank's report is logged; the re-formation is told
// to the notifiers once per generation and number, and again in a later
// generation, whose numbers start over.
func TestReformed(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	var told []notifier.Event
	log := slog.New(slog.NewTextHandler(&logs, nil))
	o, err := Open(context.Background(), Config{}, Job{ID: "job-1", Log: log}, Policy{Notify: func(ev notifier.Event) {
		mu.Lock()
		told = append(told, ev)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close(context.Background())
	m := wire.Reformed{Reform: 1, Step: 9, Resume: 9, Source: 1, Error: "RuntimeError: injected",
		Phases: []wire.Phase{{Name: "abort", Micros: 500}, {Name: "first_step", Micros: 20_000}}}
	o.Reformed(0, 4, m)
	o.Reformed(1, 4, m)
	o.Reformed(0, 5, m)
	if n := strings.Count(logs.String(), `msg="re-formed in process: the workers kept their processes"`); n != 3 {
		t.Errorf("%d reports logged, want 3:\n%s", n, logs.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(told) != 2 || told[0].Kind != notifier.Reformed || told[0].Generation != 4 || told[1].Generation != 5 ||
		told[0].Details["first_step_ms"] != "20.0" || told[0].Details["lost_steps"] != "1" ||
		!strings.Contains(told[0].Message, "every rank resumed at step 9 with rank 1's state, 20.5 ms after the fault") {
		t.Errorf("told %+v, want generation 4's and 5's re-formation once each", told)
	}
}
