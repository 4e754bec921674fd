package observability

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// contractMetrics are the Prometheus names of ddp-agent's metrics
// (docs/stalls-and-traces.md#metrics) and their types: the dashboard, the
// alerts and the test name no others.
var contractMetrics = map[string]string{
	"ddp_allreduce_duration_seconds":       "histogram",
	"ddp_allreduce_busbw_bytes_per_second": "histogram",
	"ddp_collectives_total":                "counter",
	"ddp_stalls_total":                     "counter",
	"ddp_stall_waited_seconds_total":       "counter",
	"ddp_hangs_total":                      "counter",
	"ddp_restarts_total":                   "counter",
	"ddp_stragglers":                       "gauge",
	"ddp_reforms_total":                    "counter",
	"ddp_reform_duration_seconds":          "histogram",
	"ddp_steps_total":                      "counter",
}

// contractLabels are the labels of those metrics that start with ddp_.
var contractLabels = map[string]bool{
	"ddp_bucket": true, "ddp_status": true, "ddp_straggler_rank": true, "ddp_rank": true, "ddp_cause": true,
	"ddp_job_id": true, "ddp_node_rank": true,
}

var ddpIdent = regexp.MustCompile(`\bddp_[a-z0-9_]+\b`)

// metricsIn returns the contract metrics expr names (a histogram's
// _bucket, _sum and _count as the histogram) and the ddp_ names in it
// that are neither metrics nor labels of the contract.
func metricsIn(expr string) (metrics, unknown []string) {
	for _, id := range ddpIdent.FindAllString(expr, -1) {
		if contractLabels[id] {
			continue
		}
		if _, ok := contractMetrics[id]; ok {
			metrics = append(metrics, id)
			continue
		}
		base := id
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			base = strings.TrimSuffix(base, suf)
		}
		if contractMetrics[base] == "histogram" && base != id {
			metrics = append(metrics, base)
			continue
		}
		unknown = append(unknown, id)
	}
	return metrics, unknown
}

// dashboardExprs returns every PromQL expression in the dashboard: the
// panels' targets and the variables' queries.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	if dash["uid"] == "" || dash["title"] == "" {
		t.Errorf("dashboard without uid or title")
	}
	var exprs []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "expr" || k == "definition") {
					exprs = append(exprs, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(dash)
	return exprs
}

// TestDashboardAndAlertsNameTheContract needs no tools: every PromQL
// expression of the dashboard names contract metrics and labels only, and
// together they show every metric; the alerts name contract metrics only
// and cover stalls, stragglers, hangs and restarts.
func TestDashboardAndAlertsNameTheContract(t *testing.T) {
	exprs := dashboardExprs(t)
	if len(exprs) < 10 {
		t.Fatalf("%d expressions in the dashboard, want its panels' (at least 10)", len(exprs))
	}
	shown := map[string]bool{}
	for _, e := range exprs {
		ms, unknown := metricsIn(e)
		if len(ms) == 0 {
			t.Errorf("dashboard expression names no ddp-agent metric: %s", e)
		}
		if len(unknown) > 0 {
			t.Errorf("dashboard expression names %v, not in the contract: %s", unknown, e)
		}
		for _, m := range ms {
			shown[m] = true
		}
	}
	for m := range contractMetrics {
		if !shown[m] {
			t.Errorf("the dashboard does not show %s", m)
		}
	}

	b, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	ms, unknown := metricsIn(string(b))
	if len(unknown) > 0 {
		t.Errorf("alerts.yml names %v, not in the contract", unknown)
	}
	alerted := map[string]bool{}
	for _, m := range ms {
		alerted[m] = true
	}
	for _, m := range []string{"ddp_stalls_total", "ddp_stragglers", "ddp_hangs_total", "ddp_restarts_total"} {
		if !alerted[m] {
			t.Errorf("no alert on %s", m)
		}
	}
	// Counters are read with increase() or rate(), never by value.
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "_total") && strings.Contains(line, "expr") {
			t.Errorf("put the expression on its own lines: %s", line)
		}
	}
	for _, m := range regexp.MustCompile(`(?m)^\s+(sum|max)[^\n]*$`).FindAllString(string(b), -1) {
		if strings.Contains(m, "_total") && !strings.Contains(m, "increase(") && !strings.Contains(m, "rate(") {
			t.Errorf("a counter read by its value: %s", strings.TrimSpace(m))
		}
	}
}

