package export

import (
	"bytes"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// TestPromtoolCheckMetrics: a scrape with every metric present passes
// `promtool check metrics` (Prometheus's naming and unit rules), and the
// names are the ones alert rules and dashboards use. Skipped without
// promtool (Debian's prometheus package).
func TestPromtoolCheckMetrics(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("no promtool")
	}
	cleanEnv(t)
	cfg := config("", 1)
	cfg.MetricsAddr = "127.0.0.1:0"
	e := start(t, cfg)
	feed(e, 0)
	e.Hang(telemetry.Hang{Key: telemetry.Key{Step: 10}, Missing: []int{1}}, nil)
	e.Fault(0, "test", true)
	e.Stragglers(0, []telemetry.Straggler{{Rank: 2, Cause: telemetry.CauseInput}})
	e.Reformed(telemetry.Reform{N: 1, Phases: []telemetry.ReformPhase{{Name: "abort", Took: time.Millisecond}}})
	resp, err := http.Get(e.MetricsURL())
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{`ddp_allreduce_duration_seconds_bucket\{`, `ddp_allreduce_busbw_bytes_per_second_bucket\{`,
		`ddp_collectives_total\{`, `ddp_stalls_total\{.*ddp_straggler_rank="2"`, `ddp_stall_waited_seconds_total\{`,
		`ddp_hangs_total\{`, `ddp_restarts_total\{`, `ddp_stragglers\{ddp_cause="input",.*ddp_rank="2"`,
		`ddp_reforms_total\{`, `ddp_reform_duration_seconds_bucket\{`, `ddp_steps_total\{`} {
		if !regexp.MustCompile(`(?m)^` + name).Match(body) {
			t.Errorf("no series %s in the scrape", name)
		}
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// TestStepsTotal: ddp_steps_total counts each step of a generation once,
// whatever its buckets; a new generation's steps count though their
// numbers start again; the state move of an in-process re-formation and a
// late collective of an older step count nothing.
func TestStepsTotal(t *testing.T) {
	cleanEnv(t)
	cfg := config("", 1)
	cfg.MetricsAddr = "127.0.0.1:0"
	e := start(t, cfg)
	if got := stepsTotal(t, e); got != "0" {
		t.Fatalf("before any collective: ddp_steps_total %s, want 0", got)
	}
	for s := range uint64(5) { // generation 0: steps 0-4, every bucket
		for b := range uint32(buckets) {
			e.Collectives([]telemetry.Collective{collective(0, s, b)})
		}
	}
	// Re-formed in process as generation 1 at step 5: the ranks meet and
	// the state moves under the state bucket, labelled step 4.
	e.Collectives([]telemetry.Collective{collective(1, 4, telemetry.StateBucket), collective(1, 4, telemetry.StateBucket)})
	e.Collectives([]telemetry.Collective{collective(1, 5, 0), collective(0, 4, 2), collective(1, 5, 1), collective(1, 6, 0)})
	// The last step's buffers broadcast and the script's all-reduce of its
	// loss after the backward, labelled the next step: no step of their own.
	e.Collectives([]telemetry.Collective{collective(1, 7, telemetry.BuffersBucket), collective(1, 7, 0),
		collective(1, 8, 1<<31-3), collective(1, 8, 1<<31-4)})
	// Restarted as generation 2: the new processes' hooks count from 0.
	e.Collectives([]telemetry.Collective{collective(2, 0, 0), collective(2, 0, 1), collective(2, 1, 0)})
	if got := stepsTotal(t, e); got != "10" {
		t.Errorf("ddp_steps_total %s, want 10 (5 + 3 + 2)", got)
	}
}

// stepsTotal scrapes e and returns the value of ddp_steps_total.
func stepsTotal(t *testing.T, e *Exporter) string {
	t.Helper()
	resp, err := http.Get(e.MetricsURL())
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`(?m)^ddp_steps_total\{[^}]*\} (\S+)$`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("no ddp_steps_total in the scrape:\n%s", body)
	}
	return string(m[1])
}
