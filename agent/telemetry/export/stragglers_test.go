package export

import (
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/otlptest"
)

// TestStragglerSpanAndGauge: a rank named a persistent straggler gets one
// span with its cause and evidence (not one per look), the gauge is 1 by
// rank and cause while it is named and 0 after, and a stall it causes
// carries its cause.
func TestStragglerSpanAndGauge(t *testing.T) {
	cleanEnv(t)
	rcv := otlptest.Start(t)
	cfg := config(rcv.Addr(), 1)
	cfg.MetricsAddr = "127.0.0.1:0"
	e := start(t, cfg)
	st := telemetry.Straggler{Rank: 2, Late: 40 * time.Millisecond, Share: 0.2, Cause: telemetry.CauseInput,
		Evidence: "it starts forward 40ms after the others"}
	e.Stragglers(0, []telemetry.Straggler{st})
	e.Stragglers(0, []telemetry.Straggler{st})
	feed(e, 0) // its stall: rank 2
	gauge := func() string {
		resp, err := http.Get(e.MetricsURL())
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return regexp.MustCompile(`(?m)^ddp_stragglers\{.*$`).FindString(string(body))
	}
	if got, want := gauge(), `ddp_stragglers{ddp_cause="input",ddp_job_id="job-1",ddp_rank="2"} 1`; got != want {
		t.Errorf("gauge %q, want %q", got, want)
	}
	e.Stragglers(0, nil)
	if got := gauge(); !strings.HasSuffix(got, "} 0") {
		t.Errorf("gauge %q after recovery, want 0", got)
	}
	shutdown(t, e)
	spans := named(rcv.Spans(), "persistent straggler")
	if len(spans) != 1 || spans[0].Attr("ddp.cause") != "input" || spans[0].Attr("ddp.cause.evidence") != st.Evidence ||
		spans[0].Attr("ddp.straggler.late") != 0.04 || spans[0].Resource["service.name"] != "ddp-agent rank 2" {
		t.Errorf("straggler spans %v, want one with cause input", spans)
	}
	stalls := 0
	for _, sp := range rcv.Spans() {
		if strings.HasPrefix(sp.Name, "stall") {
			stalls++
			if sp.Attr("ddp.cause") != "input" {
				t.Errorf("stall span %s without the straggler's cause: %v", sp.Name, sp.Attributes)
			}
		}
	}
	if stalls == 0 {
		t.Errorf("no stall span")
	}
}
