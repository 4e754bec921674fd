package export

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"testing"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// TestHubServesEveryJob: two jobs' exporters on one hub (the sidecar's
// --metrics-addr): one scrape has both jobs' series, each labelled with
// its job; a job's series go with its exporter's Shutdown.
func TestHubServesEveryJob(t *testing.T) {
	cleanEnv(t)
	hub, err := ServeHub("127.0.0.1:0", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer hub.Close(context.Background())
	a, b := config("", 1), config("", 1)
	a.JobID, b.JobID = "job-a", "job-b"
	a.Hub, b.Hub = hub, hub
	ea, eb := start(t, a), start(t, b)
	if ea.MetricsURL() != hub.URL() {
		t.Errorf("the exporter names %q, not the hub's %q", ea.MetricsURL(), hub.URL())
	}
	ea.Hang(telemetry.Hang{Key: telemetry.Key{Step: 3}, Missing: []int{1}}, nil)
	scrape := func() string {
		resp, err := http.Get(hub.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("scrape: %s\n%s", resp.Status, body)
		}
		return string(body)
	}
	body := scrape()
	for _, want := range []string{`(?m)^ddp_hangs_total\{[^}]*ddp_job_id="job-a"[^}]*\} 1$`, `(?m)^ddp_hangs_total\{[^}]*ddp_job_id="job-b"[^}]*\} 0$`} {
		if !regexp.MustCompile(want).MatchString(body) {
			t.Errorf("the scrape lacks %s:\n%s", want, body)
		}
	}
	if err := eb.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if body := scrape(); regexp.MustCompile(`ddp_job_id="job-b"`).MatchString(body) || !regexp.MustCompile(`ddp_job_id="job-a"`).MatchString(body) {
		t.Errorf("after job-b's shutdown, want job-a's series alone:\n%s", body)
	}
}