// tools are the real programs the deploy tests run.
type tools struct {
	promtool, prometheus, jaeger string
}

// needTools skips the test unless DDP_AGENT_DEPLOY_TESTS=1; then a missing
// tool fails it.
func needTools(t *testing.T) tools {
	t.Helper()
	if os.Getenv("DDP_AGENT_DEPLOY_TESTS") != "1" {
		t.Skip("DDP_AGENT_DEPLOY_TESTS=1 runs the deploy tests (deploy/observability/testdeps.sh installs their tools)")
	}
	var tl tools
	var missing []string
	for _, x := range []struct {
		name string
		dst  *string
	}{{"promtool", &tl.promtool}, {"prometheus", &tl.prometheus}} {
		p, err := exec.LookPath(x.name)
		if err != nil {
			missing = append(missing, x.name)
		}
		*x.dst = p
	}
	tl.jaeger = os.Getenv("DDP_AGENT_JAEGER")
	if tl.jaeger == "" {
		tl.jaeger, _ = filepath.Abs(filepath.Join("..", "..", ".cache", "deploy", "jaeger"))
	}
	if _, err := os.Stat(tl.jaeger); err != nil {
		missing = append(missing, tl.jaeger)
	}
	if len(missing) > 0 {
		t.Fatalf("missing %s: run deploy/observability/testdeps.sh", strings.Join(missing, ", "))
	}
	return tl
}

// TestConfigsLoadInTheirTools: promtool accepts prometheus.yml and
// alerts.yml, and Jaeger's collector build validates otel-collector.yaml
// and jaeger.yaml.
func TestConfigsLoadInTheirTools(t *testing.T) {
	tl := needTools(t)
	for _, c := range []struct {
		name string
		argv []string
	}{
		{"promtool check config", []string{tl.promtool, "check", "config", "prometheus.yml"}},
		{"promtool check rules", []string{tl.promtool, "check", "rules", "alerts.yml"}},
		{"jaeger validate otel-collector.yaml", []string{tl.jaeger, "validate", "--config", "otel-collector.yaml"}},
		{"jaeger validate jaeger.yaml", []string{tl.jaeger, "validate", "--config", "jaeger.yaml"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, c.argv[0], c.argv[1:]...).CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v\n%s", strings.Join(c.argv, " "), err, out)
			}
			t.Logf("%s:\n%s", strings.Join(c.argv, " "), out)
		})
	}
}

// deployment is the test's stack: Jaeger, the collector (Jaeger's binary
// running otel-collector.yaml), Prometheus running prometheus.yml and
// alerts.yml, on free ports.
type deployment struct {
	jaeger  jaegerAPI
	prom    promAPI
	otlp    string // the collector's OTLP/HTTP endpoint, http://host:port
	metrics string // the agent's --metrics-addr
}

