package observability

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// jaegerAPI is Jaeger's query API (the HTTP JSON API its UI reads) at base,
// e.g. http://127.0.0.1:16686.
type jaegerAPI struct{ base string }

// jaegerTrace is one trace as /api/traces returns it.
type jaegerTrace struct {
	TraceID   string                   `json:"traceID"`
	Spans     []jaegerSpan             `json:"spans"`
	Processes map[string]jaegerProcess `json:"processes"`
}

type jaegerSpan struct {
	TraceID       string      `json:"traceID"`
	SpanID        string      `json:"spanID"`
	OperationName string      `json:"operationName"`
	References    []jaegerRef `json:"references"`
	StartTime     int64       `json:"startTime"` // µs since the epoch
	Duration      int64       `json:"duration"`  // µs
	Tags          []jaegerTag `json:"tags"`
	ProcessID     string      `json:"processID"`
}

type jaegerRef struct {
	RefType string `json:"refType"`
	TraceID string `json:"traceID"`
	SpanID  string `json:"spanID"`
}

type jaegerTag struct {
	Key   string `json:"key"`
	Type  string `json:"type"`
	Value any    `json:"value"`
}

type jaegerProcess struct {
	ServiceName string      `json:"serviceName"`
	Tags        []jaegerTag `json:"tags"`
}

func tag(tags []jaegerTag, key string) (any, bool) {
	for _, t := range tags {
		if t.Key == key {
			return t.Value, true
		}
	}
	return nil, false
}

// intTag is tag key as an integer (Jaeger's JSON has int64 tags as
// numbers); ok is false when it is missing or not a number.
func intTag(tags []jaegerTag, key string) (int64, bool) {
	v, ok := tag(tags, key)
	if !ok {
		return 0, false
	}
	switch v := v.(type) {
	case float64:
		return int64(v), true
	case string:
		n, err := strconv.ParseInt(v, 10, 64)
		return n, err == nil
	}
	return 0, false
}

