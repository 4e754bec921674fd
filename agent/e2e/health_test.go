package e2e

import (
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHealthEndpoints: a real `ddp-agent run` answers the Kubernetes
// probes next to /metrics: /healthz and /readyz 200 while its workers
// run; while it stops them (they ignore SIGTERM, so that takes the stop
// timeout), /healthz 503 "agent stopping: …" and /readyz 503 "stopped".
func TestHealthEndpoints(t *testing.T) {
	budget(t, 10*time.Second)
	r := startAgent(t, nil, "--nproc-per-node", "2", "--stop-timeout", "3s", "--metrics-addr", "127.0.0.1:0",
		"sleeper.py", "--ignore-term")
	base := waitMatch(t, 20*time.Second, r.stderr.String, regexp.MustCompile(`msg="serving prometheus metrics".* url=(\S+)/metrics`), r.logs)
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	r.workerPIDs(2)
	waitFor(t, 10*time.Second, func() bool { code, _ := get("/readyz"); return code == 200 }, func() string {
		code, body := get("/readyz")
		return "readyz " + http.StatusText(code) + " " + body + "\n" + r.logs()
	})
	if code, body := get("/healthz"); code != 200 || body != "ok" {
		t.Errorf("healthz while running: %d %q, want 200 ok", code, body)
	}

	r.cmd.Process.Signal(syscall.SIGTERM)
	var live, ready string
	waitFor(t, 3*time.Second, func() bool {
		lc, lb := get("/healthz")
		rc, rb := get("/readyz")
		live, ready = http.StatusText(lc)+" "+lb, http.StatusText(rc)+" "+rb
		return lc == 503 && rc == 503
	}, func() string { return "healthz: " + live + "; readyz: " + ready + "\n" + r.logs() })
	if !strings.HasPrefix(live, "Service Unavailable agent stopping: ") || ready != "Service Unavailable stopped" {
		t.Errorf("while stopping: healthz %q, readyz %q", live, ready)
	}
	if code := r.wait(15 * time.Second); code != 143 {
		t.Errorf("exit code %d, want 143\n%s", code, r.logs())
	}
}

// TestLastMetricsReachAScraper: a job ended by its first hang (no restarts
// left) keeps its metrics endpoint up until the scraper that read it
// during the job has read the last state: the hang counted, and no
// restart, since none happened. Before, the endpoint vanished with the
// job and no scrape saw ddp_hangs_total 1.
func TestLastMetricsReachAScraper(t *testing.T) {
	budgetAlongside(t, 40*time.Second)
	needTorch(t)
	r := startAgent(t, nil, "--standalone", "--nproc-per-node", "2", "--max-restarts", "0", "--hang-timeout", "3s",
		"--metrics-addr", "127.0.0.1:0", filepath.Join(repoRoot, "examples", "train.py"), "--steps", "10", "--log-every", "5",
		"--ckpt-dir", t.TempDir(), "--hang-rank", "1", "--hang-at-step", "4")
	url := waitMatch(t, 30*time.Second, r.stderr.String, regexp.MustCompile(`msg="serving prometheus metrics".* url=(\S+)`), r.logs)
	// A scraper at 5 Hz, as Prometheus at a short interval, until the
	// agent exits; the last body it got is what a dashboard shows.
	var last string
	for exited := false; !exited; {
		if resp, err := http.Get(url); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				last = string(b)
			}
		}
		select {
		case <-r.done:
			exited = true
		case <-time.After(200 * time.Millisecond):
		}
	}
	if r.code != 1 {
		t.Fatalf("exit code %d, want 1 (the hang ended the job)\n%s", r.code, r.logs())
	}
	if !regexp.MustCompile(`(?m)^ddp_hangs_total\{[^}]*\} 1$`).MatchString(last) {
		t.Errorf("the last scrape does not count the hang:\n%s\n%s", last, r.logs())
	}
	if m := regexp.MustCompile(`(?m)^ddp_restarts_total\{[^}]*\} (\S+)$`).FindStringSubmatch(last); m != nil && m[1] != "0" {
		t.Errorf("the last scrape counts %s restarts; the job failed without one", m[1])
	}
	if !regexp.MustCompile(`msg="metrics endpoint closing".* last_state_read=true`).MatchString(r.stderr.String()) {
		t.Errorf("the agent did not wait for the scraper\n%s", r.logs())
	}
}