func startDeployment(ctx context.Context, t *testing.T, tl tools) deployment {
	t.Helper()
	here, _ := os.Getwd()
	p := freePorts(t, 13)
	addr := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", p[i]) }
	d := deployment{
		jaeger:  jaegerAPI{base: "http://" + addr(2)},
		prom:    promAPI{base: "http://" + addr(11)},
		otlp:    "http://" + addr(6),
		metrics: addr(12),
	}

	jaeger := start(t, "jaeger", t.TempDir(), cleanEnv(
		"JAEGER_OTLP_GRPC_ENDPOINT="+addr(0), "JAEGER_OTLP_HTTP_ENDPOINT="+addr(1),
		"JAEGER_QUERY_HTTP_ENDPOINT="+addr(2), "JAEGER_QUERY_GRPC_ENDPOINT="+addr(3),
		"JAEGER_HEALTH_ENDPOINT="+addr(4), "JAEGER_LOG_LEVEL=warn"),
		tl.jaeger, "--config", filepath.Join(here, "jaeger.yaml"))
	collector := start(t, "otel-collector", t.TempDir(), cleanEnv(
		"OTLP_GRPC_ENDPOINT="+addr(5), "OTLP_HTTP_ENDPOINT="+addr(6),
		"JAEGER_OTLP_ENDPOINT="+addr(0), "PROMETHEUS_EXPORTER_ENDPOINT="+addr(7),
		"HEALTH_CHECK_ENDPOINT="+addr(8), "COLLECTOR_TELEMETRY_HOST=127.0.0.1",
		fmt.Sprintf("COLLECTOR_TELEMETRY_PORT=%d", p[9])),
		tl.jaeger, "--config", filepath.Join(here, "otel-collector.yaml"))

	// prometheus.yml as shipped, with 1 s intervals; the targets are this
	// test's, labelled with the path the metrics took.
	dir := t.TempDir()
	b, err := os.ReadFile("prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(b)
	for _, r := range [][2]string{{"interval: 15s", "interval: 1s"}, {"refresh_interval: 30s", "refresh_interval: 1s"}} {
		if !strings.Contains(cfg, r[0]) {
			t.Fatalf("prometheus.yml has no %q to shorten for the test", r[0])
		}
		cfg = strings.ReplaceAll(cfg, r[0], r[1])
	}
	rules, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"prometheus.yml":                cfg,
		"alerts.yml":                    string(rules),
		"targets/ddp-agent-test.yml":    fmt.Sprintf("- targets: [%q]\n  labels: {path: direct}\n", d.metrics),
		"targets/otel-collector-1.yml":  fmt.Sprintf("- targets: [%q]\n  labels: {path: collector}\n", addr(7)),
		"targets/otel-collector-2.json": "[]", // not matched: *.yml only
	}
	for name, text := range files {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	prom := start(t, "prometheus", dir, cleanEnv(), tl.prometheus,
		"--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr(11), "--log.level=warn")

	waitReady(ctx, t, jaeger, d.jaeger.base+"/api/services")
	waitReady(ctx, t, collector, "http://"+addr(8)+"/")
	waitReady(ctx, t, prom, d.prom.base+"/-/ready")
	return d
}

// agentJob starts bin/ddp-agent with 2 ranks of examples/train.py, rank 1
// a second late in steps 14-16 (hook steps 13-15), every step traced, its
// spans and metrics over OTLP/HTTP to the collector from the OTEL_*
// variables alone, and its Prometheus endpoint at d.metrics.
func agentJob(t *testing.T, d deployment, job string) *proc {
	t.Helper()
	root, _ := filepath.Abs(filepath.Join("..", ".."))
	bin := os.Getenv("DDP_AGENT_BIN")
	if bin == "" {
		bin = filepath.Join(root, "bin", "ddp-agent")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%v: run make build, or set DDP_AGENT_BIN", err)
	}
	python := os.Getenv("DDP_AGENT_PYTHON")
	if python == "" {
		python = "/usr/bin/python3"
	}
	if out, err := exec.Command(python, "-c", "import torch").CombinedOutput(); err != nil {
		t.Fatalf("%s has no torch (%v: %s): scripts/deps.sh installs Debian's, or set DDP_AGENT_PYTHON", python, err, out)
	}
	ckpt := t.TempDir()
	t.Cleanup(func() { // runs after the agent's own cleanup
		if left := leftovers(ckpt); len(left) > 0 {
			t.Errorf("processes left after the test:\n%s", strings.Join(left, "\n"))
		}
	})
	env := cleanEnv(
		"OTEL_EXPORTER_OTLP_ENDPOINT="+d.otlp, // http/protobuf, the specification's default
		"OTEL_METRIC_EXPORT_INTERVAL=1000",
	)
	return start(t, "ddp-agent", root, env, bin, "run", "--standalone", "--nproc-per-node", "2",
		"--rdzv-id", job, "--trace-sample", "1", "--metrics-addr", d.metrics, "--python", python,
		filepath.Join(root, "examples", "train.py"), "--cpu", "--steps", "30", "--ckpt-every", "0",
		"--log-every", "10", "--ckpt-dir", ckpt, "--batch-size", "4",
		"--slow-rank", "1", "--slow-steps", "14,15,16", "--slow-seconds", "1")
}

// TestJobInJaegerAndPrometheus runs a 2-rank DDP job with a straggler
// under ddp-agent against the real Jaeger, OpenTelemetry Collector (Jaeger's
// build of it) and Prometheus, configured by this directory's files, and
// reads back what a person would see: Jaeger's query API (what its UI
// draws) and Prometheus's HTTP API (what the dashboard and alerts query).
func TestJobInJaegerAndPrometheus(t *testing.T) {
	tl := needTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), 170*time.Second)
	defer cancel()
	began := time.Now()
	d := startDeployment(ctx, t, tl)
	t.Logf("jaeger, collector and prometheus ready in %v", time.Since(began).Round(time.Millisecond))

	job := fmt.Sprintf("obs-%d", os.Getpid())
	agent := agentJob(t, d, job)
	scrape := watchJob(ctx, t, d, agent)
	t.Logf("job done in %v", time.Since(began).Round(time.Millisecond))

	t.Run("promtool check metrics", func(t *testing.T) { checkMetrics(t, tl, scrape) })
	t.Run("prometheus", func(t *testing.T) { checkPrometheus(ctx, t, d) })
	t.Run("dashboard queries", func(t *testing.T) { checkDashboardQueries(ctx, t, d) })
	t.Run("alert rules", func(t *testing.T) { checkRules(ctx, t, d) })
	t.Run("jaeger", func(t *testing.T) { checkJaeger(ctx, t, d, job) })
	t.Logf("all done in %v", time.Since(began).Round(time.Millisecond))
}