// get GETs path (with query) and decodes the "data" member of the answer.
func (j jaegerAPI) get(ctx context.Context, path string, data any) error {
	code, body, err := httpGet(ctx, j.base+path)
	if err != nil {
		return fmt.Errorf("jaeger %s: %w", path, err)
	}
	if code != http.StatusOK {
		return fmt.Errorf("jaeger %s: %d %.300s", path, code, body)
	}
	var resp struct {
		Data   json.RawMessage `json:"data"`
		Errors []any           `json:"errors"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return fmt.Errorf("jaeger %s: %w", path, err)
	}
	if len(resp.Errors) > 0 {
		return fmt.Errorf("jaeger %s: errors %v", path, resp.Errors)
	}
	if err := json.Unmarshal(resp.Data, data); err != nil {
		return fmt.Errorf("jaeger %s data: %w", path, err)
	}
	return nil
}

func (j jaegerAPI) services(ctx context.Context) ([]string, error) {
	var s []string
	err := j.get(ctx, "/api/services", &s)
	return s, err
}

func (j jaegerAPI) operations(ctx context.Context, service string) ([]string, error) {
	var s []string
	err := j.get(ctx, "/api/services/"+url.PathEscape(service)+"/operations", &s)
	return s, err
}

// traces finds up to limit traces of the last hour with a span of service
// (and operation, unless ""), each whole.
func (j jaegerAPI) traces(ctx context.Context, service, operation string, limit int) ([]jaegerTrace, error) {
	q := url.Values{}
	q.Set("service", service)
	if operation != "" {
		q.Set("operation", operation)
	}
	now := time.Now()
	q.Set("start", strconv.FormatInt(now.Add(-time.Hour).UnixMicro(), 10))
	q.Set("end", strconv.FormatInt(now.Add(time.Minute).UnixMicro(), 10))
	q.Set("limit", strconv.Itoa(limit))
	var ts []jaegerTrace
	err := j.get(ctx, "/api/traces?"+q.Encode(), &ts)
	return ts, err
}

// checkJaeger reads the traces back from Jaeger: one trace per step, each
// with the step span on service "ddp-agent" and every rank's "allreduce"
// spans on "ddp-agent rank R"; a "stall" span on rank 1's service in the
// straggler's steps; short, fixed operation lists.
func checkJaeger(ctx context.Context, t *testing.T, d deployment, job string) {
	const ranks = 2
	wantServices := []string{"ddp-agent"}
	for r := range ranks {
		wantServices = append(wantServices, fmt.Sprintf("ddp-agent rank %d", r))
	}
	var services []string
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		services, err = d.jaeger.services(ctx)
		if err == nil && subset(wantServices, services) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Jaeger's services %v (%v), want %v", services, err, wantServices)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("services: %q", services)

	wantOps := map[string][]string{"ddp-agent": {"step"}, "ddp-agent rank 0": {"allreduce"}, "ddp-agent rank 1": {"allreduce", "stall"}}
	// Jaeger lists a service once its first span is in, and its operations
	// as their spans arrive: the collector may still be delivering.
	deadline = time.Now().Add(20 * time.Second)
	for _, svc := range wantServices {
		var ops []string
		for {
			var err error
			ops, err = d.jaeger.operations(ctx, svc)
			if err != nil {
				t.Fatal(err)
			}
			if subset(wantOps[svc], ops) || time.Now().After(deadline) {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		t.Logf("operations of %q: %q", svc, ops)
		if !subset(wantOps[svc], ops) {
			t.Errorf("operations of %q: %q, want %q among them", svc, ops, wantOps[svc])
		}
		// Bounded: names without step or rank numbers, a handful per service.
		if len(ops) > 6 {
			t.Errorf("%d operations on %q, want a handful: %q", len(ops), svc, ops)
		}
		for _, op := range ops {
			if strings.ContainsAny(op, "0123456789") {
				t.Errorf("operation %q of %q has a number in its name (unbounded)", op, svc)
			}
		}
	}

	// The agent flushes its last spans at exit; the collector and Jaeger
	// batch them for a second or two more.
	var traces []jaegerTrace
	deadline = time.Now().Add(20 * time.Second)
	for {
		var err error
		traces, err = d.jaeger.traces(ctx, "ddp-agent", "step", 1000)
		if err != nil {
			t.Fatal(err)
		}
		if whole(traces, job, ranks, 30) || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	byStep := map[int64][]string{}
	stalled := map[int64]bool{}
	for _, tr := range traces {
		step, problems := checkTrace(tr, job, ranks)
		for _, p := range problems {
			t.Errorf("trace %s (step %d): %s", tr.TraceID, step, p)
		}
		byStep[step] = append(byStep[step], tr.TraceID)
		if straggled(tr, 1) {
			stalled[step] = true
		}
	}
	var steps []int64
	for s, ids := range byStep {
		steps = append(steps, s)
		if len(ids) != 1 {
			t.Errorf("step %d in %d traces %v, want one", s, len(ids), ids)
		}
	}
	sort.Slice(steps, func(i, j int) bool { return steps[i] < steps[j] })
	t.Logf("%d traces, steps %v; rank 1's stall spans in steps %v", len(traces), steps, keys(stalled))
	// train.py's 30 steps are the hook's 0-29, every one traced
	// (--trace-sample 1).
	for s := int64(0); s < 30; s++ {
		if len(byStep[s]) == 0 {
			t.Errorf("no trace of step %d", s)
		}
	}
	for _, s := range []int64{13, 14, 15} {
		if !stalled[s] {
			t.Errorf("step %d: no \"stall\" span naming rank 1 on its service with its allreduce span marked ddp.straggler", s)
		}
	}
}

// whole reports whether traces hold steps 0..steps-1, each complete.
func whole(traces []jaegerTrace, job string, ranks, steps int) bool {
	seen := map[int64]bool{}
	for _, tr := range traces {
		step, problems := checkTrace(tr, job, ranks)
		if len(problems) > 0 {
			return false
		}
		seen[step] = true
	}
	return len(seen) >= steps
}

// checkTrace checks one step's trace; it returns the step and what is wrong.
func checkTrace(tr jaegerTrace, job string, ranks int) (step int64, problems []string) {
	step = -1
	var root *jaegerSpan
	perRank := map[int64]int{}
	for i, sp := range tr.Spans {
		proc := tr.Processes[sp.ProcessID]
		switch sp.OperationName {
		case "step":
			if root != nil {
				problems = append(problems, "two step spans")
			}
			root = &tr.Spans[i]
			if proc.ServiceName != "ddp-agent" {
				problems = append(problems, fmt.Sprintf("step span on service %q, want ddp-agent", proc.ServiceName))
			}
			var ok bool
			if step, ok = intTag(sp.Tags, "ddp.step"); !ok {
				problems = append(problems, "step span without ddp.step")
			}
			if _, ok := intTag(sp.Tags, "ddp.generation"); !ok {
				problems = append(problems, "step span without ddp.generation")
			}
			// The run, for a search that keeps to one (a single node names its own).
			if run, _ := tag(sp.Tags, "ddp.run"); run == nil || run == "" {
				problems = append(problems, "step span without ddp.run")
			}
		case "allreduce":
			r, ok := intTag(sp.Tags, "ddp.rank")
			if !ok {
				problems = append(problems, "allreduce span without ddp.rank")
				continue
			}
			perRank[r]++
			if want := fmt.Sprintf("ddp-agent rank %d", r); proc.ServiceName != want {
				problems = append(problems, fmt.Sprintf("rank %d's allreduce span on service %q, want %q", r, proc.ServiceName, want))
			}
			if v, _ := tag(proc.Tags, "service.namespace"); v != "ddp-agent" {
				problems = append(problems, fmt.Sprintf("rank %d's service.namespace %v, want ddp-agent", r, v))
			}
			if v, want := fmt.Sprint(tagOr(proc.Tags, "service.instance.id")), fmt.Sprintf("%s/rank-%d", job, r); v != want {
				problems = append(problems, fmt.Sprintf("rank %d's service.instance.id %s, want %s", r, v, want))
			}
		}
	}
	if root == nil {
		return step, append(problems, "no step span")
	}
	for r := range int64(ranks) {
		if perRank[r] == 0 {
			problems = append(problems, fmt.Sprintf("no allreduce span of rank %d", r))
		}
	}
	for _, sp := range tr.Spans {
		if sp.OperationName != "allreduce" {
			continue
		}
		if len(sp.References) == 0 || sp.References[0].SpanID != root.SpanID {
			problems = append(problems, fmt.Sprintf("allreduce span %s is not a child of the step span", sp.SpanID))
		}
	}
	return step, problems
}

// straggled reports whether tr has a "stall" span on rank's service naming
// rank (ddp.straggler.rank) and rank's allreduce span marked ddp.straggler.
func straggled(tr jaegerTrace, rank int64) bool {
	svc := fmt.Sprintf("ddp-agent rank %d", rank)
	var stall, marked bool
	for _, sp := range tr.Spans {
		if tr.Processes[sp.ProcessID].ServiceName != svc {
			continue
		}
		switch sp.OperationName {
		case "stall":
			if r, ok := intTag(sp.Tags, "ddp.straggler.rank"); ok && r == rank {
				stall = true
			}
		case "allreduce":
			if v, _ := tag(sp.Tags, "ddp.straggler"); v == true {
				marked = true
			}
		}
	}
	return stall && marked
}

func tagOr(tags []jaegerTag, key string) any {
	v, _ := tag(tags, key)
	return v
}

func subset(want, have []string) bool {
	set := map[string]bool{}
	for _, h := range have {
		set[h] = true
	}
	for _, w := range want {
		if !set[w] {
			return false
		}
	}
	return true
}

func keys(m map[int64]bool) []int64 {
	var ks []int64
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	return ks
}
