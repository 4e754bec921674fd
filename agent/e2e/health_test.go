package e2e

import (
	"io"
	"net/http"
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
	urlRE := regexp.MustCompile(`msg="serving prometheus metrics".* url=(\S+)/metrics`)
	var base string
	waitFor(t, 20*time.Second, func() bool {
		m := urlRE.FindStringSubmatch(r.stderr.String())
		if m != nil {
			base = m[1]
		}
		return m != nil
	}, r.logs)
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