// watchJob waits for the agent to exit 0, scraping its /metrics meanwhile;
// it returns the last scrape that had rank 1's stalls in it.
func watchJob(ctx context.Context, t *testing.T, d deployment, agent *proc) string {
	t.Helper()
	var scrape string
	for !agent.exited() {
		if code, b, err := httpGet(ctx, "http://"+d.metrics+"/metrics"); err == nil && code == 200 &&
			strings.Contains(string(b), `ddp_straggler_rank="1"`) {
			scrape = string(b)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the job did not finish: %v\n%s", ctx.Err(), agent.tail(6000))
		case <-agent.done:
		case <-time.After(300 * time.Millisecond):
		}
	}
	if agent.err != nil {
		t.Fatalf("ddp-agent: %v\n%s", agent.err, agent.tail(6000))
	}
	for _, line := range strings.Split(agent.out.String(), "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "export") {
			t.Errorf("the agent warned: %s", line)
		}
	}
	if scrape == "" {
		t.Fatalf("no scrape of %s/metrics with rank 1's stalls while the job ran\n%s", d.metrics, agent.tail(6000))
	}
	return scrape
}

// checkMetrics runs promtool check metrics (Prometheus's naming rules) on a
// scrape of the agent's endpoint.
func checkMetrics(t *testing.T, tl tools, scrape string) {
	cmd := exec.Command(tl.promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(scrape)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
	for name, typ := range contractMetrics {
		// The straggler gauge only once a straggler is named, the
		// re-formations' histogram once a job re-formed in process.
		if !strings.Contains(scrape, "# TYPE "+name+" "+typ) && name != "ddp_stragglers" && name != "ddp_reform_duration_seconds" {
			t.Errorf("the scrape has no %s %s", typ, name)
		}
	}
}

// waitQuery polls expr until ok accepts its answer or 20 s pass.
func waitQuery(ctx context.Context, t *testing.T, p promAPI, expr string, ok func([]promSample) bool) []promSample {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		v, err := p.query(ctx, expr)
		if err == nil && ok(v) {
			return v
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Errorf("%s: %v %v", expr, v, err)
			return v
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// checkPrometheus: PromQL finds rank 1's three stalls (at least: a loaded
// machine makes some of its own), scraped from the agent and through the
// collector, and the job's 30 steps through the collector, to which the
// agent pushes its last metrics as it ends. Scraped, the steps are there
// but not all of them: the endpoint lingers for one scrape after the end,
// and this test's own scrapes (watchJob) may be that one.
func checkPrometheus(ctx context.Context, t *testing.T, d deployment) {
	for _, path := range []string{"direct", "collector"} {
		steps := fmt.Sprintf(`max_over_time(ddp_steps_total{path=%q}[5m])`, path)
		v := waitQuery(ctx, t, d.prom, steps, func(v []promSample) bool {
			if len(v) != 1 {
				return false
			}
			n, err := strconv.Atoi(v[0].value())
			return err == nil && (n == 30 || path == "direct" && n > 0 && n <= 30)
		})
		t.Logf("%s: %v", steps, v)
	}
	for _, path := range []string{"direct", "collector"} {
		expr := fmt.Sprintf(`sum by (ddp_straggler_rank) (max_over_time(ddp_stalls_total{path=%q}[5m]))`, path)
		v := waitQuery(ctx, t, d.prom, expr, func(v []promSample) bool {
			for _, s := range v {
				if n, err := strconv.ParseFloat(s.value(), 64); err == nil && n >= 3 && s.Metric["ddp_straggler_rank"] == "1" {
					return true
				}
			}
			return false
		})
		t.Logf("%s: %v", expr, v)
	}
}

// checkDashboardQueries evaluates every expression of the dashboard in
// Prometheus (Grafana's variables replaced); all but the persistent
// straggler table (empty unless one is named) and the re-formations'
// times (empty unless the job re-formed in process) must answer with data.
func checkDashboardQueries(ctx context.Context, t *testing.T, d deployment) {
	r := strings.NewReplacer("$job", ".*", "$__rate_interval", "1m", "$__range", "5m")
	for _, e := range dashboardExprs(t) {
		if strings.HasPrefix(e, "label_values(") {
			continue // a Grafana function, not PromQL
		}
		q := r.Replace(e)
		v, err := d.prom.query(ctx, q)
		switch {
		case err != nil:
			t.Errorf("%v", err)
		case len(v) == 0 && !strings.Contains(q, "ddp_stragglers") && !strings.Contains(q, "ddp_reform_duration_seconds"):
			t.Errorf("no data: %s", q)
		default:
			t.Logf("%d series: %s", len(v), q)
		}
	}
}

// checkRules: every rule of alerts.yml evaluated in Prometheus without
// error; no hang, restart or failed collective alert for this job, which
// had none.
func checkRules(ctx context.Context, t *testing.T, d deployment) {
	rs, err := d.prom.rules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) < 7 {
		t.Errorf("%d rules loaded, want alerts.yml's 7", len(rs))
	}
	for _, r := range rs {
		if r.Health != "ok" {
			t.Errorf("rule %s: health %q, %s", r.Name, r.Health, r.LastError)
		}
		switch r.Name {
		case "DDPHang", "DDPRestarted", "DDPRestartLoop", "DDPCollectiveErrors":
			if r.State != "inactive" {
				t.Errorf("alert %s is %s in a job without one", r.Name, r.State)
			}
		}
		t.Logf("alert %s: %s %v", r.Name, r.State, r.Alerts)
	}
}

// TestMetricTablesAreTheContract: the metric tables of
// docs/stalls-and-traces.md and of this directory's README list the
// contract's metrics, no more and no fewer (the README with their types);
// TestJobInJaegerAndPrometheus checks the contract against a real scrape.
func TestMetricTablesAreTheContract(t *testing.T) {
	row := regexp.MustCompile("(?m)^\\| `(ddp_[a-z0-9_]+)` \\| ([^|]+) \\|")
	for _, doc := range []string{"../../docs/stalls-and-traces.md", "README.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		listed := map[string]bool{}
		for _, m := range row.FindAllStringSubmatch(string(b), -1) {
			name, second := m[1], strings.TrimSpace(m[2])
			listed[name] = true
			want, ok := contractMetrics[name]
			switch {
			case !ok:
				t.Errorf("%s lists %s, which is not a metric of the contract", doc, name)
			case doc == "README.md" && !strings.HasPrefix(second, want):
				t.Errorf("%s gives %s the type %q; it is a %s", doc, name, second, want)
			}
		}
		for name := range contractMetrics {
			if !listed[name] {
				t.Errorf("%s's metric table does not list %s", doc, name)
			}
		}
	}
}
