package export

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/otlptest"
	"github.com/ddp-agent/ddp-agent/internal/leaktest"
	"github.com/ddp-agent/ddp-agent/internal/syncbuf"
)

func TestMain(m *testing.M) {
	before := runtime.NumGoroutine()
	code := m.Run()
	if code == 0 {
		// Every exporter and receiver has been shut down; the OTLP clients'
		// goroutines end within their export timeout.
		if err := leaktest.CheckCount(before, 5*time.Second); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

const (
	job     = "job-1"
	ranks   = 4
	buckets = 3
	steps   = 10
	stalled = 5 // the step rank 2 holds back, in bucket 1
	slow    = 2
	nbytes  = 25 << 20
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func worker(rank int) telemetry.Worker {
	return telemetry.Worker{Rank: rank, LocalRank: rank % 2, Host: fmt.Sprintf("node%d", rank/2), PID: 1000 + rank,
		GPU: fmt.Sprintf("GPU-%04d", rank), GPUIndex: rank % 2}
}

// collective makes the collective of bucket b of step s of generation gen:
// rank r arrives r×100µs after the first, all finish 5 ms after the last
// arrival; in the stalled step rank 2 arrives 80 ms late in bucket 1.
func collective(gen, s uint64, b uint32) telemetry.Collective {
	c := telemetry.Collective{Key: telemetry.Key{Gen: gen, Step: s, Bucket: b}, Bytes: nbytes, DType: 7}
	base := t0.Add(time.Duration(gen)*time.Minute + time.Duration(s)*200*time.Millisecond + time.Duration(b)*20*time.Millisecond)
	var last time.Time
	arrive := make([]time.Time, ranks)
	for r := range ranks {
		arrive[r] = base.Add(time.Duration(r) * 100 * time.Microsecond)
		if s == stalled && b == 1 && r == slow {
			arrive[r] = arrive[r].Add(80 * time.Millisecond)
		}
		if arrive[r].After(last) {
			last = arrive[r]
		}
	}
	for r := range ranks {
		c.Records = append(c.Records, telemetry.Record{Gen: gen, Step: s, Bucket: b, Rank: r, Bytes: nbytes, DType: 7,
			Arrive: arrive[r], Start: arrive[r].Add(10 * time.Microsecond), End: last.Add(5 * time.Millisecond)})
	}
	if s == stalled && b == 1 {
		c.Stall = &telemetry.Stall{Straggler: slow, Late: 80*time.Millisecond - 100*time.Microsecond, Waiters: 3,
			Waited: 3 * 80 * time.Millisecond, Threshold: 20 * time.Millisecond, Median: 5 * time.Millisecond}
	}
	return c
}

// feed sends generation gen's collectives one at a time, as the analyzer
// finishes them.
func feed(e *Exporter, gen uint64) {
	for s := range uint64(steps) {
		for b := range uint32(buckets) {
			e.Collectives([]telemetry.Collective{collective(gen, s, b)})
		}
	}
}

// cleanEnv unsets the OTEL variables the exporter reads.
func cleanEnv(t *testing.T) {
	for _, v := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
		"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
		"OTEL_SDK_DISABLED", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER"} {
		t.Setenv(v, "")
	}
}

func config(endpoint string, ratio float64) Config {
	return Config{JobID: job, NodeRank: 0, Host: "node0", Topology: "4x GPU, NVLink", Version: "0.1.0", Endpoint: endpoint,
		SampleRatio: ratio, StepDelay: time.Minute, Worker: worker, Logger: slog.New(slog.DiscardHandler),
		exportTimeout: 2 * time.Second}
}

func start(t *testing.T, cfg Config) *Exporter {
	t.Helper()
	e, err := New(t.Context(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { e.Shutdown(context.Background()) })
	return e
}

func shutdown(t *testing.T, e *Exporter) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := e.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

func hexID(gen, step uint64) string {
	id := TraceID(job, gen, step)
	return hex.EncodeToString(id[:])
}

// byStep groups spans by step, checking that each step's spans share its
// trace id.
func byStep(t *testing.T, spans []otlptest.Span) map[uint64][]otlptest.Span {
	t.Helper()
	m := map[uint64][]otlptest.Span{}
	for _, s := range spans {
		step, ok := s.Attr("ddp.step").(int64)
		if !ok {
			continue // a restart
		}
		if got, want := s.TraceIDHex(), hexID(0, uint64(step)); got != want {
			t.Errorf("span %q of step %d: trace id %s, want %s", s.Name, step, got, want)
		}
		m[uint64(step)] = append(m[uint64(step)], s)
	}
	return m
}

func named(spans []otlptest.Span, name string) []otlptest.Span {
	var out []otlptest.Span
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func hasEvent(s otlptest.Span, name string) bool {
	return slices.ContainsFunc(s.Events, func(ev *tracepb.Span_Event) bool { return ev.Name == name })
}

func TestOTLPRoundTrip(t *testing.T) {
	for _, ratio := range []float64{0, 0.5, 1} {
		t.Run(fmt.Sprintf("ratio %v", ratio), func(t *testing.T) {
			cleanEnv(t)
			rcv := otlptest.Start(t)
			e := start(t, config(rcv.Addr(), ratio))
			feed(e, 0)
			shutdown(t, e)

			got := byStep(t, rcv.Spans())
			for s := range uint64(steps) {
				kept := s == stalled || sampled(e.traceID(stepKey{0, s}), ratio)
				if exported := len(got[s]) > 0; exported != kept {
					t.Errorf("step %d exported: got %v, want %v", s, exported, kept)
				}
			}
			if ratio == 1 && len(got) != steps {
				t.Errorf("ratio 1: %d steps exported, want %d", len(got), steps)
			}
			for s, spans := range got {
				checkStep(t, s, spans)
			}
			for _, sp := range rcv.Spans() {
				checkResource(t, sp)
			}

			ms, err := rcv.WaitMetrics(t.Context(), func(ms []otlptest.Metric) bool { return len(ms) > 0 })
			if err != nil {
				t.Fatal(err)
			}
			if got := counter(ms, "ddp.collectives"); got != steps*buckets {
				t.Errorf("ddp.collectives over otlp: got %d, want %d", got, steps*buckets)
			}
			if got := counter(ms, "ddp.stalls"); got != 1 {
				t.Errorf("ddp.stalls over otlp: got %d, want 1", got)
			}
		})
	}
}

// counter sums the points of the last metric called name.
func counter(ms []otlptest.Metric, name string) int64 {
	var n int64
	for _, m := range ms {
		if m.Name == name {
			n = 0
			for _, p := range m.GetSum().GetDataPoints() {
				n += p.GetAsInt()
			}
		}
	}
	return n
}

// checkResource checks the resource of span sp: the agent's for the
// step root, its rank's for a span of a rank (allreduce, stall).
func checkResource(t *testing.T, sp otlptest.Span) {
	t.Helper()
	res := sp.Resource
	want := map[string]any{"service.name": "ddp-agent", "ddp.job_id": job, "ddp.node_rank": int64(0), "host.name": "node0",
		"ddp.topology": "4x GPU, NVLink", "service.version": "0.1.0"}
	if rank, ok := sp.Attr("ddp.rank").(int64); ok {
		r := strconv.Itoa(int(rank))
		want["service.name"] = "ddp-agent rank " + r
		want["service.namespace"] = "ddp-agent"
		want["service.instance.id"] = job + "/rank-" + r
		want["ddp.rank"] = rank
		want["host.name"] = worker(int(rank)).Host
	}
	for k, v := range want {
		if res[k] != v {
			t.Errorf("%s span: resource %s: got %v, want %v", sp.Name, k, res[k], v)
		}
	}
}

// ofBucket is the spans of spans with attribute ddp.bucket = b.
func ofBucket(spans []otlptest.Span, b uint32) []otlptest.Span {
	var out []otlptest.Span
	for _, s := range spans {
		if s.Attr("ddp.bucket") == int64(b) {
			out = append(out, s)
		}
	}
	return out
}

// checkStep checks the spans of one step: a root, a child per rank and
// bucket, and for the stalled step a stall span and events.
func checkStep(t *testing.T, step uint64, spans []otlptest.Span) {
	t.Helper()
	roots := named(spans, "step")
	if len(roots) != 1 {
		t.Fatalf("step %d: %d root spans, want 1", step, len(roots))
	}
	root := roots[0]
	if len(root.ParentSpanId) != 0 {
		t.Errorf("step %d: root has a parent", step)
	}
	var end time.Time
	for b := range uint32(buckets) {
		if e := collective(0, step, b).Records[0].End; e.After(end) {
			end = e
		}
	}
	if got, want := root.StartTimeUnixNano, uint64(collective(0, step, 0).Records[0].Arrive.UnixNano()); got != want {
		t.Errorf("step %d: root starts at %d, want %d", step, got, want)
	}
	if got, want := root.EndTimeUnixNano, uint64(end.UnixNano()); got != want {
		t.Errorf("step %d: root ends at %d, want %d", step, got, want)
	}
	ids := map[string]bool{}
	n := 0
	for b := range uint32(buckets) {
		c := collective(0, step, b)
		children := ofBucket(named(spans, "allreduce"), b)
		if len(children) != ranks {
			t.Fatalf("step %d bucket %d: %d spans, want %d", step, b, len(children), ranks)
		}
		fastest := c.Records[ranks-1].End.Sub(c.Records[ranks-1].Start)
		if c.Stall != nil {
			fastest = c.Records[slow].End.Sub(c.Records[slow].Start)
		}
		algbw := float64(nbytes) / fastest.Seconds()
		for _, s := range children {
			n++
			ids[hex.EncodeToString(s.SpanId)] = true
			if !bytes.Equal(s.ParentSpanId, root.SpanId) {
				t.Errorf("step %d: %q not a child of the root", step, s.Name)
			}
			rank := int(s.Attr("ddp.rank").(int64))
			r := c.Records[rank]
			w := worker(rank)
			want := map[string]any{"ddp.local_rank": int64(w.LocalRank), "host.name": w.Host, "gpu.uuid": w.GPU,
				"process.pid": int64(w.PID), "ddp.bucket": int64(b), "ddp.step": int64(step), "ddp.generation": int64(0),
				"ddp.bytes": int64(nbytes), "ddp.dtype": "float32", "ddp.status": "ok"}
			for k, v := range want {
				if got := s.Attr(k); got != v {
					t.Errorf("step %d bucket %d rank %d: %s = %v, want %v", step, b, rank, k, got, v)
				}
			}
			for k, v := range map[string]float64{
				"ddp.allreduce.algbw": algbw,
				"ddp.allreduce.busbw": algbw * 2 * (ranks - 1) / ranks,
				"ddp.wait":            (r.End.Sub(r.Start) - fastest).Seconds(),
			} {
				if got, _ := s.Attr(k).(float64); math.Abs(got-v) > 1e-9*max(1, v) {
					t.Errorf("step %d bucket %d rank %d: %s = %v, want %v", step, b, rank, k, got, v)
				}
			}
			if got, want := s.StartTimeUnixNano, uint64(r.Start.UnixNano()); got != want {
				t.Errorf("rank %d: span starts at %d, want %d", rank, got, want)
			}
			if got, want := hasEvent(s, "stall"), c.Stall != nil && rank == slow; got != want {
				t.Errorf("step %d bucket %d rank %d: stall event %v, want %v", step, b, rank, got, want)
			}
			// The straggler stands out, and the ranks that waited say for whom.
			wantStraggler, wantWaited := any(nil), any(nil)
			if c.Stall != nil && rank == slow {
				wantStraggler = true
			} else if c.Stall != nil {
				wantWaited = int64(slow)
			}
			if got := s.Attr("ddp.straggler"); got != wantStraggler {
				t.Errorf("step %d bucket %d rank %d: ddp.straggler = %v, want %v", step, b, rank, got, wantStraggler)
			}
			if got := s.Attr("ddp.waited_for.rank"); got != wantWaited {
				t.Errorf("step %d bucket %d rank %d: ddp.waited_for.rank = %v, want %v", step, b, rank, got, wantWaited)
			}
			if s.Status.GetCode() == 2 {
				t.Errorf("step %d bucket %d rank %d: status error on a collective that went well", step, b, rank)
			}
		}
	}
	if len(ids) != n {
		t.Errorf("step %d: %d distinct span ids for %d spans", step, len(ids), n)
	}
	stalls := named(spans, "stall")
	if step != stalled {
		if len(stalls) != 0 || hasEvent(root, "stall") {
			t.Errorf("step %d: a stall where there is none", step)
		}
		return
	}
	if len(stalls) != 1 {
		t.Fatalf("step %d: %d stall spans, want 1", step, len(stalls))
	}
	s := stalls[0]
	for k, v := range map[string]any{"ddp.straggler.rank": int64(slow), "host.name": "node1", "gpu.uuid": "GPU-0002",
		"ddp.waiters": int64(3), "ddp.bucket": int64(1)} {
		if got := s.Attr(k); got != v {
			t.Errorf("stall span %s = %v, want %v", k, got, v)
		}
	}
	if got := s.Attr("ddp.stall.waited"); got != 0.24 {
		t.Errorf("stall span ddp.stall.waited = %v, want 0.24", got)
	}
	if got := s.Resource["service.name"]; got != fmt.Sprintf("ddp-agent rank %d", slow) {
		t.Errorf("stall span on %v, want the straggler's resource", got)
	}
	if !hasEvent(root, "stall") {
		t.Errorf("step %d: no stall event on the root", step)
	}
}

func TestReexportSameIDs(t *testing.T) {
	cleanEnv(t)
	var got [2][]string
	for i := range got {
		rcv := otlptest.Start(t)
		cfg := config(rcv.Addr(), 1)
		cfg.NodeRank = i
		e := start(t, cfg)
		feed(e, 0)
		shutdown(t, e)
		for _, s := range rcv.Spans() {
			got[i] = append(got[i], s.TraceIDHex()+"/"+hex.EncodeToString(s.SpanId)+"/"+hex.EncodeToString(s.ParentSpanId))
		}
		slices.Sort(got[i])
	}
	if len(got[0]) != steps*(1+buckets*ranks)+1 {
		t.Errorf("%d spans, want %d", len(got[0]), steps*(1+buckets*ranks)+1)
	}
	if !slices.Equal(got[0], got[1]) {
		t.Errorf("a re-export gave other ids:\n%v\n%v", got[0], got[1])
	}
}

func TestStepRelease(t *testing.T) {
	tests := []struct {
		name  string
		delay time.Duration
		next  bool // a collective of the next step arrives
	}{
		{"next step", time.Hour, true},
		{"delay", 50 * time.Millisecond, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cleanEnv(t)
			rcv := otlptest.Start(t)
			cfg := config(rcv.Addr(), 1)
			cfg.StepDelay = tc.delay
			e := start(t, cfg)
			for b := range uint32(buckets) {
				e.Collectives([]telemetry.Collective{collective(0, 0, b)})
			}
			if tc.next {
				e.Collectives([]telemetry.Collective{collective(0, 1, 0)})
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			spans, err := rcv.WaitSpans(ctx, func(ss []otlptest.Span) bool { return len(byStep(t, ss)[0]) == 1+buckets*ranks })
			if err != nil {
				t.Fatalf("step 0 not exported: %v (%d spans)", err, len(spans))
			}
			if n := len(byStep(t, spans)[1]); n != 0 {
				t.Errorf("step 1 exported before it is complete: %d spans", n)
			}
		})
	}
}

func TestLateCollective(t *testing.T) {
	cleanEnv(t)
	rcv := otlptest.Start(t)
	e := start(t, config(rcv.Addr(), 1))
	e.Collectives([]telemetry.Collective{collective(0, 0, 0), collective(0, 0, 1), collective(0, 1, 0)})
	e.Collectives([]telemetry.Collective{collective(0, 0, 2), collective(0, 1, 1), collective(0, 1, 2)})
	shutdown(t, e)
	steps := byStep(t, rcv.Spans())
	for s := range uint64(2) {
		if got, want := len(steps[s]), 1+buckets*ranks; got != want {
			t.Errorf("step %d: %d spans, want %d", s, got, want)
		}
		if got := len(named(steps[s], "step")); got != 1 {
			t.Errorf("step %d: %d roots, want 1", s, got)
		}
	}
}

func TestHang(t *testing.T) {
	cleanEnv(t)
	rcv := otlptest.Start(t)
	e := start(t, config(rcv.Addr(), 0))
	e.Collectives([]telemetry.Collective{collective(0, 3, 0)})
	since := t0.Add(time.Second)
	stacks := map[int]string{2: "Traceback (most recent call first):\n  File \"train.py\", line 42 in forward"}
	e.Hang(telemetry.Hang{Key: telemetry.Key{Gen: 0, Step: 3, Bucket: 1}, Since: since, Waiting: []int{0, 1, 3}, Missing: []int{2}}, stacks)
	e.Hang(telemetry.Hang{Key: telemetry.Key{Gen: 0, Step: 7, Bucket: 0}, Since: since, Waiting: []int{0, 1, 3}, Missing: []int{2}}, nil)
	shutdown(t, e)

	steps := byStep(t, rcv.Spans())
	if got, want := len(steps[3]), 1+ranks+1; got != want {
		t.Errorf("step 3 (sample ratio 0, hung): %d spans, want %d: the root, bucket 0, the hang", got, want)
	}
	hangs := named(steps[3], "hang")
	if len(hangs) != 1 {
		t.Fatalf("%d hang spans, want 1", len(hangs))
	}
	h := hangs[0]
	if got := fmt.Sprint(h.Attr("ddp.missing_ranks"), h.Attr("ddp.waiting_ranks"), h.Attr("ddp.missing_hosts")); got != "[2] [0 1 3] [node1]" {
		t.Errorf("hang attributes: got %s, want [2] [0 1 3] [node1]", got)
	}
	if h.Status.GetCode() != 2 { // STATUS_CODE_ERROR
		t.Errorf("hang status %v, want error", h.Status)
	}
	if got, want := h.StartTimeUnixNano, uint64(since.UnixNano()); got != want {
		t.Errorf("hang starts at %d, want %d", got, want)
	}
	if len(h.Events) != 1 || h.Events[0].Name != "python stack" {
		t.Fatalf("hang events %v, want one python stack", h.Events)
	}
	ev := otlptest.Attrs(h.Events[0].Attributes)
	if ev["code.stacktrace"] != stacks[2] || ev["ddp.rank"] != int64(2) || ev["host.name"] != "node1" || ev["ddp.missing"] != true {
		t.Errorf("stack event attributes %v", ev)
	}
	// A hang in a step with no finished collective gets a root of its own.
	if got := len(named(steps[7], "step")); got != 1 || len(steps[7]) != 2 {
		t.Errorf("step 7: %d roots in %d spans, want 1 in 2", got, len(steps[7]))
	}
}

func TestRestartSpan(t *testing.T) {
	cleanEnv(t)
	rcv := otlptest.Start(t)
	e := start(t, config(rcv.Addr(), 1))
	e.Fault(3, "worker 2 exited with code 1", true)
	shutdown(t, e)
	spans := named(rcv.Spans(), "restart")
	if len(spans) != 1 || !hasEvent(spans[0], "restart") || spans[0].Attr("ddp.restart.reason") != "worker 2 exited with code 1" ||
		spans[0].Attr("ddp.generation") != int64(3) || spans[0].Resource["service.name"] != "ddp-agent" {
		t.Errorf("restart spans %v", spans)
	}
}

// TestReformSpan: an in-process re-formation is a trace of its own: a
// span from the fault to the end of the resumed step, with one child per
// phase, back to back.
func TestReformSpan(t *testing.T) {
	cleanEnv(t)
	rcv := otlptest.Start(t)
	e := start(t, config(rcv.Addr(), 0)) // whatever the sampling
	e.Reformed(telemetry.Reform{Gen: 2, N: 1, Rank: 3, Step: 12, Resume: 12, Source: 1, Error: "RuntimeError: boom",
		Phases: []telemetry.ReformPhase{{Name: "abort", Took: time.Millisecond}, {Name: "rendezvous", Took: 40 * time.Millisecond}}})
	shutdown(t, e)
	spans := rcv.Spans()
	root := named(spans, "re-formed in process")
	if len(root) != 1 || root[0].Attr("ddp.reform.source") != int64(1) || root[0].Attr("ddp.reform.lost_steps") != int64(1) ||
		root[0].Attr("ddp.generation") != int64(2) || root[0].EndTimeUnixNano-root[0].StartTimeUnixNano != uint64(41*time.Millisecond) {
		t.Fatalf("re-formation spans %v", root)
	}
	abort, rdzv := named(spans, "abort"), named(spans, "rendezvous")
	if len(abort) != 1 || len(rdzv) != 1 || string(abort[0].ParentSpanId) != string(root[0].SpanId) ||
		abort[0].StartTimeUnixNano != root[0].StartTimeUnixNano || abort[0].EndTimeUnixNano != rdzv[0].StartTimeUnixNano ||
		rdzv[0].EndTimeUnixNano != root[0].EndTimeUnixNano {
		t.Errorf("phase spans %v and %v under %v, want back to back", abort, rdzv, root[0])
	}
}

func TestPrometheus(t *testing.T) {
	cleanEnv(t)
	cfg := config("", 1)
	cfg.MetricsAddr = "127.0.0.1:0"
	e := start(t, cfg)
	feed(e, 0)
	e.Hang(telemetry.Hang{Key: telemetry.Key{Step: 10}, Missing: []int{1}}, nil)
	e.Fault(0, "hang", true)

	resp, err := http.Get(e.MetricsURL())
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`ddp_collectives_total{ddp_job_id="job-1",ddp_status="ok"} 30`,
		`ddp_stalls_total{ddp_job_id="job-1",ddp_straggler_rank="2"} 1`,
		`ddp_stalls_total{ddp_job_id="job-1",ddp_straggler_rank="0"} 0`, // at 0 before its first stall
		`ddp_stalls_total{ddp_job_id="job-1",ddp_straggler_rank="3"} 0`,
		`ddp_stall_waited_seconds_total{ddp_job_id="job-1"} 0.24`,
		`ddp_hangs_total{ddp_job_id="job-1"} 1`,
		`ddp_restarts_total{ddp_job_id="job-1"} 1`,
		`ddp_allreduce_duration_seconds_bucket{ddp_bucket="1",ddp_job_id="job-1",le="0.05"} 9`, // the stall is slower
		`ddp_allreduce_duration_seconds_bucket{ddp_bucket="1",ddp_job_id="job-1",le="0.1"} 10`,
		`ddp_allreduce_duration_seconds_count{ddp_bucket="0",ddp_job_id="job-1"} 10`,
		`ddp_allreduce_busbw_bytes_per_second_count{ddp_bucket="2",ddp_job_id="job-1"} 10`,
	} {
		if !bytes.Contains(body, []byte("\n"+want+"\n")) {
			t.Errorf("metrics lack %s:\n%s", want, body)
		}
	}
	if bytes.Contains(body, []byte("\n"+`ddp_stalls_total{ddp_job_id="job-1"} `)) {
		t.Errorf("a ddp_stalls_total series without a rank:\n%s", body)
	}
	if !regexp.MustCompile(`(?m)^target_info{.*ddp_job_id="job-1".*ddp_topology="4x GPU, NVLink"`).Match(body) {
		t.Errorf("metrics lack target_info with the resource:\n%s", body)
	}
	url := e.MetricsURL()
	shutdown(t, e)
	if _, err := http.Get(url); err == nil {
		t.Errorf("the endpoint still answers after Shutdown")
	}
}

func TestPerfettoFile(t *testing.T) {
	cleanEnv(t)
	dir := t.TempDir()
	cfg := config("", 1)
	cfg.TraceDir = dir
	e := start(t, cfg)
	e.Generation(0)
	feed(e, 0)
	e.Hang(telemetry.Hang{Key: telemetry.Key{Step: 10, Bucket: 1}, Since: t0.Add(3 * time.Second), Waiting: []int{0, 1, 3}, Missing: []int{2}},
		map[int]string{2: "File \"train.py\", line 7"})

	// A killed agent leaves the file without its closing bracket, which
	// the format allows: every event is whole.
	raw, err := os.ReadFile(filepath.Join(dir, "trace-gen0.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(raw, []byte("[")) || !bytes.HasSuffix(raw, []byte("}")) {
		t.Errorf("open file: want [ … }, got %.20q … %q", raw, raw[max(0, len(raw)-20):])
	}
	checkEvents(t, "open trace-gen0.json", append(raw, ']'), steps)

	e.Fault(0, "hang", true)
	e.Generation(1)
	e.Collectives([]telemetry.Collective{collective(1, 0, 0)})
	shutdown(t, e)
	for gen, steps := range []int{steps, 0} {
		raw, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("trace-gen%d.json", gen)))
		if err != nil {
			t.Fatal(err)
		}
		evs := checkEvents(t, fmt.Sprintf("trace-gen%d.json", gen), raw, steps)
		if gen == 1 && count(evs, "X", "allreduce bucket 0") != ranks {
			t.Errorf("trace-gen1.json: want the %d events of generation 1", ranks)
		}
		if gen == 0 && count(evs, "i", "restart") != 1 {
			t.Errorf("trace-gen0.json: no restart event")
		}
	}
}

// checkEvents parses a trace file and checks its events for a generation
// of the given number of steps.
func checkEvents(t *testing.T, name string, raw []byte, steps int) []map[string]any {
	t.Helper()
	var evs []map[string]any
	if err := json.Unmarshal(raw, &evs); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if steps == 0 {
		return evs
	}
	for b := range buckets {
		if got, want := count(evs, "X", fmt.Sprintf("allreduce bucket %d", b)), steps*ranks; got != want {
			t.Errorf("%s: %d X events of bucket %d, want %d", name, got, b, want)
		}
	}
	if got := count(evs, "X", "step 5"); got != 1 {
		t.Errorf("%s: %d step 5 events, want 1", name, got)
	}
	if got := count(evs, "i", "stall"); got != 1 {
		t.Errorf("%s: %d stall events, want 1", name, got)
	}
	if got := count(evs, "i", "hang: rank 2 missing"); got != 1 {
		t.Errorf("%s: %d hang events, want 1", name, got)
	}
	threads := map[string]bool{}
	hosts := map[string]bool{}
	for _, ev := range evs {
		switch ev["name"] {
		case "thread_name":
			threads[ev["args"].(map[string]any)["name"].(string)] = true
		case "process_name":
			hosts[ev["args"].(map[string]any)["name"].(string)] = true
		case "allreduce bucket 1":
			args := ev["args"].(map[string]any)
			if ev["tid"] != args["rank"] || ev["ph"] != "X" || ev["dur"].(float64) <= 0 {
				t.Errorf("%s: event %v", name, ev)
			}
		}
	}
	if !threads["rank 2 (GPU GPU-0002)"] || !hosts["node1"] || !hosts["job job-1 generation 0"] {
		t.Errorf("%s: metadata: threads %v, processes %v", name, threads, hosts)
	}
	return evs
}

func count(evs []map[string]any, ph, name string) int {
	n := 0
	for _, ev := range evs {
		if ev["ph"] == ph && ev["name"] == name {
			n++
		}
	}
	return n
}

// TestUnreachableEndpoint: a collector that refuses, or accepts and never
// answers, costs a logged warning and a bounded Shutdown, never a hang.
func TestUnreachableEndpoint(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := closed.Addr().String()
	closed.Close()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan struct{})
	defer func() { silent.Close(); <-accepted }()
	go func() {
		defer close(accepted)
		var conns []net.Conn
		for {
			c, err := silent.Accept()
			if err != nil {
				for _, c := range conns {
					c.Close()
				}
				return
			}
			conns = append(conns, c)
		}
	}()

	for _, tc := range []struct{ name, addr string }{{"refused", refused}, {"silent", silent.Addr().String()}} {
		t.Run(tc.name, func(t *testing.T) {
			cleanEnv(t)
			var log syncbuf.Buffer
			cfg := config(tc.addr, 1)
			cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
			cfg.exportTimeout = 500 * time.Millisecond
			e, err := New(t.Context(), cfg)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			feed(e, 0)
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()
			begin := time.Now()
			e.Shutdown(ctx)
			if took := time.Since(begin); took > 4*time.Second {
				t.Errorf("Shutdown took %v", took)
			}
			if !strings.Contains(log.String(), "otlp export failed") {
				t.Errorf("no warning logged:\n%s", log.String())
			}
		})
	}
}

func TestBandwidth(t *testing.T) {
	c := telemetry.Collective{Bytes: 1e9} // bytes per second
	for r := range 8 {
		d := time.Second + time.Duration(r)*time.Millisecond
		c.Records = append(c.Records, telemetry.Record{Rank: r, Start: t0, End: t0.Add(d)})
	}
	bw := bandwidthOf(c)
	if bw.fastest != time.Second || bw.algbw != 1e9 || bw.busbw != 1.75e9 {
		t.Errorf("got %+v, want 1s, algbw 1e9, busbw 1.75e9", bw)
	}
}
