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
		`ddp_reforms_total\{`, `ddp_reform_duration_seconds_bucket\{`} {
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
